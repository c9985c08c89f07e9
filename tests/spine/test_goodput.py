"""Goodput of a real run (agent/rules/goodput.py): real torchrun and the reference trainer on 2
local nodes, launched with `--detach` and `--on-hang restart`, rank 1 hanging once. The test
keeps its own times, from the ranks' own log files and the judge's journal as they grow: the
last step before the hang, the judge's restart, every rank stepping again. `rankdeck goodput
RUN --json` from a new shell (the judge's own report, fed live: agent/judge/goodput.py) has
buckets that add up to its wall, stalled and recovery buckets
within 2 s of the test's own, and the incident's four latencies and steps redone."""

from __future__ import annotations

import glob
import json
import os
import re
import threading
import time

import pytest

from tests.cli import UNBUFFERED, rankdeck
from tests.waits import wait_for_sync

from .test_judge import TIMEOUT, judge_events, launch_detached, stop

pytestmark = pytest.mark.e2e
STEP = re.compile(rb"^step=(\d+) ", re.M)


class Watch(threading.Thread):
    """Every 0.1 s: each rank's step lines (its torchrun stdout files) and whether the judge
    has restarted a node; the time the test first saw each."""

    def __init__(self, workdir: str, run_id: str):
        super().__init__(daemon=True)
        self.root = os.path.join(workdir, ".rankdeck", "runs", run_id)
        self.run_id, self.workdir = run_id, workdir
        # path -> step lines seen: per file, as a restarted node's new torchrun folder has a
        # random name that may sort before its old one
        self.seen: dict[str, int] = {}
        self.steps: list[tuple[float, int, int]] = []  # (when seen, rank, step)
        self.acted: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now = time.time()
            for path in glob.glob(os.path.join(self.root, "node*", "torchrun", "*",
                                               "attempt_*", "0", "stdout.log")):
                with open(path, "rb") as f:
                    data = f.read()
                head = re.match(rb"rank=(\d+) ", data)
                if head:
                    steps = [int(s) for s in STEP.findall(data)]
                    for step in steps[self.seen.get(path, 0):]:
                        self.steps.append((now, int(head.group(1)), step))
                    self.seen[path] = len(steps)
            if self.acted is None and any(e["what"] == "policy" and e.get("action") == "restart"
                                          for e in judge_events(self.workdir, self.run_id)):
                self.acted = now
            time.sleep(0.1)


def test_goodput_of_a_run_with_one_hang_restarted(tmp_path):
    # 2 nodes: rank 1 hangs, rank 0 waits for it in its all-reduce (each node more is its
    # torchrun's and its worker's torch start-up, twice: the restart starts every worker anew);
    # --grace 3: the hung rank ignores SIGTERM, the restart kills it after 3 s, not 10
    run_id, workdir = launch_detached(
        tmp_path, ["--steps", "100000", "--ckpt-every", "3", "--pg-timeout", "600",
                   "--hang-at-step", "8", "--hang-rank", "1"],
        "--max-restarts", "3", "--stall-after", "6", "--grace", "3", "--on-hang", "restart",
        nodes=2)
    watch = Watch(workdir, run_id)
    watch.start()
    try:
        wait_for_sync(lambda: watch.acted, TIMEOUT, "the judge's restart", every=0.5)
        # every rank steps again after the restart
        wait_for_sync(lambda: {r for t, r, _s in watch.steps if t > watch.acted} == {0, 1},
                      TIMEOUT, lambda: "every rank stepping again: %s" % watch.steps[-8:],
                      every=0.5)
    finally:
        watch.done.set()
        stop(run_id)
    before = [(t, s) for t, _r, s in watch.steps if t <= watch.acted]
    after = [(t, r, s) for t, r, s in watch.steps if t > watch.acted]
    last_step_at = max(t for t, _s in before)
    back_at = max(min(t for t, r, _s in after if r == rank) for rank in range(2))
    redone = max(s for _t, s in before) - min(s for _t, _r, s in after) + 1

    out = rankdeck("goodput", run_id, "--json", env=UNBUFFERED)
    assert out.returncode == 0, out.stdout + out.stderr
    good = json.loads(out.stdout)
    # the judge's own report (agent/judge/goodput.py), fed live and written as it ended: no replay
    assert good["source"] == "judge", good
    buckets = good["buckets"]
    assert set(buckets) == {"start-up", "productive", "rendezvous", "checkpoint", "stalled",
                            "recovery", "redone", "end"}, buckets
    assert abs(sum(buckets.values()) - good["wall_s"]) <= 0.01 * good["wall_s"], good
    assert good["ended"] and 0 < good["goodput"] < 1, good
    # the test's own times: the last step to the judge's restart, the restart to every rank back
    print("stalled %.1f s (test %.1f s), recovery %.1f s (test %.1f s)" % (
        buckets["stalled"], watch.acted - last_step_at, buckets["recovery"],
        back_at - watch.acted))
    assert abs(buckets["stalled"] - (watch.acted - last_step_at)) <= 2.0, (good, watch.steps)
    assert abs(buckets["recovery"] - (back_at - watch.acted)) <= 2.0, (good, watch.steps)
    incidents = good["incidents"]
    assert len(incidents) == 1, incidents
    inc = incidents[0]
    assert inc["what"] == "stall" and inc["action"] == "restart" and inc["rank"] == 1, inc
    for key in ("detect_s", "decide_s", "act_s", "recover_s"):
        assert inc[key] is not None and inc[key] >= 0, inc
    assert inc["detect_s"] >= 6  # --stall-after 6
    assert inc["steps_redone"] == redone and redone >= 1, (inc, redone)
    assert inc["gpu_hours_lost"] > 0
    # the same figures in `status --json` and the text of `goodput`
    status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
    assert status["goodput"]["incidents"][0]["steps_redone"] == redone, status["goodput"]
    assert status["goodput"]["source"] == "judge", status["goodput"]
    text = rankdeck("goodput", run_id, env=UNBUFFERED).stdout
    assert text.startswith("goodput ") and "stall rank 1" in text and "-> restart" in text, text
