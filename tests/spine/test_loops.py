"""No restart loops, with real torchrun and the reference trainer on CPU: a rank that crashes
at the same step after every restart (``--crash-always``; torchrun's own ``--max-restarts``
restarts its workers, each resuming from the newest checkpoint) makes the run's judge stop the
run after 3 restarts, in words that say so; with ``--on-loop rollback`` the judge's word to
every node (agent/supervisor/resume_hint.py) makes its next start resume from the checkpoint
before the newest. The rules alone: tests/agent/test_loop_rules.py; the judge alone:
tests/agent/test_judge_loops.py."""

from __future__ import annotations

import glob
import json
import os

import pytest

from agent.host.journal import JournalReader
from agent.supervisor import resume_hint

from tests.cli import UNBUFFERED, rankdeck

from .helpers import node_dir
from .test_judge import TIMEOUT, judge_events, launch_detached, stop, wait_for_event

pytestmark = pytest.mark.e2e
WORDS = "no progress in 3 restarts: each failed at step 6"
# small steps, a checkpoint every 2: each restart resumes from step 4 and crashes at 6
LOOPING = ["--steps", "100000", "--ckpt-every", "2", "--crash-at-step", "6", "--crash-rank", "0",
           "--crash-always"]


def rank_lines(workdir: str, run_id: str, needle: str) -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(node_dir(workdir, run_id, "node0"), "torchrun",
                                              "**", "stdout.log"), recursive=True)):
        with open(path, errors="replace") as f:
            out += [line.strip() for line in f if needle in line]
    return out


def test_a_rank_that_crashes_at_the_same_step_after_every_restart_is_stopped_after_3(tmp_path):
    notified = tmp_path / "notified.jsonl"
    # one rank: each restart costs torch's start-up, which is the test's time
    run_id, workdir = launch_detached(tmp_path, LOOPING, "--nproc-per-node", "1",
                                      "--max-restarts", "6", "--notify",
                                      "cat >> %s" % notified, nodes=1)
    try:
        over = wait_for_event(workdir, run_id, lambda e: e["what"] == "run_ended",
                              "the run's end")
        loop = [e for e in judge_events(workdir, run_id) if e["what"] == "loop"]
        assert [e["text"] for e in loop] == ["node0: %s: stopping the run" % WORDS], loop
        assert over[0]["state"] == "failed", over
        assert over[0]["cause"]["message"] == "stopped by --on-loop stop: node0: %s" % WORDS
        # each of the 3 restarts resumed from step 4 (and crashed before step 6 again)
        resumed = rank_lines(workdir, run_id, "resumed step=")
        assert len(resumed) >= 3 and all(r.startswith("resumed step=4 ") for r in resumed), \
            resumed
        status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
        assert status["state"] == "failed", status["state"]
        kinds = [json.loads(line)["kind"] for line in notified.read_text().splitlines()]
        assert kinds.count("loop") == 1 and "failed" in kinds, kinds
        failed = {m.get("attempt") for m, _d, _e in JournalReader(os.path.join(
            node_dir(workdir, run_id, "node0"), "journal")).read(limit=64 << 20)
            if m.get("k") == "event" and m.get("what") == "worker_failed"}
        assert {0, 1, 2, 3} <= failed and len(failed) <= 5, failed  # not torchrun's 6 restarts
    finally:
        # ended or not: stopped, so that its store goes now, not once it has seen no node
        # for 15 s (it stops itself then: tests/spine/test_judge.py's max-wall test)
        stop(run_id)


def test_on_loop_rollback_restarts_from_the_checkpoint_before_then_a_second_loop_stops(tmp_path):
    """The judge's rollback end to end: its restart carries ``resume_before`` to the node's
    link (agent/supervisor/judge_link.py), whose next start names it to the trainer: the ranks
    that resumed from step 4 three times resume from step 2; crashing at 6 again, the run
    loops again and, its one rollback spent, stops."""
    run_id, workdir = launch_detached(tmp_path, LOOPING, "--nproc-per-node", "1",
                                      "--max-restarts", "6", "--on-loop", "rollback", nodes=1)
    try:
        over = wait_for_event(workdir, run_id, lambda e: e["what"] == "run_ended",
                              "the run's end")
        events = judge_events(workdir, run_id)
        actions = [e.get("action") for e in events if e["what"] == "loop"]
        assert actions == ["rollback", "stop"], [e["text"] for e in events
                                                 if e["what"] in ("loop", "policy")]
        rolled = [e for e in events if e["what"] == "policy" and e.get("action") == "rollback"]
        assert rolled and rolled[0]["resume_before"] == 4, rolled
        resumed = rank_lines(workdir, run_id, "resumed step=")
        assert any(r.startswith("resumed step=2 ") for r in resumed), resumed
        # the word was for that start only: taken by it, none left for a later one
        assert not os.path.exists(os.path.join(node_dir(workdir, run_id, "node0"),
                                               resume_hint.ASKED))
        assert over[0]["state"] == "failed", over
    finally:
        # ended or not: stopped, so that its store goes now, not once it has seen no node
        # for 15 s (it stops itself then: tests/spine/test_judge.py's max-wall test)
        stop(run_id)
