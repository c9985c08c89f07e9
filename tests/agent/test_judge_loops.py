"""The judge's loop policy (agent/judge/loops.py) on its own: a real judge process and its
journal, with peers speaking for nodes as agent/supervisor/judge_link.py does. The whole path
with real torchrun is tests/spine/test_loops.py."""

from __future__ import annotations

import json
import os

import pytest

from agent.judge.control import running_judge, start_judge, stop_judge
from tests.waits import wait_for_sync

from tests.agent.test_judge import TOKEN, FakeNode, events, fr, stack

WORDS = "no progress in 3 restarts: each failed at step 6"


@pytest.fixture
def judge(tmp_path):
    started = []

    def start(nodes=("node0",), **settings):
        run_root = str(tmp_path / "run")
        os.makedirs(run_root)
        spec = dict({"addr": "127.0.0.1", "token": TOKEN, "nodes": list(nodes),
                     "stall_after": 2.0, "max_restarts": 5,
                     "notify": "cat >> %s" % (tmp_path / "notified.jsonl")}, **settings)
        info = start_judge(run_root, spec)
        started.append(run_root)
        return run_root, info["port"]
    yield start
    for run_root in started:
        stop_judge(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def attempt(node, attempt, first_fid, resumed=4, fail_at=6):
    """One worker group of torchrun: two ranks resume from ``resumed`` (the trainer's line),
    step to ``fail_at`` - 1 and rank 1 fails."""
    fids = (first_fid, first_fid + 1)
    node.send(*[{"k": "file", "f": f, "rank": r} for r, f in enumerate(fids)])
    if attempt:
        node.send(*[{"k": "resumed", "f": f, "step": resumed, "path": "/c/%d.pt" % resumed}
                    for f in fids])
    node.send(*[{"k": "metric", "f": f, "step": s} for s in
                range(resumed + 1 if attempt else 1, fail_at) for f in fids])
    node.send({"k": "event", "what": "worker_failed", "rank": 1, "attempt": attempt,
               "exit_code": 1})


def of(run_root, what):
    return [e for e in events(run_root) if e["what"] == what]


def test_a_node_that_fails_at_the_same_step_after_3_restarts_stops_the_run(judge, tmp_path):
    run_root, port = judge()
    n0 = FakeNode(port, "node0", {"ranks": []})
    for a in range(3):
        attempt(n0, a, 1 + 2 * a)
    attempt(n0, 3, 7)
    loop = wait_for_sync(lambda: of(run_root, "loop"), 30, "a loop event")
    assert loop[0]["node"] == "node0" and loop[0]["restarts"] == 3
    assert loop[0]["text"] == "node0: %s: stopping the run" % WORDS
    wait_for_sync(lambda: "stop" in n0.asked, 30, "the judge's stop")
    end = n0.args[n0.asked.index("stop")]["end"]
    assert end == {"state": "failed", "cause": {
        "message": "stopped by --on-loop stop: node0: %s" % WORDS}}
    assert "restart" not in n0.asked
    notified = tmp_path / "notified.jsonl"
    wait_for_sync(lambda: notified.exists() and "loop" in notified.read_text(), 30,
                  "the loop notified")
    kinds = [json.loads(line)["kind"] for line in notified.read_text().splitlines()]
    assert kinds.count("loop") == 1, kinds


def test_on_loop_rollback_restarts_every_node_before_the_step_they_resumed_from(judge):
    run_root, port = judge(("node0", "node1"), on_loop="rollback")
    n0 = FakeNode(port, "node0", {"ranks": []})
    n1 = FakeNode(port, "node1", {"ranks": []})
    n1.send({"k": "file", "f": 1, "rank": 2})
    for a in range(4):
        attempt(n0, a, 1 + 2 * a)
    wait_for_sync(lambda: "restart" in n0.asked and "restart" in n1.asked, 30,
                  "the rollback's restarts")
    for n in (n0, n1):
        assert n.args[n.asked.index("restart")] == {"resume_before": 4}
    [policy] = [e for e in of(run_root, "policy") if e.get("action") == "rollback"]
    assert policy["resume_before"] == 4 and "before step 4" in policy["text"], policy
    # journaled once each node answered (the fake node records a request before answering)
    wait_for_sync(lambda: len(of(run_root, "restarted")) == 2, 30, "both restarts journaled")
    assert [e["node"] for e in of(run_root, "restarted")] == ["node0", "node1"]
    # the restarts the judge asked for are no failures; the loop again after it stops the run
    for n in (n0, n1):
        n.send({"k": "event", "what": "restarting"}, {"k": "event", "what": "launched"})
    assert "stop" not in n0.asked
    attempt(n0, 0, 20, resumed=2)
    wait_for_sync(lambda: "stop" in n0.asked, 30, "the stop after the rollback")
    assert [e["action"] for e in of(run_root, "loop")] == ["rollback", "stop"]


def test_ranks_resumed_apart_are_named_in_the_verdict_and_no_restart_repeats_it(judge):
    run_root, port = judge(("node0", "node1"), on_hang="restart", stall_after=2.0)
    n0 = FakeNode(port, "node0", {"ranks": [
        {"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]})
    n1 = FakeNode(port, "node1", {"ranks": [
        {"pid": 11, "rank": 1, "stack": stack("sleep"), "fr": fr(4, True)}]})
    # as after a restart (the rule's own test has one: tests/agent/test_loop_rules.py); here
    # at the start, which no other line's event can overtake
    n0.send({"k": "file", "f": 1, "rank": 0},
            {"k": "resumed", "f": 1, "step": 150, "path": "/c/checkpoint-150"})
    n1.send({"k": "file", "f": 1, "rank": 1})
    for step in range(3):
        n0.send({"k": "metric", "f": 1, "step": 151 + step, "step_time": 0.1})
        n1.send({"k": "metric", "f": 1, "step": 1 + step, "step_time": 0.1})
    words = ("rank 0 resumed from step 150, rank 1 from none: is the checkpoint folder "
             "shared by every node?")
    said = wait_for_sync(lambda: of(run_root, "resume mismatch"), 30, "the mismatch")
    assert said[0]["text"] == words and said[0]["resumed"] == {"0": 150, "1": None}
    verdict = wait_for_sync(lambda: of(run_root, "verdict"), 60, "a verdict")
    assert verdict[0]["cause"] == words and words in verdict[0]["text"]
    refused = wait_for_sync(lambda: [e for e in of(run_root, "policy")
                                     if e.get("action") == "none"], 30, "the refusal")
    assert refused[0]["text"] == "--on-hang restart: node1 not restarted: " + words
    assert "restart" not in n0.asked + n1.asked


def test_on_hang_restart_is_not_taken_a_fourth_time_into_the_same_hang(judge):
    """The judge's own restarts count: rank 1 hangs at step 6 after each of its 3 restarts
    (each resumed from step 4); the fourth is the loop, and the run stops instead."""
    run_root, port = judge(("node0", "node1"), on_hang="restart", stall_after=1.0)
    n0 = FakeNode(port, "node0", {"ranks": [
        {"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]})
    n1 = FakeNode(port, "node1", {"ranks": [
        {"pid": 11, "rank": 1, "stack": stack("sleep"), "fr": fr(4, True)}]})
    for restart in range(4):
        first = 1 if restart == 0 else 5
        for n, rank in ((n0, 0), (n1, 1)):
            n.send({"k": "file", "f": restart + 1, "rank": rank},
                   *[{"k": "metric", "f": restart + 1, "step": s, "step_time": 0.01}
                     for s in range(first, 6)])
        if restart == 3:
            break
        wait_for_sync(lambda: n1.asked.count("restart") > restart, 60,
                      "the judge's restart %d" % (restart + 1))
        n1.send({"k": "event", "what": "restarting"}, {"k": "event", "what": "launched"})
    stopped = wait_for_sync(lambda: [e for e in of(run_root, "policy")
                                     if e.get("action") == "none"], 60, "the refusal")
    assert stopped[0]["text"] == "--on-hang restart: node1 not restarted: " + WORDS
    assert of(run_root, "loop")[0]["text"] == "node1: %s: stopping the run" % WORDS
    wait_for_sync(lambda: "stop" in n0.asked and "stop" in n1.asked, 30, "the stops")
    assert n1.asked.count("restart") == 3
