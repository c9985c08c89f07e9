"""RunHeader: run id, run state or launch phase (with ``--sync`` progress while code goes
to the hosts), elapsed time, step, steps/s and ETA; on Slurm the job's time left beside the age
of the last complete checkpoint; the run's goodput and its work at risk (GPU-hours since the
newest complete checkpoint: console/records/goodput.py), reduced again every GOODPUT_EVERY s.

ETA needs the total number of steps, taken from the trainer's ``--steps N`` in the run spec;
without it the ETA is "?". ``clock`` is injectable so snapshots can freeze elapsed time.
"""

from __future__ import annotations

import time
from typing import Callable

from rich.text import Text
from textual.widgets import Static

from ..model.state import RunState
from ..model.rendezvous import wait_short
from ..model.summary import eta_s, launch_progress, run_step, steps_per_s, total_steps
from ..lines.text import hms
from ..records.goodput import header_piece
from .fitting import fitted
from .guard import NA, shown_or
from .styles import state_style

GOODPUT_EVERY = 5.0  # seconds between two reductions of the run's goodput for the header


class RunHeader(Static):
    DEFAULT_CSS = """
    RunHeader { height: 1; width: 100%; background: $primary 30%; color: $text; padding: 0 1; }
    """

    def __init__(self, state: RunState, record: dict | None = None,
                 clock: Callable[[], float] = time.time, **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self.record = record if record is not None else {}
        self.clock = clock
        self.phase: str | None = "launching"  # set by the app while launch() runs
        self.sync_line: str | None = None  # --sync progress while code goes to the hosts
        self.goodput: tuple[float, str | None] = (float("-inf"), None)  # (when, its piece)

    def on_mount(self) -> None:
        self.update_info()
        self.set_interval(1.0, self.update_info)

    @shown_or(lambda self: Text("rankdeck run %s  %s" % (self.state.run_id, NA), no_wrap=True))
    def info(self) -> Text:
        """The header's line; in a narrow terminal the least needed parts are left out
        (``rankdeck``, elapsed, steps/s first), never cut."""
        state = self.state
        run_state = state.run_state()
        shown = self.phase if self.phase and run_state not in ("running", "succeeded",
                                                                "failed", "stopped", "gone") \
            else run_state
        pieces = [("rankdeck ", "bold", 5), ("run %s  " % state.run_id, "", 0),
                  ("● %s" % shown, state_style(shown) or "cyan", 0)]
        operators = state.operators.summary()  # read-only, consoles, who drives
        if operators:
            pieces.append(("  %s" % operators, "bold magenta", 1))
        if state.waiting:  # a restart that has not brought every node back: say what it waits for
            pieces.append(("  %s" % wait_short(state.waiting, self.clock()), "bold yellow", 1))
        if shown == "launching":
            pieces.append((" (%s)" % launch_progress(state), "cyan", 1))
            if self.sync_line:
                pieces.append(("  %s" % self.sync_line, "cyan", 2))
        pieces.append(("  elapsed %s" % hms(self.clock() - state.started), "", 4))
        step, total = run_step(state), total_steps(self.record)
        pieces.append(("  step %s/%s" % ("-" if step is None else step,
                                         "?" if total is None else total), "", 0))
        rate = steps_per_s(state)
        pieces.append(("  %s steps/s" % ("-" if rate is None else "%.2f" % rate), "", 3))
        pieces.append(("  ETA %s" % hms(eta_s(state, self.record, rate)), "", 2))
        if state.slurm and state.slurm.get("time_left_s") is not None:  # a Slurm run's job
            pieces.append(("  %s" % job_left(state, self.clock()), "", 1))
        good = self.goodput_piece()
        if good:
            pieces.append(("  %s" % good, "", 2))
        up = sum(1 for n in state.nodes.values() if n.state not in ("unreachable", "lost", "gone",
                                                                    "connecting"))
        pieces.append(("  nodes %d/%d up" % (up, len(state.nodes)), "", 1))
        width = self.content_size.width if self.is_mounted else 0
        text = Text(no_wrap=True, overflow="ellipsis")
        for piece, style in (fitted(pieces, width) if width else
                             [(t, s) for t, s, _r in pieces]):
            text.append(piece, style)
        return text

    def goodput_piece(self) -> str | None:
        """``goodput 94%, at risk 0.3 GPU-h``, reduced at most every GOODPUT_EVERY s."""
        now = self.clock()
        if now - self.goodput[0] >= GOODPUT_EVERY:
            self.goodput = (now, header_piece(self.state.goodput.report(now)))
        return self.goodput[1]

    def on_resize(self) -> None:
        self.update_info()

    def update_info(self) -> None:
        self.update(self.info(), layout=False)  # one line, fixed size


def job_left(state: RunState, now: float) -> str:
    """``Slurm 12:04 left, ckpt 3:10 ago``: the job's time left (squeue's, counted down since
    it was asked) beside the age of the run's last complete checkpoint."""
    job = state.slurm or {}
    left = max(0.0, job["time_left_s"] - (now - job.get("at", now)))
    last = state.checkpoints.last_complete()
    age = "ckpt %s ago" % hms(now - last.ts) if last is not None and last.ts else "no ckpt yet"
    return "Slurm %s left, %s" % (hms(left), age)
