"""EntryWindow: the lines a log view holds, and per node the floor below which it holds none.

A log view (console/tui/logview.py) shows a window onto its source: the newest lines while it
follows, more while paused and scrolled back. The window keeps those entries
(console/lines/lines.py ``Entry``) oldest first, at most ``limit`` of them, and per node the *floor*:
the position from which it holds every line of its source from that node (None: unknown for
good, the agent gives no positions). Dropping the oldest entries moves the floors past them;
older lines fetched from before the floors go in front (console/model/scrollback.py).

``version`` changes whenever the floors move for another reason than a fetch that went in
whole: a Scrollback built on older floors must then be built again.

No asyncio, no Textual: the view draws, the window decides what is held.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

from .lines import Entry


def floor_after(entry: Entry) -> tuple | None:
    """The floor of a window whose oldest line of ``entry``'s node went just after it."""
    return None if entry.journal is None else (entry.journal, entry.index + 1)


class EntryWindow:
    """Entries of one source, oldest first, with a floor per node (see the module)."""

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque()
        self.floors: dict[str, tuple | None] = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def replace(self, entries: Iterable[Entry], floors: dict | None, limit: int) -> None:
        """Hold ``entries`` (a refill) with the floors they were taken at, newest ``limit``."""
        self.entries = deque(entries)
        self.floors = dict(floors or {})
        self.version += 1
        self.trim(limit)

    def add(self, entries: list[Entry], limit: int) -> int:
        """New lines after those held; returns how many of the oldest went to make room."""
        self.entries.extend(entries)
        return self.trim(limit)

    def prepend(self, entries: list[Entry], limit: int) -> int:
        """Older lines the floors already account for (the rest of a refill) in front;
        returns how many of the oldest did not fit."""
        self.entries.extendleft(reversed(entries))
        return self.trim(limit)

    def prepend_older(self, entries: list[Entry], floors: dict, limit: int) -> list[Entry]:
        """Lines fetched from before the floors, in front; returns those taken.

        ``floors``: the fetcher's, below what it handed out. Only the newest entries that fit
        under ``limit`` are taken; the floors then stop above the rest (and ``version``
        changes, as they are not the fetcher's any more).
        """
        room = max(0, limit - len(self.entries))
        floors = dict(floors)
        if room < len(entries):
            cut, entries = entries[:len(entries) - room], entries[len(entries) - room:]
            for entry in cut:  # oldest first: the newest left out of each node wins
                floors[entry.node] = floor_after(entry)
            self.version += 1
        self.floors.update(floors)
        self.entries.extendleft(reversed(entries))
        return entries

    def trim(self, limit: int) -> int:
        """Drop the oldest entries beyond ``limit``, moving their nodes' floors past them;
        returns how many went."""
        entries, floors = self.entries, self.floors
        excess = len(entries) - limit
        if excess <= 0:
            return 0
        for _ in range(excess):
            entry = entries.popleft()
            if floors.get(entry.node, ()) is not None:  # None: unknown for good
                floors[entry.node] = floor_after(entry)
        self.version += 1
        return excess
