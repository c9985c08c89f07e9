"""serve's read-only connections and action log (agent/serve/server.py, agent/host/actions.py).

A connection whose console said ``watch`` is refused every request that changes a run, however
it is crafted; the refusal is logged with who tried. A driving connection's requests are
logged with who, what, which node and the result.
"""

import json
import os

import pytest

from agent.host import actions
from agent.wire import protocol
from agent.serve import server as serve

# every request that would change a run, with arguments a real console sends
MUTATING = [("start", {"spec": {"run_id": "r1"}}), ("stop", {}), ("restart", {}),
            ("sync_commit", {"session": "x"}), ("store_start", {"addr": "127.0.0.1"}),
            ("store_stop", {}), ("judge_start", {"spec": {}}), ("judge_stop", {}),
            ("sync_put", {"session": "x", "pieces": []}), ("listen", {"addr": "127.0.0.1"}),
            ("fence", {}), ("unfence", {}), ("signal", {"signal": "SIGKILL"}),
            ("expel", {"member": {"pid": 4242, "addr": "node3", "rdzv_ids": ["r1"]}}),
            ("judge", {"ask": "cordon", "args": {"out": "node1"}}), ("judge", {})]


class Out:
    """serve's output, as messages."""

    def __init__(self):
        self.msgs = []

    def write(self, data):
        self.msgs += [json.loads(line) for line in data.splitlines()]

    def flush(self):
        pass

    def answer(self, req_id):
        return next(m for m in self.msgs if m.get("t") == "res" and m.get("id") == req_id)


@pytest.fixture
def run_root(tmp_path):
    """A run folder as a launch makes it (console/launch/spec.py run_root): a read-only
    connection names no other."""
    root = tmp_path / "w" / ".rankdeck" / "runs" / "20261128-000000-abc"
    (root / "node1").mkdir(parents=True)
    return str(root)


def ask(server, out, op, **args):
    req_id = len(out.msgs) + 1000
    server.handle({"t": "req", "id": req_id, "op": op, "args": args})
    return out.answer(req_id)


def test_a_watching_connection_is_refused_every_change_and_each_try_is_logged(run_root):
    out = Out()
    server = serve.Server(out=out)
    hello = ask(server, out, "hello", role="watch", who="bob@laptop", console="c-bob")
    assert hello["ok"] and hello["data"]["role"] == "watch"
    for op, args in MUTATING:
        res = ask(server, out, op, run_root=run_root, node="node1", **args)
        assert not res["ok"] and res["kind"] == "read-only", (op, res)
        assert "read-only" in res["error"] and op in res["error"]
    # nothing was started, stopped or synced: no state, no store, no workdir
    assert sorted(os.listdir(os.path.join(run_root, "node1"))) == [actions.LOG]
    logged, _end = actions.read(os.path.join(run_root, "node1"))
    assert [e["action"] for e in logged] == ["launch", "stop", "restart", "sync", "cordon",
                                             "uncordon", "signal", "expel"]
    assert all(e["who"] == "bob@laptop" and e["result"].startswith("read-only:")
               for e in logged)
    assert all(e["login"] == actions.login() for e in logged)
    # reading goes on
    assert ask(server, out, "state", run_root=run_root, node="node1")["ok"]
    assert ask(server, out, "actions", run_root=run_root, node="node1")["data"]["end"] > 0
    ping = ask(server, out, "judge", run_root=run_root, ask="ping")
    assert ping.get("kind") != "read-only"  # asked (no judge runs here: its own answer)


def test_read_only_is_for_good_on_its_connection(run_root):
    out = Out()
    server = serve.Server(out=out)
    assert ask(server, out, "hello", role="watch", who="bob@laptop")["ok"]
    again = ask(server, out, "hello", role="drive", who="mallory@laptop")
    assert not again["ok"] and again["kind"] == "read-only"
    assert not ask(server, out, "stop", run_root=run_root, node="node1")["ok"]
    assert not ask(server, out, "hello", role="root")["ok"]  # not a role


def test_a_read_only_connection_asks_for_stacks_without_signals(run_root, monkeypatch):
    seen = []
    monkeypatch.setattr("agent.torchrun.stacks.dump_stacks", lambda ndir, args: seen.append(args) or {})
    out = Out()
    server = serve.Server(out=out)
    ask(server, out, "stacks", run_root=run_root, node="node1")
    ask(server, out, "hello", role="watch")
    ask(server, out, "stacks", run_root=run_root, node="node1", signals=True)  # crafted
    assert seen[0].get("signals", True) is True and seen[1]["signals"] is False


def test_a_driving_connections_changes_are_logged_with_their_result(run_root):
    out = Out()
    server = serve.Server(out=out)
    ask(server, out, "hello", role="drive", who="alice@laptop", console="c-alice")
    res = ask(server, out, "restart", run_root=run_root, node="node1")  # not running, no spec
    assert not res["ok"] and res["kind"] == "missing"
    ask(server, out, "ping")  # not a change: not logged
    logged, end = actions.read(os.path.join(run_root, "node1"))
    assert len(logged) == 1 and end > 0
    line = logged[0]
    assert (line["action"], line["node"], line["who"], line["console"]) == (
        "restart", "node1", "alice@laptop", "c-alice")
    assert line["result"].startswith("missing: node node1 is not running")
    assert line["ts"] <= line["ts"] + line["took_s"]


def test_an_expel_is_logged_on_the_store_host_with_what_came_of_it(run_root):
    """A cordon's ask of the store's host (console/surgery/expel.py sends its node and the fenced
    node's torchrun as the detail): logged with the answer's outcome, not only "ok"."""
    from console.model.consoles import action_line

    out = Out()
    server = serve.Server(out=out)
    ask(server, out, "hello", role="drive", who="alice@laptop", console="c-alice")
    res = ask(server, out, "expel", run_root=run_root, node="node1", detail="to take node3's "
              "dead torchrun, pid 4242, out of the rendezvous",
              member={"pid": 4242, "addr": "node3", "rdzv_ids": ["r1"]})
    assert res["ok"] and res["data"]["expelled"] is False  # no store runs here
    logged, _end = actions.read(os.path.join(run_root, "node1"))
    assert [(e["action"], e["node"], e["result"]) for e in logged] == [
        ("expel", "node1", "not done: no store of the run runs on this host")]
    assert action_line(logged[0]).startswith(
        "alice@laptop (login %s) asked the store on node1 (to take node3's dead torchrun, pid "
        "4242, out of the rendezvous): not done: no store" % actions.login())


def test_consoles_attached_are_listed_while_their_connection_lives(run_root):
    ndir = os.path.join(run_root, "node1")
    out_a, out_b = Out(), Out()
    drive, watch = serve.Server(out=out_a), serve.Server(out=out_b)
    ask(drive, out_a, "hello", role="drive", who="alice@laptop", console="a", attach=True)
    ask(drive, out_a, "subscribe", run_root=run_root, node="node1")
    listed = actions.attached(ndir)
    assert [(c["who"], c["role"]) for c in listed] == [("alice@laptop", "drive")]
    # a second serve in this same process shares its pid: its file replaces the first; the
    # real ones are separate processes (tests/spine/test_watchers.py)
    ask(watch, out_b, "hello", role="watch", who="bob@laptop", console="b", attach=True)
    ask(watch, out_b, "subscribe", run_root=run_root, node="node1")
    assert [c["who"] for c in actions.attached(ndir)] == ["bob@laptop"]
    actions.leave(watch.joined[ndir])
    assert actions.attached(ndir) == []


def test_a_damaged_log_line_is_skipped_and_a_cut_line_waits(tmp_path):
    ndir = str(tmp_path)
    actions.record(ndir, actions.entry("stop", "node1", {"who": "a@b"}, 1.0, "ok"))
    with open(os.path.join(ndir, actions.LOG), "ab") as f:
        f.write(b"not json\n[1]\n{\"action\": \"resta")
    logged, end = actions.read(ndir)
    assert [e["action"] for e in logged] == ["stop"]
    assert end == os.path.getsize(os.path.join(ndir, actions.LOG)) - len(b"{\"action\": \"resta")


def test_the_new_requests_are_in_the_protocol():
    assert "hello" in protocol.OPS and "actions" in protocol.OPS


def test_crafted_requests_get_answers_not_a_dead_thread(run_root):
    out = Out()
    server = serve.Server(out=out)
    ask(server, out, "hello", role="watch")
    server.handle({"t": "req", "id": 7, "op": ["stop"], "args": {}})
    server.handle({"t": "req", "id": 8, "op": "stop", "args": ["run_root"]})
    assert out.answer(7)["kind"] == "read-only" and out.answer(8)["kind"] == "read-only"


def test_a_subscription_gets_the_log_at_once_then_each_new_line(run_root):
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    ask(server, out, "subscribe", run_root=run_root, node="node1")
    server.streams.pump(server.streams.subscriptions())
    first = [m for m in out.msgs if m["t"] == "actions"]
    assert first == [{"t": "actions", "sub": "node1", "recs": [], "end": 0}]  # empty: still sent
    ndir = os.path.join(run_root, "node1")
    actions.record(ndir, actions.entry("stop", "node1", {"who": "alice@laptop"}, 5.0, "ok"))
    for sub in server.streams.subscriptions():
        sub.last_state_check = float("-inf")  # due now (STATE_POLL)
    server.streams.pump(server.streams.subscriptions())
    new = [m for m in out.msgs if m["t"] == "actions"][1:]
    assert [(r["who"], r["action"]) for m in new for r in m["recs"]] == [("alice@laptop", "stop")]


def test_a_watcher_reads_the_record_a_launch_left_and_nothing_else(tmp_path):
    """`watch RUN -i` from another laptop (console/run/hosted_record.py): the agent answers the
    record kept at start, to a read-only console too, and never a path outside its runs."""
    runs = tmp_path / "runs"
    ndir = runs / "20261126-000000-abc" / "node1"
    ndir.mkdir(parents=True)
    record = {"run_id": "20261126-000000-abc", "hosts": [{"name": "node1", "addr": "h"}]}
    (ndir / "record.json").write_text(json.dumps(record))
    out = Out()
    server = serve.Server(out=out)
    assert ask(server, out, "hello", role="watch", who="bob@laptop")["ok"]
    got = ask(server, out, "record", runs_dir=str(runs), run_id="20261126-000000-abc")
    assert got["ok"] and got["data"] == {"record": record, "node": "node1"}
    for bad in ("..", "../runs", "a/b", "", None, "r\u00fcn", "x" * 129):
        res = ask(server, out, "record", runs_dir=str(runs), run_id=bad)
        assert not res["ok"] and res["kind"] == "usage", (bad, res)
    res = ask(server, out, "record", runs_dir=str(runs), run_id="20261126-000000-zzz")
    assert not res["ok"] and res["kind"] == "missing"
    (ndir / "record.json").write_text("x" * ((1 << 20) + 1))  # too big to be one: not read
    assert ask(server, out, "record", runs_dir=str(runs),
               run_id="20261126-000000-abc")["kind"] == "missing"
