"""RunHeader: run id, run state or launch phase (with ``--sync`` progress while code goes
to the hosts), elapsed time, step, steps/s and ETA.

ETA needs the total number of steps, taken from the trainer's ``--steps N`` in the run spec;
without it the ETA is "?". ``clock`` is injectable so snapshots can freeze elapsed time.
"""

from __future__ import annotations

import time
from typing import Callable

from rich.text import Text
from textual.widgets import Static

from ..state import RunState
from ..rendezvous import wait_short
from ..summary import eta_s, launch_progress, run_step, steps_per_s, total_steps
from ..text import hms
from .guard import NA, shown_or
from .styles import state_style


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

    def on_mount(self) -> None:
        self.update_info()
        self.set_interval(1.0, self.update_info)

    @shown_or(lambda self: Text("rankdeck run %s  %s" % (self.state.run_id, NA), no_wrap=True))
    def info(self) -> Text:
        state = self.state
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("rankdeck ", "bold")
        text.append("run %s  " % state.run_id)
        run_state = state.run_state()
        shown = self.phase if self.phase and run_state not in ("running", "succeeded",
                                                                "failed", "stopped") \
            else run_state
        text.append("● %s" % shown, state_style(shown) or "cyan")
        operators = state.operators.summary()  # read-only, consoles, who drives
        if operators:
            text.append("  %s" % operators, "bold magenta")
        if state.waiting:  # a restart that has not brought every node back: say what it waits for
            text.append("  %s" % wait_short(state.waiting, self.clock()), "bold yellow")
        if shown == "launching":
            text.append(" (%s)" % launch_progress(state), "cyan")
            if self.sync_line:  # before the rest: the line is cut at the right edge
                text.append("  %s" % self.sync_line, "cyan")
        text.append("  elapsed %s" % hms(self.clock() - state.started))
        step, total = run_step(state), total_steps(self.record)
        text.append("  step %s/%s" % ("-" if step is None else step,
                                      "?" if total is None else total))
        rate = steps_per_s(state)
        text.append("  %s steps/s" % ("-" if rate is None else "%.2f" % rate))
        text.append("  ETA %s" % hms(eta_s(state, self.record, rate)))
        up = sum(1 for n in state.nodes.values() if n.state not in ("unreachable", "lost",
                                                                    "connecting"))
        text.append("  nodes %d/%d up" % (up, len(state.nodes)))
        return text

    def update_info(self) -> None:
        self.update(self.info(), layout=False)  # one line, fixed size
