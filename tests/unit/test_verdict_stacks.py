"""A torch with no flight recorder (2.4): the verdict from the stacks alone, saying so in the
verdict's summary and evidence, in `why`'s lines and the view's verdict screen.

Each rank's ``fr`` is what agent/torchrun/fr_dump.py makes of the hook's answer in such a torch
(agent/torchrun/frhook.py); the stacks are py-spy's, as in tests/unit/test_verdict.py."""

import json

from agent.torchrun.fr_dump import summary
from agent.torchrun.frhook import NO_RECORDER
from agent.rules.verdict import decide
from console.tui.verdict import verdict_text
from console.judgement.verdict import evidence_lines, verdict_lines

from tests.unit.test_verdict import STUCK_STACK, WAITING_STACK, hung_at

NOTE = "flight recorder unavailable on torch 2.4.1+cu121: verdict from stacks alone"
# what the hook answers in torch 2.4, through the node's summary (a JSON round trip, as sent)
NO_TRACE = summary(json.loads(json.dumps({"error": "this torch has no flight recorder "
                                                   "(2.4.1+cu121)", NO_RECORDER: "2.4.1+cu121"})))
# torchrun's @record wraps the trainer's main (trainer/train.py): a torch frame on every rank,
# outside the rank's own code, that says nothing of where it waits
RECORD = "    wrapper (torch/distributed/elastic/multiprocessing/errors/__init__.py:348)\n"
STUCK = STUCK_STACK + RECORD
WAITING = WAITING_STACK + RECORD
COMPUTING_STACK = '''Thread 12 (active): "MainThread"
    forward (trainer/model.py:{line})
    train_step (trainer/train.py:231)
'''
MISMATCH_STACK = '''Thread 11 (idle): "MainThread"
    broadcast (torch/distributed/distributed_c10d.py:2420)
    injected_mismatch (trainer/faults.py:95)
'''


def ranks(stacks):
    """One report per rank: its stack, and no trace (the torch has no recorder)."""
    return [{"rank": r, "node": "node%d" % r, "pid": 100 + r, "stack": s, "fr": NO_TRACE}
            for r, s in enumerate(stacks)]


def hung(stuck_rank=2, n=4):
    return ranks([STUCK if r == stuck_rank else WAITING for r in range(n)])


def test_the_hook_answer_keeps_which_torch_lacks_the_recorder():
    assert NO_TRACE == {"error": "this torch has no flight recorder (2.4.1+cu121)",
                        NO_RECORDER: "2.4.1+cu121"}


def test_the_rank_outside_any_collective_is_named_from_the_stacks_and_it_says_so():
    v = decide(hung(), earlier=hung())
    assert v["kind"] == "stuck-in-python", v
    assert v["suspects"] == [{"rank": 2, "node": "node2",
                              "frame": "trainer/faults.py:87 in injected_hang", "source": None}]
    assert v["summary"].startswith(NOTE + "; rank(s) 0-1,3 wait in a collective"), v["summary"]
    assert v["evidence"]["flight_recorder"] == NOTE
    assert v["evidence"]["waiting_ranks"] == [0, 1, 3]
    # `why` prints verdict_lines then evidence_lines (console/verbs/recorded.py cmd_why)
    assert verdict_lines(v)[0] == "stuck-in-python: " + v["summary"]
    assert evidence_lines(v)[:2] == [
        NOTE, "rank(s) 0-1,3 wait in a collective, at "
              "torch/autograd/graph.py:841 in _engine_run_backward"]
    shown = verdict_text(v).plain  # the view's verdict screen
    assert NOTE in shown and "rank 2 on node2" in shown


def test_a_rank_that_moved_between_the_samples_means_no_hang():
    later = hung()
    later[2]["stack"] = COMPUTING_STACK.format(line=40)
    v = decide(later, earlier=hung())
    assert v["kind"] == "unknown" and v["suspects"] == [], v
    assert v["summary"] == NOTE + "; no suspect: rank(s) 2 moved between two samples (no hang seen)"
    assert evidence_lines(v) == [NOTE, "rank(s) 2 moved between two samples (no hang seen)"]


def test_one_sample_names_nobody():
    v = decide(hung())
    assert v["kind"] == "unknown" and v["suspects"] == [] and v["summary"].startswith(NOTE)


def test_every_rank_waiting_is_no_suspect_without_the_recorder():
    """A mismatch (rank 1 in a broadcast, the others in backward's all-reduce) needs the
    recorder's ops and sizes: from stacks alone every rank waits, so nobody is named."""
    stacks = [WAITING, MISMATCH_STACK + RECORD, WAITING, WAITING]
    v = decide(ranks(stacks), earlier=ranks(stacks))
    assert v["kind"] == "unknown" and v["suspects"] == [], v
    assert "every rank is in a collective" in v["summary"]


def test_half_outside_is_no_majority_to_go_by():
    v = decide(hung(stuck_rank=1, n=2), earlier=hung(stuck_rank=1, n=2))
    assert v["kind"] == "unknown" and v["suspects"] == [], v
    assert "no majority" in v["summary"]


def test_a_rank_without_a_stack_names_nobody():
    reports = hung()
    reports[3]["stack"] = "py-spy: Permission denied"
    v = decide(reports, earlier=hung())
    assert v["kind"] == "unknown" and "no stack from rank(s) 3" in v["summary"], v


def test_one_torch_without_the_recorder_makes_the_whole_verdict_from_stacks():
    """Mixed nodes (one still on 2.4): the traces of the others cannot be compared with a
    rank that has none, so the stacks decide, and the verdict names the old torch."""
    reports = hung_at(2)
    reports[1]["fr"] = NO_TRACE
    reports[1]["stack"] = WAITING
    earlier = [dict(r) for r in reports]
    v = decide(reports, earlier=earlier)
    assert v["kind"] == "stuck-in-python" and [s["rank"] for s in v["suspects"]] == [2], v
    assert v["summary"].startswith(NOTE)


def test_a_torch_with_the_recorder_is_not_affected():
    v = decide(hung_at(2), earlier=hung_at(2))
    assert "flight_recorder" not in v["evidence"] and "stacks alone" not in v["summary"]
    assert v["evidence"]["waiting_in"]["op"] == "gloo:all_reduce"
