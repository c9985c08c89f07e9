"""Several nodes' streams printed in time order while their journals are replayed.

`rankdeck logs` and `attach --no-tui` subscribe to every node at once; each node replays its
journal from the start, so what arrives is one node's burst, then another's. TimeOrder holds
each item until no node still replaying can send an older one: a node that has items queued
cannot (a journal is in time order), so only the nodes with nothing queued are waited for,
each from the time of the last item it sent. A node is done once it has replayed what its
journal held when the command started; after that items pass at once (a live run).

``by_node``: each node's stream together, the nodes in their inventory order, instead.
Times are the hosts' clocks (each record's ``ts``); a node's own items never change order
(a time that goes backwards on one host is read as its previous one). Memory is what one node
has sent ahead of the slowest; plain data, no asyncio.
"""

from __future__ import annotations

import heapq
from typing import Callable, Hashable

EARLIEST = float("-inf")


class TimeOrder:
    def __init__(self, nodes: list[str], emit: Callable[[str], None], by_node: bool = False):
        self.emit = emit
        self.by_node = by_node
        self.index = {n: i for i, n in enumerate(nodes)}
        self.last = {n: EARLIEST for n in nodes}
        self.queued = {n: 0 for n in nodes}
        self.done: set[Hashable] = set()
        self._heap: list = []
        self._seq = 0

    def add(self, node: str | None, ts: float | None, text: str) -> None:
        """An item of ``node`` (None: the console's own, never waited for) at time ``ts``."""
        if node not in self.index:
            node = None
            self.done.add(None)
        ts = EARLIEST if ts is None else ts
        if node is not None:
            ts = self.last[node] = max(ts, self.last[node])
            self.queued[node] += 1
        self._seq += 1
        heapq.heappush(self._heap, (self._key(node, ts), self._seq, node, text))
        self._flush()

    def finish(self, node: str) -> None:
        """``node`` has replayed its journal: nothing older will come from it."""
        self.done.add(node)
        self._flush()

    def finish_all(self) -> None:
        self.done.update(self.index)
        self._flush()

    @property
    def holding(self) -> bool:
        return bool(self._heap)

    def _key(self, node: str | None, ts: float) -> tuple:
        return (self.index.get(node, -1) if self.by_node else 0, ts)

    def _flush(self) -> None:
        heap = self._heap
        bound = min((self._key(n, self.last[n]) for n in self.index
                     if n not in self.done and not self.queued[n]), default=None)
        while heap and (bound is None or heap[0][0] <= bound):
            _key, _seq, node, text = heapq.heappop(heap)
            if node is not None:
                self.queued[node] -= 1
                if not self.queued[node] and node not in self.done:
                    mine = self._key(node, self.last[node])
                    bound = mine if bound is None else min(bound, mine)
            self.emit(text)
