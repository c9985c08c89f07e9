"""A verdict a console asks the run's judge for (``w``, ``rankdeck why``, a read-only watcher's
dashboard) is answered and journaled, and changes nothing of the judge's own looks
(agent/judge/sample.py): it neither stands in for the judge's next look, which ``--on-hang``
acts on, nor postpones it. A real judge and its journal; the nodes are spoken for by FakeNode
(tests/agent/test_judge.py)."""

from __future__ import annotations

import os
import threading

import pytest

from agent.judge.control import ask_judge, running_judge, start_judge, stop_judge
from agent.rules.notify import ASKED
from tests.agent.test_judge import TOKEN, FakeNode, events, fr, stack
from tests.waits import wait_for_sync

OWN_AGAIN = "the stall goes on"  # the reason of the judge's own look again (agent/judge/judge.py)


def in_step(rank):
    """A rank's report when every rank is in step (the verdict: ``unknown``)."""
    return {"ranks": [{"pid": 10 + rank, "rank": rank, "stack": stack("wait"),
                       "fr": fr(3, True)}]}


def hung(rank):
    """Rank 1 never entered collective 5, in which rank 0 waits: ``stuck-in-python``."""
    if rank == 0:
        return {"ranks": [{"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]}
    return {"ranks": [{"pid": 11, "rank": 1, "stack": stack("sleep"), "fr": fr(4, True)}]}


@pytest.fixture
def judge_on_hang(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN,
                                  "nodes": ["node0", "node1"], "stall_after": 2.0,
                                  "on_hang": "restart", "max_restarts": 1})
    yield run_root, info
    stop_judge(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def stalled_in_step(port):
    """Two nodes that step 3 times, then stop; their ranks report in step."""
    nodes = [FakeNode(port, "node%d" % r, in_step(r)) for r in (0, 1)]
    for r, n in enumerate(nodes):
        n.send({"k": "file", "f": 1, "rank": r})
        n.send(*({"k": "metric", "f": 1, "step": s, "step_time": 0.1} for s in range(3)))
    return nodes


def verdicts(run_root, reason=None):
    return [e for e in events(run_root) if e["what"] == "verdict"
            and (reason is None or e.get("reason") == reason)]


def test_an_asked_verdict_naming_a_rank_does_not_stand_in_for_the_judges_own(judge_on_hang):
    """The judge's first look said ``unknown``; then a console asked, and its verdict named
    rank 1. The judge still looks again itself, and ``--on-hang restart`` restarts node1 on
    its own verdict. (An asked verdict kept as the judge's own stopped its looks: ``unknown``
    was no longer the last verdict, and nothing acted on the stall.)"""
    run_root, info = judge_on_hang
    n0, n1 = stalled_in_step(info["port"])
    first = wait_for_sync(lambda: verdicts(run_root), 60, "the judge's first look")[0]
    assert first["reason"] == "a stall began" and first["verdict"]["kind"] == "unknown", first
    n0.report, n1.report = hung(0), hung(1)
    asked = ask_judge(run_root, "why")
    assert asked["kind"] == "stuck-in-python", asked
    assert [e["verdict"]["kind"] for e in verdicts(run_root, ASKED)] == ["stuck-in-python"]
    restarted = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "restarted"],
                              90, lambda: "the judge's --on-hang restart; verdicts %s" % [
                                  (e["reason"], e["verdict"]["kind"]) for e in verdicts(run_root)])
    assert [e["node"] for e in restarted] == ["node1"], restarted
    own = verdicts(run_root, OWN_AGAIN)
    assert own and own[0]["verdict"]["kind"] == "stuck-in-python", own
    assert n1.asked.count("restart") == 1 and "restart" not in n0.asked


def test_a_dashboard_asking_again_and_again_does_not_postpone_the_judges_look(judge_on_hang):
    """A watcher's dashboard asks ``why`` without a pause while the stall lasts: the judge
    still takes its own look again on its schedule (an asked verdict used to reset the
    clock of that look, so it never came while someone kept asking)."""
    run_root, info = judge_on_hang
    stalled_in_step(info["port"])
    first = wait_for_sync(lambda: verdicts(run_root), 60, "the judge's first look")[0]
    assert first["verdict"]["kind"] == "unknown", first
    done = threading.Event()
    answered = []

    def dashboard():
        while not done.is_set():
            answered.append(ask_judge(run_root, "why")["kind"])
    poller = threading.Thread(target=dashboard, daemon=True)
    poller.start()
    try:
        again = wait_for_sync(lambda: verdicts(run_root, OWN_AGAIN), 90,
                              lambda: "the judge's own look again; %d asked meanwhile"
                              % len(answered))
    finally:
        done.set()
        poller.join(60)
    assert again[0]["verdict"]["kind"] == "unknown", again
    assert answered and set(answered) == {"unknown"}, answered  # it was asking meanwhile
    # the dashboard's verdicts came between the judge's first look and its look again
    seqs = [e.get("reason") for e in verdicts(run_root)]
    assert seqs.index(OWN_AGAIN) > seqs.index(ASKED), seqs
