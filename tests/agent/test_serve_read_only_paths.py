"""What a read-only connection may make serve write or run on the host, over a real
``python -m agent serve`` (agent/serve/server.py, agent/node/folder.py ``read_only_args``).

A watcher's requests name only run folders (``<workdir>/.rankdeck/runs/<run id>``, as a launch
makes them) and nodes in them; its refusals are logged only in a node folder that is already
there; its ``stacks`` and ``why`` run no py-spy beside an interpreter it names.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from agent.host import actions, procs
from agent.host.runfiles import write_json_atomic
from agent.wire import protocol

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = "/usr/bin:/bin"  # serve's PATH: no py-spy of its own, so a named interpreter's is tried


class Serve:
    """A real ``python -m agent serve`` on pipes, as SSH runs it."""

    def __init__(self, home):
        self.proc = subprocess.Popen([sys.executable, "-m", "agent", "serve"], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=dict(os.environ, PYTHONPATH=REPO, HOME=str(home),
                                              PATH=PATH))
        self.next_id = 0

    def ask(self, op, **args):
        self.next_id += 1
        self.proc.stdin.write(protocol.encode({"t": "req", "id": self.next_id, "op": op,
                                               "args": args}))
        self.proc.stdin.flush()
        while True:
            msg = json.loads(self.proc.stdout.readline())
            if msg.get("t") == "res" and msg.get("id") == self.next_id:
                return msg

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def serve(tmp_path):
    s = Serve(tmp_path)
    yield s
    s.close()


@pytest.fixture
def run_root(tmp_path):
    root = tmp_path / "w" / ".rankdeck" / "runs" / "20261128-000000-abc"
    (root / "node1").mkdir(parents=True)
    return root


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, n), folder)
                  for d, _dirs, names in os.walk(folder) for n in names)


def test_a_watchers_refused_sync_makes_no_log_outside_a_run_folder(serve, tmp_path, run_root):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert serve.ask("hello", role="watch", who="bob@laptop")["ok"]
    for root, node in ((elsewhere, "node1"), (tmp_path / "new", "node1"),
                       (run_root, "../../../../elsewhere"), (run_root, "..")):
        res = serve.ask("sync_commit", run_root=str(root), node=node, session="x")
        assert not res["ok"] and res["kind"] == "read-only", res
    # a run folder's node that is not there is not made either
    res = serve.ask("sync_commit", run_root=str(run_root), node="node9", session="x")
    assert res["kind"] == "read-only"
    assert files_under(elsewhere) == [] and not (tmp_path / "new").exists()
    assert not (run_root / "node9").exists()
    # in the run's own node folder the try is logged, as before
    serve.ask("sync_commit", run_root=str(run_root), node="node1", session="x")
    assert [e["action"] for e in actions.read(str(run_root / "node1"))[0]] == ["sync"]


def test_a_watcher_subscribes_only_to_a_run_folder_and_lists_itself_only_there(
        serve, tmp_path, run_root):
    elsewhere = tmp_path / "elsewhere" / "node1"
    elsewhere.mkdir(parents=True)
    assert serve.ask("hello", role="watch", who="bob@laptop", attach=True)["ok"]
    res = serve.ask("subscribe", run_root=str(tmp_path / "elsewhere"), node="node1")
    assert not res["ok"] and res["kind"] == "usage" and "not a run folder" in res["error"]
    assert files_under(tmp_path / "elsewhere") == []
    for node in ("..", "a/b", "", 5):
        assert serve.ask("subscribe", run_root=str(run_root), node=node)["kind"] == "usage"
    assert serve.ask("subscribe", run_root=str(run_root), node="node1")["ok"]
    assert [c["who"] for c in actions.attached(str(run_root / "node1"))] == ["bob@laptop"]


def live_node(run_root):
    """node1 running: a stand-in supervisor (this shell) with one rank under it."""
    sup = subprocess.Popen(["sh", "-c", "RANK=0 LOCAL_RANK=0 sleep 60; :"])
    me = procs.stat(sup.pid)
    write_json_atomic(str(run_root / "node1" / "state.json"),
                      {"pid": sup.pid, "starttime": me.starttime, "state": "running"})
    return sup


def test_a_watchers_stacks_run_nothing_beside_an_interpreter_it_names(serve, tmp_path,
                                                                     run_root):
    if shutil.which("py-spy", path=PATH):
        pytest.skip("py-spy is on serve's PATH here: a named interpreter's is never looked at")
    bin_dir = tmp_path / "theirs" / "bin"
    bin_dir.mkdir(parents=True)
    ran = tmp_path / "ran"
    spy = bin_dir / "py-spy"
    spy.write_text("#!/bin/sh\necho \"$@\" >> %s\necho 'Thread 1'\n" % ran)
    spy.chmod(0o755)
    sup = live_node(run_root)
    try:
        assert serve.ask("hello", role="watch", who="bob@laptop")["ok"]
        for op in ("stacks", "why"):
            res = serve.ask(op, run_root=str(run_root), node="node1",
                            python=str(bin_dir / "python"))
            assert res["ok"] and res["data"]["py_spy"] is None, res
            assert [r["rank"] for r in res["data"]["ranks"]] == [0]
        assert not ran.exists()
        # a driving connection names the run's own interpreter: its py-spy is used
        drive = Serve(tmp_path)
        try:
            res = drive.ask("stacks", run_root=str(run_root), node="node1",
                            python=str(bin_dir / "python"))
            assert res["ok"] and res["data"]["py_spy"] == str(spy), res
            assert ran.exists()
        finally:
            drive.close()
    finally:
        sup.kill()
        sup.wait()
