"""Issue 40 (Medium 4): ``--on-nan stop`` counts a diverged loss only from a metric line: a
``loss=nan`` in printed text (a generated sample, a dataset row) is read by the plain family
after any prefix, with no step, and must not stop the run. The rank's real non-finite loss
with a step still counts, on the judge's side (agent/rules/judge_view.py, which drives
``--on-nan``) and on the console's (console/model/ranks.py)."""

from __future__ import annotations

import math

from agent.formats.metrics import MetricParser
from agent.rules.judge_view import RunView
from console.model.state import RunState

TRAIN = "step=%d loss=2.5 lr=3.000e-04 step_time=0.0163 tok/s=12345\n"


def through(lines):
    """Each line through the parser, then the judge's view and the console's model: the
    ``diverged`` events of each."""
    parser = MetricParser()
    view = RunView(["node0"], 60)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    state = RunState("r", [("node0", "10.0.0.1")])
    state.apply_records("node0", [[{"k": "file", "f": 1, "rank": 0, "local_rank": 0,
                                    "attempt": 0, "instance": "i", "stream": "stdout",
                                    "world_size": 1, "ts": 1.0}]], 0)
    judged = []
    for i, line in enumerate(lines):
        for rec in parser.parse(line, 1):
            rec.update(f=1, ts=2.0 + i)
            judged += [e for e in view.apply("node0", rec, 2.0 + i) if e["what"] == "diverged"]
            state.apply_records("node0", [[rec]], 0)
    said = [ev for ev in state.events if ev.kind == "diverged"]
    return judged, (state.ranks[0].diverged if said else "none")


def test_a_generated_sample_with_loss_nan_does_not_diverge_the_rank():
    lines = [TRAIN % 1, TRAIN % 2,
             "[rank0]: sample 2: 'the eval table printed loss=nan for row 17'\n",
             TRAIN % 3]
    judged, console = through(lines)
    assert judged == [] and console == "none"


def test_a_real_nan_loss_with_its_step_still_diverges():
    judged, console = through([TRAIN % 1, TRAIN.replace("2.5", "nan") % 2])
    assert [(e["rank"], e["step"]) for e in judged] == [(0, 2)] and console == 2


def test_a_stepless_loop_diverges_at_its_second_nan_in_a_row():
    judged, console = through(["loss=1.5\n", "loss=nan\n", "loss=1.4\n", "loss=nan\n"])
    assert judged == [] and console == "none"
    judged, console = through(["loss=1.5\n", "loss=nan\n", "loss=nan\n"])
    assert len(judged) == 1 and console is None  # diverged, at no known step


def test_the_parser_still_hands_on_a_nan_loss():
    (rec,) = MetricParser().parse("step=3 loss=nan\n")
    assert math.isnan(rec["loss"])
