"""A cordoned node's ranks leave the console's model of the run (console/model/state.py
``set_role``, console/model/ranks.py ``take_file``): `status --json` after a cordon lists the new
world, never a stale rank of the node that went out, whether this console did the cordon or
replays the journals afterwards (`rankdeck status`: the record says the node is cordoned)."""

from __future__ import annotations

from console.model.state import RunState

NODES = [("node%d" % i, "10.0.0.%d" % (i + 1)) for i in range(5)]


def worker(state, node, fid, rank, attempt, world=4):
    state.apply_records(node, [[{"k": "file", "f": fid, "rank": rank, "local_rank": 0,
                                 "stream": "stdout", "attempt": attempt, "instance": node,
                                 "path": "p%d" % fid, "world_size": world, "ts": 1.0}]], 0)


def step(state, node, fid, n):
    state.apply_records(node, [[{"k": "metric", "f": fid, "step": n, "ts": 2.0}]], 0)


def listed(state):
    return sorted((r["rank"], n["name"]) for n in state.status()["nodes"] for r in n["ranks"])


def test_the_cordoning_console_forgets_the_nodes_ranks():
    state = RunState("r", NODES)
    for k in range(4):
        worker(state, "node%d" % k, 1, k, 0)
        step(state, "node%d" % k, 1, 5)
    state.set_role("node2", "cordoned")
    assert listed(state) == [(0, "node0"), (1, "node1"), (3, "node3")]
    worker(state, "node2", 2, 2, 1)  # a late record of the node: it claims nothing now
    assert 2 not in state.ranks


def test_a_replay_after_the_cordon_lists_no_rank_of_the_cordoned_node():
    """`rankdeck status` after node2 was cordoned and node4 put in: the record's roles come
    first, then the journals; node2's old rank 2 (its own journal, which still says it
    runs: its state.json comes later) does not hold rank 2 against node3's claim."""
    state = RunState("r", NODES)
    state.set_role("node2", "cordoned")
    for k in range(4):
        worker(state, "node%d" % k, 1, k, 0)
        step(state, "node%d" % k, 1, 5)
    for node, rank in (("node0", 0), ("node1", 1), ("node3", 2), ("node4", 3)):
        worker(state, node, 3, rank, 1)
        step(state, node, 3, 9)
    assert listed(state) == [(0, "node0"), (1, "node1"), (2, "node3"), (3, "node4")]
    assert all(rs.state == "running" and rs.step == 9 for rs in state.ranks.values())


def test_a_membership_rerun_in_the_same_attempt_lets_the_old_rank_go():
    """The cordon over SSH, seen from the cordoning console (bench/cordon_soak.py's failed
    rounds): node3's worker ran rank 3, then the rendezvous re-ran with the same attempt
    (torchrun's restart count unchanged by a membership change) and gave it rank 2 in a new
    file; the spare's claim of rank 3 was held for good, as if node3 still ran it."""
    state = RunState("r", NODES)
    for k in range(4):
        worker(state, "node%d" % k, 1, k, 0)
        step(state, "node%d" % k, 1, 5)
    state.set_role("node2", "cordoned")
    for node in ("node0", "node1", "node3"):  # the survivors' new attempt, old ranks
        worker(state, node, 2, int(node[-1]), 1)
    worker(state, "node4", 1, 3, 1)  # the spare's claim: held, node3 runs rank 3
    assert state.ranks[3].node == "node3"
    worker(state, "node3", 3, 2, 1)  # the re-run, same attempt: node3's worker is rank 2 now
    step(state, "node4", 1, 9)
    assert listed(state) == [(0, "node0"), (1, "node1"), (2, "node3"), (3, "node4")]
    assert state.ranks[3].step == 9
