"""A host's record across runs and its flag (agent/rules/fleet.py): incidents in 2 of its last
5 runs flag it; a node failing because a peer failed is no incident of its own."""

from __future__ import annotations

import copy
import random

from agent.rules import fleet


def run(run_id, ended, incidents=(), node="node1"):
    return {"run_id": run_id, "ended": ended,
            "nodes": {node: {"state": "failed" if incidents else "exited",
                             "incidents": [fleet.incident(k, t) for k, t in incidents]}}}


def test_incidents_in_two_of_the_last_five_runs_flag_the_host():
    one = [run("r1", 1, [("verdict", "named by the verdict")])] + \
        [run("r%d" % i, i) for i in range(2, 5)]
    assert fleet.judged(one)["flagged"] is False
    two = one + [run("r5", 5, [("gpu-error", "GPU 0 reported Xid 79")])]
    got = fleet.judged(two)
    assert got["flagged"] is True and got["runs"] == ["r1", "r2", "r3", "r4", "r5"]
    assert [(i["run_id"], i["kind"]) for i in got["incidents"]] == \
        [("r1", "verdict"), ("r5", "gpu-error")]
    # r1 falls out of the last five: one run with incidents left, no flag
    assert fleet.judged(two + [run("r6", 6)])["flagged"] is False


def test_a_node_that_failed_for_its_peer_has_no_incident_of_its_own():
    peer = {"message": "torchrun exited with code 1: rendezvous closed", "rank": None}
    assert fleet.node_incidents("failed", peer) == []
    own = {"message": "rank 3: RuntimeError: CUDA error", "rank": 3, "local_rank": 1}
    assert [i["kind"] for i in fleet.node_incidents("failed", own)] == ["crashed"]
    stop = {"message": "stopped by --on-hang stop: rank 3 stuck", "named": True}
    assert [i["kind"] for i in fleet.node_incidents("failed", stop)] == ["verdict"]
    assert fleet.node_incidents("failed", dict(stop, named=False)) == []
    assert [i["kind"] for i in fleet.node_incidents(
        "stopped", None, {"why": "cordoned by alice"}, ["GPU 1 reported Xid 79"])] == \
        ["gpu-error", "cordoned"]


def test_the_record_keeps_twenty_runs_and_two_nodes_of_one_run_together():
    record = None
    for i in range(25):
        record = fleet.add_run(record, "r%d" % i, "node1", {"state": "exited", "ended": i})
    record = fleet.add_run(record, "r24", "node2", {"state": "failed", "ended": 24,
                                                    "incidents": [fleet.incident("crashed", "x")]})
    assert [r["run_id"] for r in record["runs"]] == ["r%d" % i for i in range(5, 25)]
    assert sorted(record["runs"][-1]["nodes"]) == ["node1", "node2"]
    assert fleet.add_run("garbage", "r1", "n", {"ended": 1})["runs"][0]["run_id"] == "r1"
    # the laptop's history adds a run the host's record lacks
    laptop = [run("r99", 99, [("verdict", "named")])]
    assert [r["run_id"] for r in fleet.merged(record["runs"], laptop)][-1] == "r99"


def test_a_flagged_hosts_node_is_proposed_for_cordon_on_its_first_trouble_of_the_run():
    """--auto-cordon counts the host's record: a node of a flagged host is proposed (and so
    cordoned by the judge) on its first trouble, with no restart before it; another node only
    when in trouble again soon after its restart (agent/rules/judge.py cordon_proposal)."""
    from agent.rules.judge import verdict_proposals
    from agent.rules.judge_view import RunView
    view = RunView(["node0", "node1"], 60.0, 600.0, flagged=["node1", "nodeX"])
    verdict = {"kind": "stuck-in-python", "suspects": [{"node": "node0", "rank": 0},
                                                       {"node": "node1", "rank": 1}]}
    got = verdict_proposals(view, verdict, 100.0)
    assert [(e["node"], e["flagged"]) for e in got] == [("node1", True)]
    assert "its host is flagged" in got[0]["text"]
    assert verdict_proposals(view, verdict, 101.0) == []  # once a run
    assert verdict_proposals(RunView(["node1"], 60.0, 0, flagged=["node1"]), verdict, 1) == []


HOSTILE = [None, 1, -1, 2 ** 70, 1.5, float("nan"), True, "x", "[b]red[/b]\x1b[31m", [], {},
           [1], [{}], [[1, 2]], {"nodes": 1}, {"nodes": {"n": 1}},
           {"nodes": {"n": {"incidents": 1}}}, {"nodes": {"n": {"incidents": [1, "x", {}]}}},
           {"run_id": "r", "ended": "yesterday", "nodes": {"n": {"incidents": [{"kind": 1}]}}}]
KEYS = ["record", "runs", "load", "gpus", "strays", "flagged", "incidents", "run_id", "nodes",
        "state", "kind", "text", "mem_used", "mem_total", "pid", "user", "cmd", "gpu_mem",
        "ended", "starttime", "own"]


def _junk(rnd, depth=0):
    pick = rnd.random()
    if depth > 3 or pick < 0.4:
        return copy.deepcopy(rnd.choice(HOSTILE))
    if pick < 0.7:
        return [_junk(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {rnd.choice(KEYS): _junk(rnd, depth + 1) for _ in range(rnd.randint(0, 6))}


def test_any_host_answer_gives_a_row_of_checked_fields_or_nothing_shown():
    """A host's `hosts` answer is untrusted: whatever its shape, `rankdeck hosts` makes a row
    (no exception), every stray has whole pid and start time, and the lines are strings."""
    from console.run.fleet import flagged_words, lines, row
    rnd = random.Random(7)
    for _ in range(3000):
        answer = _junk(rnd)
        answer = answer if isinstance(answer, dict) else {"runs": answer}
        if rnd.random() < 0.5:
            answer["record"] = {"runs": _junk(rnd, 1)}
        r = row("node0", answer, None, [])
        assert all(isinstance(s["pid"], int) and isinstance(s["starttime"], int)
                   for s in r["strays"])
        assert all(isinstance(line, str) for line in lines([r]))
        assert isinstance(flagged_words(r), str)
        assert isinstance(r["flagged"], bool)
