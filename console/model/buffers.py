"""Bounded buffers of a run: a stream's newest lines (Kept), a rank's loss curve (Series) and
where its steps are in its lines (StepMarks).

RunState (console/model/state.py) holds one of each per rank; they keep memory flat however long
the run. No asyncio, no Textual.
"""

from __future__ import annotations

import math

from array import array
from collections import deque

from ..lines.lines import AFTER_RECORD

POINTS_PER_RANK = 4096


LINE_OVERHEAD = 57  # bytes a kept line costs beyond its text: the str object and its slot
BUDGET_MB = 144  # default memory for kept lines (`--line-budget`): RSS <= 300 MB at 512 ranks
FLOOR_LINES = 200  # what a stream nobody looks at keeps when the budget is tight
TRIM_TO = 0.9  # a trim frees down to this share of the budget, so trims are rare


def line_cost(lines) -> int:
    # one join counts the characters ~2.5x faster than summing each line's len()
    return len("".join(lines)) + LINE_OVERHEAD * len(lines)


class LineBudget:
    """One memory budget for the kept lines of every stream of a run.

    Each :class:`Kept` still has its own line cap; on top of that, when the streams together
    cost more than ``limit`` bytes, the streams nobody is looking at are cut down to
    ``floor`` lines first (largest first), and only then the shown ones. What was cut comes
    back from the hosts on scrolling (console/model/scrollback.py), so memory follows the budget,
    not the rank count.
    """

    def __init__(self, limit: int = BUDGET_MB << 20, floor: int = FLOOR_LINES):
        self.limit, self.floor, self.used = limit, floor, 0
        self.streams: list[Kept] = []

    def charge(self, cost: int) -> None:
        self.used += cost
        if self.used > self.limit:
            self.trim()

    def trim(self) -> None:
        target = int(self.limit * TRIM_TO)
        unseen = [k for k in self.streams if not k.shown_by]
        seen = [k for k in self.streams if k.shown_by]
        # the floors go last, and only if the floors alone would not fit (a tiny budget)
        for group, floor in ((unseen, self.floor), (seen, self.floor), (unseen, 0), (seen, 0)):
            for kept in sorted(group, key=lambda k: k.cost, reverse=True):
                if self.used <= target:
                    return
                kept.drop_oldest_cost(self.used - target, keep=floor)


class Kept:
    """A stream's newest ``cap`` lines, in chunks as they came: one per journal record.

    A chunk is ``(ts, node, journal, lines, first)``: ``first`` is the index in its record of
    ``lines[0]`` (above 0 once the front of the chunk was dropped). Lines go from the front
    only, so what is kept from a node is everything of this stream from some position on, and
    :meth:`floor` says which. Behaves as a sequence of line texts for simple readers.

    With a :class:`LineBudget`, the stream also gives up its oldest lines when the run's
    lines together exceed it; ``shown_by`` (the panes showing this stream) protects it then.
    """

    __slots__ = ("chunks", "costs", "count", "cap", "evicted", "per_node", "cost", "budget",
                 "shown_by")

    def __init__(self, cap: int, budget: LineBudget | None = None):
        self.chunks: deque = deque()
        # each chunk's line_cost, counted once when it came: a full stream drops a chunk for
        # each it adds, and counting it again was half of what keeping a line cost
        self.costs: deque = deque()
        self.count = 0
        self.cap = cap
        self.evicted: dict[str, tuple] = {}  # node -> newest dropped record's (offset, time)
        self.per_node: dict[str, int] = {}  # node -> chunks kept from it
        self.cost = 0  # bytes, as line_cost counts them
        self.budget = budget
        self.shown_by: set = set()
        if budget is not None:
            budget.streams.append(self)

    def add(self, ts: float, node: str, journal: int | None, lines: list[str]) -> None:
        if not lines:
            return
        # A tuple of strings (not the list): the collector stops tracking a chunk after its
        # first looks, so a full budget of kept lines no longer lengthens every collection
        # (at 512 ranks a full one took 270 ms of the event loop; bench/tui.py;
        # docs/BENCHMARKS.md, "The view").
        self.chunks.append((ts, node, journal, tuple(lines), 0))
        self.count += len(lines)
        self.per_node[node] = self.per_node.get(node, 0) + 1
        cost = line_cost(lines)
        self.costs.append(cost)
        self.cost += cost
        freed = self.drop_front(self.count - self.cap) if self.count > self.cap else 0
        if self.budget is not None:
            self.budget.charge(cost - freed)

    def drop_front(self, excess: int) -> int:
        """Drop the oldest ``excess`` lines; the bytes freed."""
        chunks, freed = self.chunks, 0
        while excess > 0 and chunks:
            old_ts, old_node, old_journal, old_lines, first = chunks[0]
            if excess >= len(old_lines):
                chunks.popleft()
                gone = len(old_lines)
                freed += self.costs.popleft()
                self.evicted[old_node] = (old_journal, old_ts)
                self.per_node[old_node] -= 1
            else:
                gone = excess
                cut = line_cost(old_lines[:gone])
                freed += cut
                self.costs[0] -= cut
                chunks[0] = (old_ts, old_node, old_journal, old_lines[gone:], first + gone)
            self.count -= gone
            excess -= gone
        self.cost -= freed
        return freed

    def drop_oldest_cost(self, cost: int, keep: int) -> None:
        """Free about ``cost`` bytes from the front, keeping at least ``keep`` lines; the
        budget is told (it asked)."""
        spare = self.count - keep
        if spare <= 0 or not self.count:
            return
        per_line = self.cost / self.count
        freed = self.drop_front(min(spare, int(cost / per_line) + 1))
        self.budget.used -= freed

    def floor(self, node: str, start: int = 0) -> tuple:
        """``(position, edge)``: from which position on this stream's lines from ``node`` are
        all kept (None: unknown), and the time of the newest line dropped (None: none was).

        ``start``: where the console's data from that node began (0 unless resumed).
        """
        if self.per_node.get(node):
            for ts, chunk_node, journal, _lines, first in self.chunks:
                if chunk_node == node:
                    if first > 0:  # the front of this record went: same record, same time
                        return (None if journal is None else (journal, first)), ts
                    if node in self.evicted:
                        return (None if journal is None else (journal, 0)), \
                            self.evicted[node][1]
                    return (start, 0), None
        if node in self.evicted:
            journal, ts = self.evicted[node]
            return (None if journal is None else (journal, AFTER_RECORD)), ts
        return (start, 0), None

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for chunk in self.chunks:
            yield from chunk[3]

    def __getitem__(self, i: int) -> str:
        if i != -1:
            raise IndexError("Kept supports [-1] only; iterate for the rest")
        return self.chunks[-1][3][-1]

    def newest_position(self) -> tuple | None:
        """``(node, journal, index)`` of the newest kept line; None with none (or no positions)."""
        if not self.chunks:
            return None
        _ts, node, journal, lines, first = self.chunks[-1]
        return None if journal is None else (node, journal, first + len(lines) - 1)


STEP_MARKS = 256  # a rank's newest steps whose line is known (aligning panes by step)


class StepMarks:
    """Where a rank's steps are in its log: for its newest steps (``cap`` to twice that), the
    position of its newest line when the step's metric came (the metric follows the line it
    was read from in the journal: agent/supervisor/recorder.py). Side-by-side log panes align
    on them (console/tui/align.py). Steps read from one record share its last line. Arrays:
    at 512 ranks a full set is a few MB.
    """

    __slots__ = ("steps", "journals", "indexes", "nodes", "cap")

    def __init__(self, cap: int = STEP_MARKS):
        self.steps, self.journals, self.indexes = array("q"), array("q"), array("q")
        self.nodes: list[str] = []
        self.cap = cap

    def mark(self, step, position: tuple | None) -> None:
        if position is None or not isinstance(step, int) or isinstance(step, bool):
            return
        node, journal, index = position
        if self.steps and self.steps[-1] == step:  # a progress bar's step said again
            self.journals[-1], self.indexes[-1], self.nodes[-1] = journal, index, node
            return
        self.steps.append(step)
        self.journals.append(journal)
        self.indexes.append(index)
        self.nodes.append(node)
        if len(self.steps) > 2 * self.cap:
            for kept in (self.steps, self.journals, self.indexes, self.nodes):
                del kept[:self.cap]

    def __iter__(self):
        """``(step, (node, journal, index))``, oldest first."""
        for step, node, journal, index in zip(self.steps, self.nodes, self.journals,
                                              self.indexes):
            yield step, (node, journal, index)

    def __len__(self) -> int:
        return len(self.steps)


class Series:
    """A rank's (step, loss) points in bounded memory for runs of any length.

    When full, every other point is dropped and from then on only every 2nd (4th, ...) new
    point is kept: the whole run's curve stays, coarser as it grows (64 KiB per rank). The
    newest point is always part of the series.
    """

    __slots__ = ("steps", "values", "cap", "stride", "_skip", "last")

    def __init__(self, cap: int = POINTS_PER_RANK):
        self.steps = array("q")
        self.values = array("d")
        self.cap = cap
        self.stride = 1
        self._skip = 0
        self.last: tuple[int, float] | None = None

    def append(self, point: tuple[int, float]) -> None:
        """Keep ``(step, value)``; a value that is not finite (a diverged loss) is not a point
        (the chart, the report's SVG and every reader of the series take finite points only)."""
        if not math.isfinite(point[1]):
            return
        self.last = (int(point[0]), float(point[1]))
        self._skip += 1
        if self._skip < self.stride:
            return
        self._skip = 0
        self.steps.append(int(point[0]))
        self.values.append(float(point[1]))
        if len(self.steps) >= self.cap:
            self.steps, self.values = self.steps[::2], self.values[::2]
            self.stride *= 2

    def _last_extra(self) -> bool:
        return self.last is not None and (not self.steps or self.steps[-1] != self.last[0])

    def __len__(self) -> int:
        return len(self.steps) + self._last_extra()

    def __iter__(self):
        yield from zip(self.steps, self.values)
        if self._last_extra():
            yield self.last

    def __getitem__(self, i: int) -> tuple[int, float]:
        if i == -1 and self.last is not None:
            return self.last
        return self.steps[i], self.values[i]
