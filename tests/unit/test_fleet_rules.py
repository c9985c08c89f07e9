"""A host's record across runs and its flag (agent/rules/fleet.py): incidents in 2 of its last
5 runs flag it; a node failing because a peer failed is no incident of its own."""

from __future__ import annotations

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
