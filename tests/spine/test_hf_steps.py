"""Every loss at its own step: a loop that prints as a Hugging Face Trainer does, run by real
torchrun on 2 local nodes of 2 ranks each, then exported as JSON lines, CSV and TensorBoard.

The progress bar is on stderr (``\\r 3%|▎ | 1/30 [...]``, a bar redrawn with ``\\r`` and no
line end until the loop is over), the loss dict on stdout (tests/spine/hf_style_writer.py: rank 0
through tqdm as transformers does it, rank 1 the same bytes by hand, ranks 2 and 3 a bar and a
dict with no clear between them). Each loss is 1/step, so every exported point says which step
it belongs to: 30 steps x 4 ranks is 120 loss points, each at its step, and none without one.
A bar record counts when it is written, not when the next ``\\r`` starts
(agent/host/tail.py); the dict takes the bar's step across the rank's two files
(agent/formats/hf.py).
"""

from __future__ import annotations

import csv
import json
import os

import pytest

from tests.cli import rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import all_ended, processes_of
from .test_judge import wait_for_event

pytestmark = pytest.mark.e2e
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_style_writer.py")
STEPS, NODES, RANKS = 30, 2, 4
EXPECTED = sorted((rank, step, round(1.0 / step, 6)) for rank in range(RANKS)
                  for step in range(1, STEPS + 1))


def losses(rows):
    """(rank, step, loss) of every exported row with a loss (step -1: it had none)."""
    return sorted((int(r["rank"]), -1 if r["step"] in (None, "") else int(r["step"]),
                   float(r["loss"])) for r in rows if r["loss"] not in (None, ""))


def test_each_loss_is_exported_at_its_own_step(tmp_path):
    pytest.importorskip("tqdm")
    workdir = str(tmp_path / "work")
    inv = write_inventory(tmp_path, workdir, NODES)
    out = rankdeck("launch", "--detach", "--skip-preflight", "--nproc-per-node", "2", "-i", inv,
                   WRITER, "--", str(STEPS), "0.1")
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    try:
        # the judge's end of the run, read from its journal: a look is a file's read, where
        # each look of `status` is a new console process (its imports, a serve a host)
        wait_for_event(workdir, run_id, lambda e: e["what"] == "run_ended", "the run's end",
                       timeout=300)

        def ended():
            status = rankdeck("status", run_id, "--json")
            return status.returncode == 0 and json.loads(status.stdout)["state"] in (
                "succeeded", "failed", "stopped") and json.loads(status.stdout)
        status = wait_for_sync(ended, 300, "the run to end", every=1.0)
        assert status["state"] == "succeeded", status
        # the judge's view of the ranks (agent/rules/judge_view.py, the same metric metas):
        # every rank at the last step
        ranks = {r["rank"]: r for n in status["nodes"] for r in n["ranks"]}
        assert sorted(ranks) == list(range(RANKS)), ranks
        assert all(r["step"] == STEPS for r in ranks.values()), ranks

        out_dir = tmp_path / "export"
        for fmt in ("jsonl", "csv"):
            rankdeck("export", run_id, "--format", fmt, "--out", str(out_dir), check=True)
        with open(out_dir / ("%s-ranks.jsonl" % run_id)) as f:
            jsonl = [json.loads(line) for line in f]
        with open(out_dir / ("%s-ranks.csv" % run_id), newline="") as f:
            from_csv = list(csv.DictReader(f))
        assert losses(jsonl) == EXPECTED
        assert losses(from_csv) == EXPECTED

        pytest.importorskip("tensorboard")
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        rankdeck("export", run_id, "--format", "tensorboard", "--out", str(out_dir),
                 check=True)
        points = []
        for rank in range(RANKS):
            acc = EventAccumulator(str(out_dir / run_id / ("rank%d" % rank)))
            acc.Reload()
            points += [(rank, e.step, round(e.value, 6)) for e in acc.Scalars("loss")]
        # float32 in TensorBoard: compare at its precision
        assert sorted(points) == [(r, s, round(float(_f32(v)), 6)) for r, s, v in EXPECTED]
    finally:
        if processes_of(run_id):
            rankdeck("stop", run_id)
        all_ended(run_id)


def _f32(value):
    import struct
    return struct.unpack("f", struct.pack("f", value))[0]
