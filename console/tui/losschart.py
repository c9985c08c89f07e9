"""LossChart: loss against step in braille dots, for rank 0 or all ranks, with lr beside it.

Redrawn when the app says the run changed (at most a few times a second); the points come
from RunState's bounded per-rank series, sampled down to what the width can show.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..state import RunState
from .braille import bounds, plot, sample
from .guard import NA, shown_or
from ..summary import run_step, steps_per_s
from ..text import fmt_float

REDRAW_S = 1.0
MAX_SERIES = 32  # ranks drawn in "all" mode (evenly chosen); more would be one blur
STATS_WIDTH = 22
AXIS_WIDTH = 8


class LossChart(Widget):
    DEFAULT_CSS = """
    LossChart { height: 1fr; padding: 0 1; }
    """

    all_ranks: reactive[bool] = reactive(False)

    def __init__(self, state: RunState, **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self._seen = None
        self._drawn = 0.0

    def update_chart(self) -> None:
        """Redraw (at most once a second) if a point, rank or metric changed since the last."""
        rs0 = self._first_rank()
        seen = (len(self.state.ranks), self.all_ranks,
                None if rs0 is None else (len(rs0.points), rs0.step, rs0.lr, rs0.step_time,
                                          rs0.points[-1] if rs0.points else None))
        now = time.monotonic()
        if seen != self._seen and now - self._drawn >= REDRAW_S:
            self._seen = seen
            self._drawn = now
            self.refresh()

    def _first_rank(self):
        return self.state.ranks[min(self.state.ranks)] if self.state.ranks else None

    def series(self) -> list[list]:
        """The point lists drawn: other ranks first, the lowest rank last (on top)."""
        ranks = sorted(self.state.ranks)
        if not ranks:
            return []
        chosen = [ranks[0]]
        if self.all_ranks and len(ranks) > 1:
            others = ranks[1:]
            stride = max(1, -(-len(others) // (MAX_SERIES - 1)))
            chosen = others[::stride] + chosen
        width = max(8, (self.size.width - AXIS_WIDTH - STATS_WIDTH) * 2)
        return [sample(list(self.state.ranks[r].points), width * 2) for r in chosen]

    @shown_or(lambda self: Text("loss vs step: %s" % NA, style="dim"))
    def render(self) -> Text:
        width = max(8, self.size.width - AXIS_WIDTH - STATS_WIDTH - 1)
        height = max(2, self.size.height - 2)
        series = self.series()
        box = bounds(series)
        stats = self._stats()
        title = Text("loss vs step - %s  (l: %s)" % (
            "all ranks" if self.all_ranks else "rank %s" % (min(self.state.ranks)
                                                            if self.state.ranks else 0),
            "rank 0 only" if self.all_ranks else "all ranks"), style="bold")
        out = Text(no_wrap=True, overflow="crop")
        out.append_text(title)
        out.append("\n")
        if box is None:
            rows = [[(" ", -1)] * width for _ in range(height)]
        else:
            rows = plot(series, width, height, box)
        last = len(series) - 1
        for r, row in enumerate(rows):
            label = ""
            if box is not None and r == 0:
                label = fmt_float(box[3], 3)
            elif box is not None and r == height - 1:
                label = fmt_float(box[2], 3)
            out.append(label.rjust(AXIS_WIDTH - 1)[: AXIS_WIDTH - 1] + "│", "dim")
            run, owner = [], None
            for ch, who in row + [("", -2)]:  # one append per run of cells of one series
                if who != owner and run:
                    out.append("".join(run), "bold bright_cyan" if owner == last else "blue")
                    run = []
                run.append(ch)
                owner = who
            out.append("  " + (stats[r] if r < len(stats) else ""))
            out.append("\n")
        if box is not None:
            left, right = "%d" % box[0], "%d" % box[1]
            axis = " " * AXIS_WIDTH + left + " " * max(1, width - len(left) - len(right)) + right
            out.append(axis, "dim")
        return out

    def _stats(self) -> list[str]:
        rs = self._first_rank()
        if rs is None:
            return ["waiting for the", "first step"]
        rate = steps_per_s(self.state)
        return [
            "step      %s" % ("-" if run_step(self.state) is None else run_step(self.state)),
            "loss      %s" % fmt_float(rs.loss),
            "lr        %s" % fmt_float(rs.lr, 6),
            "step time %s" % ("-" if rs.step_time is None else "%.3f s" % rs.step_time),
            "steps/s   %s" % ("-" if rate is None else "%.2f" % rate),
            "tok/s     %s" % ("-" if rs.tok_s is None else "%.0f" % rs.tok_s),
        ]

    def watch_all_ranks(self) -> None:
        self._seen = None
        self.refresh()
