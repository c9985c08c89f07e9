"""Bounded buffers of a run: a stream's newest lines (Kept) and a rank's loss curve (Series).

RunState (console/state.py) holds one of each per rank; they keep memory flat however long
the run. No asyncio, no Textual.
"""

from __future__ import annotations

from array import array
from collections import deque

from .lines import AFTER_RECORD

POINTS_PER_RANK = 4096


class Kept:
    """A stream's newest ``cap`` lines, in chunks as they came: one per journal record.

    A chunk is ``(ts, node, journal, lines, first)``: ``first`` is the index in its record of
    ``lines[0]`` (above 0 once the front of the chunk was dropped). Lines go from the front
    only, so what is kept from a node is everything of this stream from some position on, and
    :meth:`floor` says which. Behaves as a sequence of line texts for simple readers.
    """

    __slots__ = ("chunks", "count", "cap", "evicted", "per_node")

    def __init__(self, cap: int):
        self.chunks: deque = deque()
        self.count = 0
        self.cap = cap
        self.evicted: dict[str, tuple] = {}  # node -> newest dropped record's (offset, time)
        self.per_node: dict[str, int] = {}  # node -> chunks kept from it

    def add(self, ts: float, node: str, journal: int | None, lines: list[str]) -> None:
        if not lines:
            return
        chunks = self.chunks
        chunks.append((ts, node, journal, lines, 0))
        self.count += len(lines)
        self.per_node[node] = self.per_node.get(node, 0) + 1
        while self.count > self.cap:
            old_ts, old_node, old_journal, old_lines, first = chunks[0]
            excess = self.count - self.cap
            if excess >= len(old_lines):
                chunks.popleft()
                self.count -= len(old_lines)
                self.evicted[old_node] = (old_journal, old_ts)
                self.per_node[old_node] -= 1
            else:
                chunks[0] = (old_ts, old_node, old_journal, old_lines[excess:], first + excess)
                self.count -= excess

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
