"""The action log stays bounded and is read to its end (agent/host/actions.py,
agent/serve/server.py, console/records/actions.py).

A watcher's loop of refused requests is a few lines and a count, not a flood; the log file is
rotated at ``LOG_MAX`` with offsets that hold across the rotation; `rankdeck actions` reads
every page of it, and caps its list with a note.
"""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agent.host import actions
from agent.serve import server as serve
from agent.wire import protocol
from console.lines.sanitize import Masker
from console.records import actions as console_actions
from tests.agent.test_serve_roles import Out

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def run_root(tmp_path):
    root = tmp_path / "w" / ".rankdeck" / "runs" / "20261128-000000-abc"
    (root / "node1").mkdir(parents=True)
    return root


def test_a_watchers_refused_requests_are_a_few_lines_and_one_count(tmp_path, run_root):
    """6,000 refused requests in a third of a second were 6,000 lines: now at most
    REFUSED_BURST of them, and one line, when the connection ends, with how many were not."""
    proc = subprocess.Popen([sys.executable, "-m", "agent", "serve"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=REPO, HOME=str(tmp_path)))
    tries = 300
    reqs = [{"t": "req", "id": 1, "op": "hello", "args": {"role": "watch", "who": "bob@l"}}]
    reqs += [{"t": "req", "id": 2 + i, "op": "stop",
              "args": {"run_root": str(run_root), "node": "node1"}} for i in range(tries)]
    proc.stdin.write(b"".join(map(protocol.encode, reqs)))
    proc.stdin.flush()
    answered = set()
    while len(answered) < len(reqs):  # every request answered (and logged) before the end
        msg = json.loads(proc.stdout.readline())
        if msg.get("t") == "res":
            assert msg["id"] == 1 or msg["kind"] == "read-only", msg
            answered.add(msg["id"])
    proc.stdin.close()
    assert proc.wait(30) == 0
    logged, _end = actions.read(str(run_root / "node1"))
    assert len(logged) <= getattr(actions, "REFUSED_BURST", 20) + 2, len(logged)
    assert all(e["who"] == "bob@l" and e["result"].startswith("read-only") for e in logged)
    told = [e for e in logged if "not logged" in e.get("detail", "")]
    count = sum(int(e["detail"].split()[0]) for e in told)
    # each line is a refusal of its own, but the one at the end: it only counts the others
    own = [e for e in logged if e["result"] != "read-only: refused"]
    assert count and len(own) + count == tries, logged[-3:]
    assert logged[-1]["result"] == "read-only: refused" and logged[-1]["detail"].startswith(
        "%d more refused requests of this connection not logged" % count)


def entry(i):
    return actions.entry("stop", "node1", {"who": "alice@laptop"}, 1000.0 + i, "ok",
                         "action %05d" % i)


def test_the_log_is_rotated_and_a_readers_offset_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(actions, "LOG_MAX", 4000, raising=False)
    ndir = str(tmp_path / "node1")
    follower, offset = [], 0
    for i in range(300):
        actions.record(ndir, entry(i))
        if i % 7 == 0:  # a subscription's reads, as the log turns over beneath it
            got, offset = actions.read(ndir, offset, limit=1500)
            follower += got
    assert os.path.getsize(os.path.join(ndir, "actions.jsonl")) <= 4000
    while True:
        page = actions.read_page(ndir, offset, limit=1500)
        follower += page["actions"]
        if not page["more"]:
            break
        offset = page["end"]
    assert [e["detail"] for e in follower] == ["action %05d" % i for i in range(300)]
    sizes = [os.path.getsize(os.path.join(ndir, n)) for n in (actions.LOG, actions.OLD)]
    assert all(size <= 4000 for size in sizes), sizes
    assert all(os.stat(os.path.join(ndir, n)).st_mode & 0o077 == 0
               for n in (actions.LOG, actions.OLD))
    # a reader from the start: the oldest lines are gone, it begins at the oldest kept
    got, offset, first = [], 0, None
    while True:
        page = actions.read_page(ndir, offset, limit=1000)
        first = page["start"] if first is None else first
        got += page["actions"]
        if not page["more"]:
            break
        offset = page["end"]
    assert first > 0 and got and got[-1]["detail"] == "action 00299"
    numbers = [int(e["detail"].split()[1]) for e in got]
    assert numbers == list(range(numbers[0], 300))


class Link:
    """A node's link as console/records/actions.py uses it, answered by a real serve's
    request handling (agent/serve/server.py) in this process."""

    def __init__(self, name, run_root):
        self.name, self.run_root = name, run_root
        self.server = serve.Server(out=open(os.devnull, "wb"))
        self.pages = 0

    async def request(self, op, timeout=None, **args):
        self.pages += 1
        reply = self.server.answer(getattr(self.server, "op_" + op), args)
        assert reply["ok"], reply
        return reply["data"]


class Ctl:
    def __init__(self, links):
        self.links = {link.name: link for link in links}
        self.state = type("State", (), {"masker": Masker([])})()

    async def connect_all(self, reconnect=True):
        return {}

    def connected(self):
        return list(self.links)

    async def gather_nodes(self, fn, names=None):
        got = await asyncio.gather(*(fn(self.links[n]) for n in names), return_exceptions=True)
        return dict(zip(names, got))


def test_rankdeck_actions_reads_every_page_and_caps_its_list(run_root, monkeypatch):
    ndir = str(run_root / "node1")
    count = 10000  # over 2 MiB: the agent answers 1 MiB a page
    lines = b"".join((json.dumps(entry(i), sort_keys=True) + " " * 60 + "\n").encode()
                     for i in range(count))
    with open(os.path.join(ndir, actions.LOG), "wb") as f:
        f.write(lines)
    assert len(lines) > 2 * actions.READ_MAX
    link = Link("node1", str(run_root))
    got, failed, *notes = asyncio.run(console_actions.run_actions(Ctl([link])))
    assert [r["detail"] for r in got] == ["action %05d" % i for i in range(count)]
    assert failed == {} and notes == [[]] and link.pages >= 3
    monkeypatch.setattr(console_actions, "ACTIONS_MAX", 1000)
    got, failed, notes = asyncio.run(console_actions.run_actions(Ctl([Link("node1",
                                                                           str(run_root))])))
    assert [r["detail"] for r in got] == ["action %05d" % i for i in range(count - 1000, count)]
    assert notes == ["9000 older actions not listed (the newest 1000 are)"]


def test_a_consoles_first_look_at_a_long_log_is_history_not_a_flood_of_events(run_root):
    """A console shows as events only what comes after its first `actions` message
    (console/model/consoles.py): a log over a page long is history all of it."""
    ndir = str(run_root / "node1")
    with open(os.path.join(ndir, actions.LOG), "wb") as f:
        f.write(b"".join((json.dumps(entry(i)) + " " * 100 + "\n").encode()
                         for i in range(8000)))
    size = os.path.getsize(os.path.join(ndir, actions.LOG))
    assert size > 2 * actions.READ_MAX
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    assert server.answer(server.op_subscribe, {"run_root": str(run_root), "node": "node1"})["ok"]
    for _turn in range(4):
        for sub in server.streams.subscriptions():
            sub.last_state_check = float("-inf")  # due now (STATE_POLL)
        server.streams.pump(server.streams.subscriptions())
    sent = [m for m in out.msgs if m["t"] == "actions"]
    assert len(sent) == 1 and sent[0]["end"] == size, [(m["end"], len(m["recs"])) for m in sent]
    assert sent[0]["recs"][-1]["detail"] == "action 07999"


def test_a_rotated_files_cut_last_line_does_not_stop_a_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(actions, "LOG_MAX", 2000, raising=False)
    ndir = str(tmp_path)
    log, i = os.path.join(ndir, actions.LOG), 0
    while not os.path.exists(log) or os.path.getsize(log) < 1500:
        actions.record(ndir, entry(i))
        i += 1
    with open(log, "ab") as f:  # a line its writer never finished, 50 bytes short of full
        f.write(b'{"action": "cut' + b"x" * (2000 - 50 - 15 - os.path.getsize(log)))
    for i in range(i, 20):  # the next line rotates the log: the cut line ends the old file
        actions.record(ndir, entry(i))
    with open(os.path.join(ndir, actions.OLD), "rb") as f:
        assert f.read().endswith(b"xxx")
    got, offset = [], 0
    for _ in range(50):
        page = actions.read_page(ndir, offset, limit=300)
        got += page["actions"]
        if not page["more"]:
            break
        offset = page["end"]
    assert got[-1]["detail"] == "action 00019"
