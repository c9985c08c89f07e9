"""LossChart: loss against step in braille dots, for rank 0 or all ranks, over the whole
width of its panel: the latest figures (loss, step, lr, step time, tok/s) on a line above
the curve, a step axis under it.

Redrawn when the app says the run changed (at most a few times a second); the points come
from RunState's bounded per-rank series, sampled down to what the width can show.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..model.state import RunState
from .braille import bounds, plot, sample
from .fitting import fitted
from .guard import NA, shown_or
from ..model.summary import run_step, steps_per_s
from ..lines.text import fmt_float

REDRAW_S = 1.0
MAX_SERIES = 32  # ranks drawn in "all" mode (evenly chosen); more would be one blur
AXIS_WIDTH = 8  # the loss labels and the axis line left of the curve
TICKS = 5  # step labels wanted under the curve (fewer where they do not fit)


def step_axis(first: int, last: int, width: int) -> str:
    """The step labels under a curve ``width`` columns wide from step ``first`` to
    ``last``: the ends and evenly spaced steps between, each where its column is, two
    columns apart at least, no step twice."""
    cells = [" "] * width
    taken, said = -2, None
    for i in range(TICKS):
        col = round(i * (width - 1) / (TICKS - 1))
        label = "%d" % round(first + (last - first) * col / max(1, width - 1))
        start = col if i < TICKS - 1 else width - len(label)  # the last one ends at the edge
        between = 0 < i < TICKS - 1
        if start < taken + 2 or start + len(label) > width or label == said or \
                (between and label == "%d" % last):
            continue  # no room, or a step labelled already (a run of a few steps)
        said = label
        if i < TICKS - 1 and start + len(label) + 2 > width - len("%d" % last):
            continue  # leave room for the last
        cells[start:start + len(label)] = label
        taken = start + len(label)
    return "".join(cells)


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
        width = max(8, self.size.width - AXIS_WIDTH)
        return [sample(list(self.state.ranks[r].points), width * 2) for r in chosen]

    @shown_or(lambda self: Text("loss vs step: %s" % NA, style="dim"))
    def render(self) -> Text:
        """A line of figures, the curve over the whole width, then the step axis."""
        width = max(8, self.size.width - AXIS_WIDTH)
        height = max(2, self.size.height - 2)
        series = self.series()
        box = bounds(series)
        out = Text(no_wrap=True, overflow="crop")
        for piece, style in fitted(self._figures(), max(8, self.size.width)):
            out.append(piece, style)
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
            out.append("\n")
        if box is not None:
            out.append("step".rjust(AXIS_WIDTH - 1) + " " + step_axis(int(box[0]), int(box[1]),
                                                                       width), "dim")
        return out

    def _figures(self) -> list[tuple[str, str, int]]:
        """The line above the curve: whose loss, and the latest figures, each with its unit
        (``fitting.fitted`` leaves out the least needed where the panel is narrow)."""
        who = "all ranks" if self.all_ranks else "rank %s" % (min(self.state.ranks)
                                                              if self.state.ranks else 0)
        hint = "  l: %s" % ("rank 0 only" if self.all_ranks else "all ranks")
        rs = self._first_rank()
        if rs is None:
            return [(who, "bold", 0), ("  waiting for the first step", "dim", 1),
                    (hint, "dim", 9)]
        rate = steps_per_s(self.state)
        step = run_step(self.state)
        return [
            (who, "bold", 0),
            ("  loss %s" % fmt_float(rs.loss), "bold bright_cyan", 0),
            ("  step %s" % ("-" if step is None else step), "", 1),
            ("  lr %s" % fmt_float(rs.lr, 6), "", 2),
            ("  %s s/step" % ("-" if rs.step_time is None else "%.3f" % rs.step_time), "", 3),
            ("  %s tok/s" % ("-" if rs.tok_s is None else "%.0f" % rs.tok_s), "", 4),
            ("  %s steps/s" % ("-" if rate is None else "%.2f" % rate), "", 5),
            (hint, "dim", 9),
        ]

    def watch_all_ranks(self) -> None:
        self._seen = None
        self.refresh()
