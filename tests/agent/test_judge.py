"""The run's judge (agent/judge/judge.py) on its own: real sockets and its real journal, with two
peers speaking for nodes the way agent/supervisor/judge_link.py does. The whole path with real torchrun
is tests/spine/test_judge.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from agent.wire import judge as judge_wire
from agent.host.journal import JournalReader
from agent.judge.control import ask_judge, running_judge, start_judge, stop_judge
from agent.rules.judge import check_stalls, ends_due, run_over
from agent.rules.judge_view import RunView
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "t0ken-" + "x" * 20


def events(run_root):
    reader = JournalReader(os.path.join(run_root, "judge", "journal"))
    return [meta for meta, _d, _e in reader.read() if meta.get("k") == "event"]


class FakeNode:
    """A node's side of the link: sends records, answers `why` with a fixed report."""

    def __init__(self, port, node, report, token=TOKEN):
        self.line = judge_wire.connect_peer("127.0.0.1", port, token, node)
        self.node, self.report, self.asked = node, report, []
        self.args = []  # each request's arguments, in order
        self.answers = {}  # op -> the answer's data (`why`: ``report``; else {})
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                msg = self.line.read()
            except judge_wire.WireError:
                return
            if msg is None:
                return
            self.asked.append(msg.get("op"))
            self.args.append(msg.get("args"))
            data = self.report if msg.get("op") == "why" else self.answers.get(msg.get("op"), {})
            self.line.send({"t": "res", "id": msg["id"], "ok": True, "data": data})
            self.answered(msg)

    def answered(self, msg):
        """After the answer to ``msg`` (a node that does more, tests/agent/test_judge_cordon.py)."""

    def send(self, *recs):
        self.line.send({"t": "recs", "recs": list(recs)})


def stack(fn):
    return 'Thread 1 (idle): "MainThread"\n    %s (train.py:12)\n' % fn


def fr(seq, done):
    return {"entries": [{"pg": "0", "seq": s, "op": "allreduce", "in": "[4]", "out": "[4]",
                         "done": s < seq or done, "t_ns": 1000 * s} for s in range(1, seq + 1)]}


def rank_1_hangs(port, fn, restarted=False):
    """node0 and node1 step 3 times; then rank 0 waits in collective 5, which rank 1 on node1
    (in ``fn``; restarted by rankdeck first when ``restarted``) never entered."""
    n0 = FakeNode(port, "node0", {"ranks": [
        {"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]})
    n1 = FakeNode(port, "node1", {"ranks": [
        {"pid": 11, "rank": 1, "stack": stack(fn), "fr": fr(4, True)}]})
    if restarted:
        n1.send({"k": "event", "what": "restarting"},
                {"k": "event", "what": "launched", "launch": 2})
    n0.send({"k": "file", "f": 1, "rank": 0})
    n1.send({"k": "file", "f": 1, "rank": 1})
    for step in range(3):
        n0.send({"k": "metric", "f": 1, "step": step, "step_time": 0.1})
        n1.send({"k": "metric", "f": 1, "step": step, "step_time": 0.1})
    return n0, n1


@pytest.fixture
def judged(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    spec = {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0", "node1"],
            "stall_after": 2.0, "secrets": ["hunter2-very-secret"],
            "notify": "cat >> %s" % (tmp_path / "notified.jsonl"),
            "notify_on": ["stall", "verdict", "failed"]}
    info = start_judge(run_root, spec)
    yield run_root, info, tmp_path
    stop_judge(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def test_a_stall_gets_one_verdict_journaled_and_notified(judged):
    run_root, info, tmp = judged
    n0, _n1 = rank_1_hangs(info["port"], "hunter2-very-secret_sleep")
    verdicts = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "verdict"], 30,
                        "a verdict in the judge's journal")
    v = verdicts[0]["verdict"]
    assert v["kind"] == "stuck-in-python" and [s["rank"] for s in v["suspects"]] == [1], v
    assert v["suspects"][0]["node"] == "node1"
    assert "hunter2-very-secret" not in json.dumps(events(run_root))  # masked
    stalls = [e for e in events(run_root) if e["what"] == "stalled"]
    assert sorted(e["rank"] for e in stalls) == [0, 1]
    notified = tmp / "notified.jsonl"
    wait_for_sync(lambda: notified.exists() and len(notified.read_text().splitlines()) >= 2, 30,
             "the stall and the verdict notified")
    kinds = [json.loads(line)["kind"] for line in notified.read_text().splitlines()]
    assert kinds == ["stall", "verdict"], kinds  # the stall once, not once per rank
    assert "hunter2-very-secret" not in notified.read_text()
    n0.send({"k": "metric", "f": 1, "step": 3})
    wait_for_sync(lambda: any(e["what"] == "stepping" for e in events(run_root)), 30, "stepping again")


def test_a_stall_that_reaches_a_second_rank_later_gets_no_second_verdict(judged):
    """Rank 0 stalls first; rank 1 steps on a few seconds more, then stalls in the same hang
    after the first verdict is taken: still one verdict and one notification of it, until the
    run steps again (a verdict per rank the stall reaches was notified twice)."""
    run_root, info, tmp = judged
    n0 = FakeNode(info["port"], "node0", {"ranks": [
        {"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]})
    n1 = FakeNode(info["port"], "node1", {"ranks": [
        {"pid": 11, "rank": 1, "stack": stack("hung_here"), "fr": fr(4, True)}]})
    n0.send({"k": "file", "f": 1, "rank": 0})
    n1.send({"k": "file", "f": 1, "rank": 1})
    for step in range(3):
        n0.send({"k": "metric", "f": 1, "step": step, "step_time": 0.1})
        n1.send({"k": "metric", "f": 1, "step": step, "step_time": 0.1})
    wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "verdict"], 30,
                  "the verdict on rank 0's stall")
    for step in range(3, 9):  # rank 1 steps 3 s more, then stops in the same hang
        n1.send({"k": "metric", "f": 1, "step": step, "step_time": 0.1})
        time.sleep(0.5)
    wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "stalled" and
                           e["rank"] == 1], 30, "rank 1 stalled too")
    time.sleep(3)  # a verdict the second stall would start has started and ended by now
    verdicts = [e for e in events(run_root) if e["what"] == "verdict"]
    assert len(verdicts) == 1, [v.get("reason") for v in verdicts]
    kinds = [json.loads(line)["kind"] for line in
             (tmp / "notified.jsonl").read_text().splitlines()]
    assert kinds.count("verdict") == 1, kinds


def test_a_console_gets_a_fresh_verdict_and_a_stranger_nothing(judged):
    run_root, info, _tmp = judged
    FakeNode(info["port"], "node0", {"ranks": [{"pid": 10, "rank": 0, "stack": stack("a"),
                                                "fr": fr(3, True)}]})
    FakeNode(info["port"], "node1", {"ranks": [{"pid": 11, "rank": 1, "stack": stack("b"),
                                                "fr": fr(3, True)}]})
    verdict = ask_judge(run_root, "why")
    assert verdict["kind"] in ("unknown", "straggler") and "summary" in verdict
    with pytest.raises(judge_wire.WireError):
        judge_wire.connect_peer("127.0.0.1", info["port"], "wrong-token", "node0")
    assert ask_judge(run_root, "ping")["on_hang"] == "warn"


def test_a_failing_or_hanging_notify_command_is_an_event_and_the_judge_goes_on(tmp_path,
                                                                               monkeypatch):
    from agent.judge import notify as judge_notify
    monkeypatch.setattr(judge_notify, "TIMEOUT_S", 1.0)
    reported = []
    from agent.rules.mask import Masker
    for command, text in [("exit 1", "exited with code 1"), ("sleep 30", "timed out")]:
        n = judge_notify.Notifier(command, None, Masker([]), reported.append)
        n.consider({"k": "event", "what": "verdict", "verdict": {}})
        n.drain(10)
        assert reported and text in reported[-1]["text"], reported
        assert reported[-1]["what"] == "notify_failed"


def test_the_rules_end_a_run_whose_rank_aborted_after_its_last_step():
    view = RunView(["node0", "node1"], 60)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    view.apply("node1", {"k": "file", "f": 1, "rank": 1}, 0)
    for node in ("node0", "node1"):
        view.apply(node, {"k": "metric", "f": 1, "step": 100}, 1)
    view.apply_state("node0", {"state": "exited"})
    view.apply("node1", {"k": "event", "what": "worker_failed", "rank": 1, "exit_code": -6}, 2)
    ends = ends_due(view)
    assert ends["node1"]["state"] == "failed" and "SIGABRT" in ends["node1"]["cause"]["message"]
    assert run_over(view) is None
    view.apply_state("node1", {"state": "failed", "cause": ends["node1"]["cause"]})
    state, cause = run_over(view)
    assert state == "failed" and "after its last step" in cause["message"]


def test_a_silent_rank_stalls_with_the_run_and_a_diverged_loss_is_said_once():
    view = RunView(["node0"], 5)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    view.apply("node0", {"k": "file", "f": 2, "rank": 1}, 0)  # rank 1 prints no steps
    view.apply("node0", {"k": "metric", "f": 1, "step": 1}, 0)
    assert check_stalls(view, 3) == []
    stalls = check_stalls(view, 6)
    assert sorted(e["rank"] for e in stalls) == [0, 1]
    out = view.apply("node0", {"k": "metric", "f": 1, "step": 2, "loss": float("nan")}, 7)
    assert [e["what"] for e in out].count("diverged") == 1
    assert sorted(e["rank"] for e in out if e["what"] == "stepping") == [0, 1]
    again = view.apply("node0", {"k": "metric", "f": 1, "step": 3, "loss": float("inf")}, 8)
    assert not any(e["what"] == "diverged" for e in again)


def test_closing_a_line_while_another_thread_reads_it_ends_both():
    """A supervisor ending closes its judge link while the link's reader waits in read():
    with a buffered file closed under its reader, close() blocked for good and the supervisor
    never exited (its run's processes stayed)."""
    import socket
    a, b = socket.socketpair()
    line = judge_wire.Line(a)
    got = []
    reader = threading.Thread(target=lambda: got.append(line.read()), daemon=True)
    reader.start()
    wait_for_sync(lambda: reader.is_alive(), 30, "the reader waits")
    closer = threading.Thread(target=line.close, daemon=True)
    closer.start()
    closer.join(30)
    reader.join(30)
    assert not closer.is_alive() and not reader.is_alive()
    assert got in ([None], []) or isinstance(got[0], type(None))
    b.close()


def test_the_judge_names_a_straggler_from_the_nodes_samples():
    """The continuous straggler rule (agent/rules/straggler.py) on the judge: the samples the links
    forward name the slow rank, once, with no console."""
    import random

    from tests.unit.test_straggler import MIN_TICKS, WORLD, tick_records
    view = RunView(["node%d" % r for r in range(WORLD)], 60)
    for r in range(WORLD):
        view.apply("node%d" % r, {"k": "file", "f": 1, "rank": r, "world_size": WORLD}, 0)
    rng = random.Random(7)
    found = []
    for tick in range(MIN_TICKS + 3):
        for rec in tick_records(tick, {2: 3.0}, rng):
            node = "node%d" % rec["ranks"][0]["rank"]
            found += view.apply(node, rec, tick)
    named = [e for e in found if e["what"] == "straggler"]
    assert [(e["rank"], e["node"]) for e in named] == [(2, "node2")], found


def test_the_judge_says_what_a_rendezvous_waits_for_from_the_nodes_states(judged):
    """The rendezvous-wait rule on the judge (agent/rules/rendezvous.py): the phases the links
    forward from state.json, in the judge's clock; a console reads the wait from its journal."""
    import time

    from console.judgement.judged import apply_judge_records, judge_applies
    from console.model.state import RunState
    run_root, info, _tmp = judged
    n0 = FakeNode(info["port"], "node0", {"ranks": []})
    n1 = FakeNode(info["port"], "node1", {"ranks": []})
    skew = 5000.0  # node0's clock is far off: the judge keeps "how long ago", not "when"
    n0.line.send({"t": "state", "state": {"state": "running", "sent": time.time() + skew,
                                          "phase": {"name": "rendezvous", "round": 2,
                                                    "note": "waiting",
                                                    "since": time.time() + skew}}})
    n1.line.send({"t": "state", "state": {"state": "running", "sent": time.time(), "phase": {
        "name": "workers running", "round": 1, "since": time.time() - 30}}})
    waits = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "waiting"], 30,
                          "the judge's waiting event")
    assert [m["node"] for m in waits[0]["missing"]] == ["node1"], waits
    assert "node1 (running; torchrun workers running (round 1))" in waits[0]["text"]
    assert waits[0]["waited_s"] < 60  # not the hosts' 5000 s apart
    st = RunState("r1", [("node0", ""), ("node1", "")])
    apply_judge_records(st, [(e,) for e in events(run_root)], 0, "node0")
    assert judge_applies(st, "waiting") and judge_applies(st, "cpu")
    assert st.status()["waiting_for"]["missing"][0]["node"] == "node1"
    for n in (n0, n1):  # node1 joined: both run round 2's workers
        n.line.send({"t": "state", "state": {"state": "running", "sent": time.time(), "phase": {
            "name": "workers running", "round": 2, "since": time.time()}}})
    wait_for_sync(lambda: any(e["what"] == "waiting over" for e in events(run_root)), 30,
                  "the wait over once node1 joined")
    apply_judge_records(st, [(e,) for e in events(run_root)], 0, "node0")
    assert st.status()["waiting_for"] is None


def test_a_node_named_by_a_verdict_soon_after_its_restart_is_proposed_for_cordon(judged):
    run_root, info, _tmp = judged
    rank_1_hangs(info["port"], "sleep", restarted=True)
    proposed = wait_for_sync(lambda: [e for e in events(run_root)
                                      if e["what"] == "cordon proposed"], 30,
                             "a cordon proposal in the judge's journal")
    assert [e["node"] for e in proposed] == ["node1"], proposed
    assert proposed[0]["reason"] == "the verdict names rank 1 (stuck-in-python)", proposed


def test_on_hang_restart_of_a_static_world_restarts_every_node_on_a_fresh_store(tmp_path):
    # DeepSpeed's world (agent/surgery/static_world.py): the verdict names rank 1 on node1, and every
    # node restarts, told the port of the store started again beside the judge
    from agent.host.runfiles import read_json
    from agent.store.tcpstore import start_store, stop_store
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    old = start_store(run_root, "127.0.0.1", sys.executable)
    spec = {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0", "node1"],
            "stall_after": 2.0, "on_hang": "restart", "max_restarts": 1,
            "launcher": "deepspeed"}
    info = start_judge(run_root, spec)
    try:
        nodes = rank_1_hangs(info["port"], "sleep")
        done = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] in
                                      ("restarted", "judge_error")], 60,
                             "the judge restarted the world")
        new = read_json(os.path.join(run_root, "store.json"))
        assert new["pid"] != old["pid"]
        assert [(e["what"], e["node"]) for e in done] == [("restarted", None)], done
        assert "master port %d" % new["port"] in done[0]["text"]
        for n in nodes:
            assert n.args[n.asked.index("restart")] == {"master_port": new["port"]}
        policy = [e for e in events(run_root) if e["what"] == "policy"]
        assert "DeepSpeed's world is static: every node restarts" in policy[0]["text"], policy
    finally:
        stop_judge(run_root)
        stop_store(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def test_on_hang_restart_has_the_old_torchrun_taken_out_of_the_rendezvous(tmp_path):
    """The node's link names its old torchrun, gone after the restart (agent/supervisor/judge_link.py
    ``_restart``'s ``member``): the judge asks the store beside it to take it out of the
    rendezvous (agent/surgery/expel.py; the expel itself is tests/agent/test_expel.py's), and says
    what came of it: here the store has no such rendezvous, so nothing is touched."""
    from agent.store.tcpstore import start_store, stop_store
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    start_store(run_root, "127.0.0.1", sys.executable)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN,
                                  "nodes": ["node0", "node1"], "stall_after": 2.0,
                                  "on_hang": "restart", "max_restarts": 1})
    try:
        n0, n1 = rank_1_hangs(info["port"], "sleep")
        n1.answers["restart"] = {"launches": 2, "member": {
            "pid": 4242, "addr": "10.0.0.3", "rdzv_ids": ["r-none"]}}
        said = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "policy"
                                      and e.get("action") == "expel"], 60, "the expel")
        assert said[0]["node"] == "node1" and said[0]["text"] == (
            "node1's old torchrun left to expire in the rendezvous (not done: no rendezvous "
            "r-none in the store)"), said
        assert n1.asked.count("restart") == 1 and "restart" not in n0.asked
    finally:
        stop_judge(run_root)
        stop_store(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


class _Line:
    """A node's line on the judge that answers `why` with no ranks, or never (a cut host)."""

    def __init__(self, answers: bool):
        self.answers, self.asked = answers, 0

    def request(self, op, args, timeout):
        self.asked += 1
        if not self.answers:
            raise judge_wire.WireError("%s got no answer within %.0f s" % (op, timeout))
        return {"ranks": []}


def test_a_node_that_did_not_answer_the_first_sample_is_not_asked_again(tmp_path):
    """A verdict takes two samples; a cut host would make each wait out WHY_TIMEOUT: its
    silence in the first stands for the second, and it is named unreachable once."""
    from agent.judge.judge import Judge
    judge = Judge({"token": TOKEN, "nodes": ["node0", "node1"]}, str(tmp_path))
    for rank in (0, 1):
        judge.view.apply("node%d" % rank, {"k": "file", "f": 1, "rank": rank, "world_size": 2}, 0)
    judge.lines = {"node0": _Line(answers=True), "node1": _Line(answers=False)}
    verdict = judge.take_verdict("stalled")
    assert [judge.lines[n].asked for n in ("node0", "node1")] == [2, 1]
    assert verdict["kind"] == "unreachable", verdict
    assert list(verdict["evidence"]["unreachable"]) == ["node1"], verdict
    assert "no answer" in verdict["evidence"]["unreachable"]["node1"], verdict
