"""The cordon sequence, written once (agent/rules/cordon.py): its steps in order and their
outcome words, as a console's cordon (console/surgery/cordon.py) and the judge's
(agent/judge/cordon.py) both drive it."""

from __future__ import annotations

import types

from agent.rules import cordon as seq


def run(c, results):
    """Drive ``c`` with canned results; the steps asked, with their args, and the outcome."""
    asked = []
    while True:
        step, args = seq.next_step(c)
        if step == seq.END:
            return asked, args["outcome"]
        asked.append((step, args))
        c.done(step, results.get(step, {}))


def test_a_hung_node_with_a_spare_fenced_at_once_replaced_and_joined():
    c = seq.Cordon("node2", "node4", hung=True, stalled=["node0", "node1", "node2"])
    asked, outcome = run(c, {seq.FENCE: {"left": [], "gpu": "no GPU", "member": "m"},
                             seq.REPLACE: {"failed": None, "expelled": "done"},
                             seq.JOIN: {"stepping": True, "world": 4}})
    assert [s for s, _a in asked] == [seq.ANNOUNCE, seq.FENCE, seq.REPLACE, seq.JOIN]
    assert asked[0][1] == {"out": "node2", "in": "node4", "text": "cordon node2, spare node4 in"}
    assert asked[1][1]["grace"] == 0  # nothing of a hung node can save
    assert asked[2][1] == {"spare": "node4", "drop": ["node0", "node1"], "expel": "m"}
    assert asked[3][1] == {"spare": "node4", "wait": seq.JOIN_WAIT}
    assert outcome == "done" and seq.fenced(outcome)


def test_a_spare_that_does_not_step_is_said_never_done():
    c = seq.Cordon("node2", "node4", wait=30)
    _asked, outcome = run(c, {seq.FENCE: {"left": [], "gpu": "freed"},
                              seq.REPLACE: {"failed": None, "expelled": "not asked"},
                              seq.JOIN: {"stepping": False, "world": 3,
                                         "why": "node4 is starting, with no rank in the run"}})
    assert outcome == ("shrank: node2 fenced, but spare node4 is not stepping after 30 s; the "
                       "run went on with world size 3: node4 is starting, with no rank in the "
                       "run")
    assert seq.fenced(outcome)


def test_a_failed_fence_ends_the_sequence_before_the_spare():
    for result, words in (
            ({"error": "timed out"}, "failed: node2 could not be fenced: timed out"),
            ({"left": [[12, "python"]], "gpu": "freed"},
             "failed: 1 process(es) of node2 still alive after the stop"),
            ({"left": [], "gpu": "held: 30 MiB by pid(s) 12"},
             "failed: node2 stopped, but its GPU memory is held: 30 MiB by pid(s) 12"),
            ({"unconfirmed": 180.0},
             "failed: node2 was fenced, but its stop was not confirmed within 180 s")):
        asked, outcome = run(seq.Cordon("node2", "node4"), {seq.FENCE: result})
        assert [s for s, _a in asked] == [seq.ANNOUNCE, seq.FENCE] and outcome == words
    assert not seq.fenced("failed: node2 could not be fenced: timed out")
    assert seq.fenced("failed: 1 process(es) of node2 still alive after the stop")


def test_a_node_that_had_ended_is_not_fenced_and_nothing_is_dropped_or_expelled():
    c = seq.Cordon("node1", "node2", ended=True, stalled=["node0"])
    asked, outcome = run(c, {seq.FENCE: {"ended": True, "left": [], "gpu": "no GPU"},
                             seq.JOIN: {"stepping": True}})
    assert asked[2][1] == {"spare": "node2", "drop": [], "expel": None}
    assert outcome == "done, not fenced"
    _a, outcome = run(seq.Cordon("node1", "node2", ended=True),
                      {seq.FENCE: {"ended": True, "left": [5]}})
    assert outcome.startswith("failed: node1 ended with 1 process(es) left")


def test_a_shrink_has_no_join_and_a_spare_that_did_not_start_fails():
    c = seq.Cordon("node0", None, shrink=True, active_after=3)
    asked, outcome = run(c, {seq.FENCE: {"left": [], "gpu": "freed"}})
    assert c.what() == "cordon node0, the run shrinks to 3 node(s)"
    assert [s for s, _a in asked] == [seq.ANNOUNCE, seq.FENCE, seq.REPLACE] and outcome == "done"
    _a, outcome = run(seq.Cordon("node2", "node4"), {seq.FENCE: {}, seq.REPLACE: {
        "failed": "fenced"}})
    assert outcome == "failed: node2 fenced, but spare node4 did not start: fenced"


def test_the_spare_steps_once_each_of_its_ranks_runs_with_a_step():
    r = types.SimpleNamespace
    assert not seq.spare_stepping([r(rank=0, node="node0", state="running", step=9)], "node4")
    assert not seq.spare_stepping([r(rank=3, node="node4", state="starting", step=None)],
                                  "node4")
    assert seq.spare_stepping([r(rank=3, node="node4", state="running", step=5)], "node4")
    assert seq.why_not_stepping([r(rank=3, node="node4", state="starting", step=None)],
                                "node4", "running", "rendezvous") == \
        "node4 is running (rendezvous); its ranks: 3 starting"
