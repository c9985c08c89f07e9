"""One door per node operation on the host (agent/node/door.py): a console's request through
serve (agent/serve/server.py) and the run's judge through the node's own link
(agent/supervisor/judge_link.py) run the same operation and write the node's action log with
the same writer, so the same request leaves the same line whoever asked; the judge's expel of
a restarted node's old torchrun is kept in that node's log (`rankdeck actions`). The judge's
restart end to end with real torchrun: tests/spine/test_judge.py."""

from __future__ import annotations

import os
import signal
import types

from agent.host import actions, procs
from agent.host.runfiles import read_json, write_json_atomic
from agent.node import fence as node_fence, ops as node_ops
from agent.serve import server as serve
from agent.supervisor import judge_link

SAME = ("action", "node", "login", "result", "detail")  # a line but for who asked and when


def node_folder(tmp_path, name="node1"):
    """A node folder whose supervisor is this process (it lives), as the judge's link sees its
    own node."""
    ndir = tmp_path / "run" / name
    ndir.mkdir(parents=True)
    write_json_atomic(str(ndir / "state.json"), {
        "state": "running", "pid": os.getpid(), "starttime": procs.stat(os.getpid()).starttime,
        "run_id": "r1", "node": name})
    return ndir


def link_of(ndir, sent):
    link = judge_link.JudgeLink({}, ndir.name, str(ndir), dict, dict, lambda _t: None)
    line = types.SimpleNamespace(send=sent.append)
    return link, line


def serve_asks(op, **args):
    server = serve.Server(out=open(os.devnull, "wb"))
    server.handle({"t": "req", "id": 1, "op": op, "args": args})


def test_a_restart_of_a_fenced_node_is_refused_alike_and_logged_alike(tmp_path):
    """The judge's restart and a console's, refused on a cordoned node: one operation, so one
    refusal (kind ``fenced``), and one line in the log, whoever asked."""
    ndir = node_folder(tmp_path)
    node_fence.mark_fenced(str(ndir), {"who": "alice@laptop", "why": "cordoned"})
    serve_asks("restart", run_root=str(ndir.parent), node="node1")
    sent = []
    link, line = link_of(ndir, sent)
    link._answer(line, {"op": "restart", "id": 9, "args": {}})
    assert sent and sent[0]["ok"] is False and "is cordoned" in sent[0]["error"], sent
    console, judge = actions.read(str(ndir))[0]
    assert (console["who"], judge["who"]) == ("?", "judge")
    assert {k: console.get(k) for k in SAME} == {k: judge.get(k) for k in SAME}, (console, judge)
    assert judge["result"].startswith("fenced: node node1 is cordoned"), judge


def test_the_judges_stop_is_answered_and_logged_before_the_supervisor_signals_itself(
        tmp_path, monkeypatch):
    """The judge's stop of the node its link lives in: the end left for the supervisor
    (agent/node/ops.py ``stop``, as a console's stop leaves it), the line in the log as a
    console's stop with that end has it, the answer sent, and only then its own SIGTERM."""
    ndir = node_folder(tmp_path)
    sent = []
    monkeypatch.setattr(judge_link.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    link, line = link_of(ndir, sent)
    end = {"state": "failed", "cause": {"message": "stopped by --on-hang stop: x"}}
    link._answer(line, {"op": "stop", "id": 5, "args": {"end": end}})
    assert sent == [{"t": "res", "id": 5, "ok": True, "data": {}}, (os.getpid(), signal.SIGTERM)]
    assert read_json(str(ndir / node_ops.STOP_END)) == end
    logged = actions.read(str(ndir))[0]
    assert [(a["action"], a["who"], a["result"], a["detail"]) for a in logged] == [
        ("stop", "judge", "ok", "the run is over: failed")]


def test_the_judges_expel_of_the_old_torchrun_is_in_the_nodes_action_log(tmp_path):
    """After the judge's --on-hang restart, the store beside the judge takes the node's old
    torchrun out of the rendezvous; the judge has the line written in that node's log, done
    or not, as serve writes a console's expel (``not done: why``)."""
    ndir = node_folder(tmp_path)
    sent = []
    link, line = link_of(ndir, sent)
    link._answer(line, {"op": "log_expel", "id": 1, "args": {
        "pid": 812, "at": 1700000000.0, "expelled": True, "why": None}})
    link._answer(line, {"op": "log_expel", "id": 2, "args": {
        "pid": 813, "expelled": False, "why": "it was out of the rendezvous already"}})
    assert [m["ok"] for m in sent] == [True, True], sent
    done, not_done = actions.read(str(ndir))[0]
    assert (done["action"], done["node"], done["who"], done["result"], done["ts"]) == (
        "expel", "node1", "judge", "ok", 1700000000.0)
    assert "old torchrun, pid 812, out of the rendezvous" in done["detail"], done
    assert not_done["result"] == "not done: it was out of the rendezvous already", not_done
