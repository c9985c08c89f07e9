"""The loop rules on their own (agent/rules/loops.py): a node that fails at the same step
after every restart is a loop after ``after`` restarts, in words that say so; progress past
that step starts the count again; ranks that resumed from different steps are named."""

from agent.rules.loops import Loops, loop_words, rank_list, resume_mismatch


def crash_loop(loops, node="node0", attempts=4, resumed=4, fail_at=6, ranks=(0, 1)):
    """torchrun's own restarts: each attempt's workers resume from ``resumed``, step to
    ``fail_at`` - 1 and fail (every rank of the group says so); what :meth:`Loops.apply` said."""
    said = []
    fid = 0
    for attempt in range(attempts):
        fids = []
        for rank in ranks:
            fid += 1
            fids.append(fid)
            loops.apply(node, {"k": "file", "f": fid, "rank": rank})
        first = 1 if attempt == 0 else resumed + 1
        for step in range(first, fail_at):
            for f in fids:
                said.append(loops.apply(node, {"k": "metric", "f": f, "step": step}))
        for rank in ranks:
            said.append(loops.apply(node, {"k": "event", "what": "worker_failed",
                                           "rank": rank, "attempt": attempt}))
    return [s for s in said if s is not None]


def test_the_same_step_after_three_restarts_is_a_loop_said_once():
    loops = Loops(3)
    assert crash_loop(loops, attempts=3) == []  # the first failure and 2 restarts: not yet
    loops = Loops(3)
    assert crash_loop(loops, attempts=6) == [
        ("node0", "no progress in 3 restarts: each failed at step 6")]


def test_a_restart_that_passes_the_step_it_failed_at_starts_the_count_again():
    loops = Loops(2)
    loops.apply("node0", {"k": "file", "f": 1, "rank": 0})
    for step in (1, 2, 3):
        loops.apply("node0", {"k": "metric", "f": 1, "step": step})
    assert loops.apply("node0", {"k": "event", "what": "restarting"}) is None  # at step 4
    loops.apply("node0", {"k": "metric", "f": 1, "step": 4})  # past it: progress
    assert loops.apply("node0", {"k": "event", "what": "restarting"}) is None  # at step 5
    assert loops.apply("node0", {"k": "event", "what": "restarting"}) is None
    assert loops.apply("node0", {"k": "event", "what": "restarting"}) == (
        "node0", "no progress in 2 restarts: each failed at step 5")


def test_the_judges_own_restart_is_counted_once_and_zero_means_never():
    loops = Loops(1)
    loops.apply("node0", {"k": "file", "f": 1, "rank": 0})
    loops.apply("node0", {"k": "metric", "f": 1, "step": 7})
    assert loops.would_loop("node0") is None
    assert loops.failure("node0", judge=True) is None  # the judge restarts it (a hang)
    assert loops.apply("node0", {"k": "event", "what": "restarting"}) is None  # that one
    assert loops.would_loop("node0") == "no progress in 1 restart: each failed at step 8"
    never = Loops(0)
    assert crash_loop(never, attempts=8) == [] and never.would_loop("node0") is None


def test_a_new_torchrun_counts_its_attempts_from_zero_again():
    loops = Loops(2)
    assert crash_loop(loops, attempts=2) == []
    loops.apply("node0", {"k": "event", "what": "launched", "launch": 2})
    said = loops.apply("node0", {"k": "event", "what": "worker_failed", "attempt": 0})
    assert said == ("node0", "no progress in 2 restarts: each failed at step 6")


def test_loop_words():
    assert loop_words([120, 120, 120]) == "no progress in 3 restarts: each failed at step 120"
    assert loop_words([118, 120, None]) == (
        "no progress in 3 restarts: each failed by step 120 (steps 118, 120, ?)")
    assert loop_words([None, None]) == "no progress in 2 restarts: each failed before any step"


def test_ranks_that_resumed_apart_are_named_with_the_likely_cause():
    assert resume_mismatch({0: 150, 1: None, 2: None, 3: None}) == (
        "rank 0 resumed from step 150, ranks 1-3 from none: is the checkpoint folder shared "
        "by every node?")
    assert resume_mismatch({0: 150, 1: 100, 2: None, 3: 150}) == (
        "ranks 0, 3 resumed from step 150, rank 1 from step 100, rank 2 from none: is the "
        "checkpoint folder shared by every node?")
    assert resume_mismatch({0: 150, 1: 150}) is None and resume_mismatch({0: None}) is None
    assert rank_list(list(range(0, 40, 2))).endswith(", ...")


def test_after_a_restart_each_rank_says_where_it_resumed_from_its_line_or_first_step():
    loops = Loops()
    for node, f, rank in (("node0", 1, 0), ("node1", 1, 1), ("node1", 2, 2)):
        loops.apply(node, {"k": "file", "f": f, "rank": rank})
        loops.apply(node, {"k": "metric", "f": f, "step": 1})
    assert loops.mismatch([0, 1, 2]) is None  # all from nothing at the start
    loops.apply("node1", {"k": "event", "what": "restarting"})
    assert loops.resumed == {}
    loops.apply("node0", {"k": "metric", "f": 1, "step": 40})  # an old worker: not counted
    for node, f, rank in (("node0", 3, 0), ("node1", 4, 1), ("node1", 5, 2)):
        loops.apply(node, {"k": "file", "f": f, "rank": rank})
    loops.apply("node0", {"k": "resumed", "f": 3, "step": 150, "path": "/c/checkpoint-150"})
    loops.apply("node0", {"k": "metric", "f": 3, "step": 151})
    loops.apply("node1", {"k": "metric", "f": 4, "step": 1})
    assert loops.mismatch([0, 1, 2]) is None  # rank 2 has not said yet
    loops.apply("node1", {"k": "metric", "f": 5, "step": 1})
    words = "rank 0 resumed from step 150, ranks 1-2 from none: is the checkpoint folder " \
        "shared by every node?"
    assert loops.mismatch([0, 1, 2]) == words
    assert loops.mismatch([0, 1, 2]) is None  # said once a restart
    assert loops.told == words


def test_ranks_that_print_steps_at_different_rates_are_not_a_mismatch():
    # rank 1 prints every 10th step: its first step after the same resume is 10 later
    loops = Loops()
    for node, f, rank, first in (("node0", 1, 0, 1), ("node1", 1, 1, 10)):
        loops.apply(node, {"k": "file", "f": f, "rank": rank})
        loops.apply(node, {"k": "metric", "f": f, "step": first})
    assert loops.resumed == {0: None, 1: 9} and loops.mismatch([0, 1]) is None
    # but resume lines that say so are believed at any distance
    loops.restart()
    for node, f, rank, step in (("node0", 2, 0, 150), ("node1", 2, 1, 140)):
        loops.apply(node, {"k": "file", "f": f, "rank": rank})
        loops.apply(node, {"k": "resumed", "f": f, "step": step})
    assert loops.mismatch([0, 1]) == (
        "rank 0 resumed from step 150, rank 1 from step 140: is the checkpoint folder shared "
        "by every node?")


def test_a_slurm_requeue_is_no_failure():
    loops = Loops(1)
    for _ in range(3):
        assert loops.apply("node0", {"k": "event", "what": "restarting",
                                     "cause": {"message": "Slurm job 7 requeued"}}) is None
    assert "node0" not in loops.nodes or loops.nodes["node0"].failed_at == []
