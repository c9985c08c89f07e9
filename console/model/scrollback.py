"""Log lines of a source: the newest from memory, older ones page by page from the nodes.

A source is a rank, a whole node merged or every rank merged (console/model/sources.py). Lines
come out as :class:`~console.lines.lines.Entry`, each with its *position* on its node - where its
record starts in the node's journal and which of the record's lines it is. Positions are
what makes scrolling back exact: a view keeps, per node, a *floor* - the position from
which it holds every line of its source from that node - and asks the node's agent
(``scrollback``) for what lies before it.

No asyncio or Textual here: :class:`Scrollback` is handed a ``fetch`` coroutine.
"""

from __future__ import annotations

import heapq
from typing import Awaitable, Callable

from ..lines.lines import Entry, split_lines
from .sources import fids_of, nodes_of, rank_of, streams_of
from .state import RunState

PAGE_BYTES = 256 * 1024  # log data asked of a node per page (a few thousand lines)
MAX_FETCHES = 16  # pages fetched by one Scrollback.older() call before it gives what it has

# fetch(node, fids, before, since) -> (records, start): RunController.scrollback
Fetch = Callable[[str, list, int, int], Awaitable[tuple[list, int]]]


def after(position: tuple) -> tuple:
    return (position[0], position[1] + 1)


def offset_before(position: tuple) -> int:
    """The journal offset below which every record holds lines before ``position`` (the
    position's own record too, when some of its lines come before it)."""
    return position[0] + 1 if position[1] > 0 else position[0]


def kept_lines(state: RunState, source: tuple, limit: int) -> tuple[list, dict]:
    """What a view that starts showing ``source`` is filled with: ``(entries, floors)``.

    The newest ``limit`` lines RunState keeps, oldest first and raw (not yet cleaned), merged
    across ranks and nodes by time (within a node by journal position), and for each node the
    floor from which the entries hold all of its lines (None: no positions, no scrolling back).
    """
    taken, floors = kept_chunks(state, source, limit)
    return entries_of(taken), floors


def kept_chunks(state: RunState, source: tuple, limit: int) -> tuple[list, dict]:
    """:func:`kept_lines` before its entries are made: ``(taken, floors)``, ``taken`` the
    chunks' lines to show, oldest first, for :func:`entries_of`. A pane switching source
    makes entries of the newest few hundred at once and of the rest after the screen shows
    them (a refill's 5,000 entries made at once were a young collection in the key press)."""
    nodes = nodes_of(state, source)
    streams = streams_of(state, source)
    # Per node, the position from which every stream of the source still has all its lines;
    # and the time of the newest line memory dropped: nothing older than it may be shown, or
    # a page read back later would hold lines newer than some shown (time order across nodes).
    cut: dict[str, tuple | None] = {}
    wall = float("-inf")
    for name in nodes:
        start = state.nodes[name].data_from
        floors = []
        for _r, kept in streams:
            position, edge = kept.floor(name, start)
            floors.append(position)
            if edge is not None and edge > wall:
                wall = edge
        cut[name] = None if None in floors else max(floors, default=(start, 0))
    wanted = set(nodes)
    for name, ns in state.nodes.items():  # nothing of this source there yet: all is to come
        if name not in wanted:
            cut[name] = (max(ns.journal_offset, ns.data_from), 0)

    def newest_chunks(rank, kept):
        """The stream's chunks of wanted nodes, newest first, cut at their node's floor.

        Merging whole chunks (one journal record: one time, one position, several lines)
        rather than lines keeps a refill of 5,000 lines to a few hundred heap steps."""
        for ts, node, journal, lines, first in reversed(kept.chunks):
            if node not in wanted:
                continue
            floor = cut[node]
            if floor is not None and journal is not None:
                if (journal, first + len(lines) - 1) < floor:
                    continue  # older than another stream of this node keeps: a gap
                if (journal, first) < floor:  # the floor is inside this record
                    drop = floor[1] - first
                    lines, first = lines[drop:], first + drop
            yield (ts or 0.0, -1 if journal is None else journal, node, rank, lines, first)

    heap = []
    gens = [newest_chunks(rank, kept) for rank, kept in streams]
    for i, gen in enumerate(gens):
        chunk = next(gen, None)
        if chunk is not None:
            heap.append(((-chunk[0], -chunk[1]), i, chunk))
    heapq.heapify(heap)
    taken = []  # (chunk, index of its first line taken)
    left_out = []  # (node, journal, index): the newest line of a chunk not (wholly) taken
    count = 0
    while heap and count < limit and heap[0][2][0] >= wall:
        _key, i, chunk = heapq.heappop(heap)
        lines = chunk[4]
        if len(lines) > limit - count:  # the limit falls inside this chunk
            skip = len(lines) - (limit - count)
            taken.append((chunk, skip))
            left_out.append((chunk[2], chunk[1], chunk[5] + skip - 1))
            count = limit
            break
        taken.append((chunk, 0))
        count += len(lines)
        nxt = next(gens[i], None)
        if nxt is not None:
            heapq.heappush(heap, ((-nxt[0], -nxt[1]), i, nxt))
    left_out.extend((c[2], c[1], c[5] + len(c[4]) - 1) for _k, _i, c in heap)
    floors = dict(cut)
    for node, journal, index in left_out:  # everything after them is shown
        if floors.get(node) is not None and journal >= 0:
            floors[node] = max(floors[node], after((journal, index)))
    taken.reverse()
    return taken, floors


def _as_is(line: str) -> str:
    return line


def entries_of(taken: list, show: Callable[[str], str] = _as_is) -> list[Entry]:
    """The entries of :func:`kept_chunks`'s chunks (or of a run of them), oldest first.

    ``show``: made of each raw line in the same pass (the view's cleaning and masking), so a
    refill makes each Entry once; by default the lines stay raw.
    """
    entries = []
    for (ts, journal, node, rank, lines, first), skip in taken:
        ts, journal = ts or None, None if journal < 0 else journal
        entries.extend([Entry(ts, node, rank, show(lines[x]), journal, first + x)
                        for x in range(skip, len(lines))])
    return entries


def split_newest(taken: list, count: int) -> tuple[list, list]:
    """``(older, newest)``: ``taken`` cut so that ``newest`` holds at least ``count`` lines
    (whole chunks: a record's lines stay together)."""
    lines = 0
    for i in range(len(taken) - 1, -1, -1):
        (_ts, _j, _n, _r, chunk_lines, _f), skip = taken[i]
        lines += len(chunk_lines) - skip
        if lines >= count:
            return taken[:i], taken[i:]
    return [], taken


def newest_positions(taken: list) -> dict:
    """Per node, the position ``(journal, index)`` of the newest line of ``taken``."""
    marks: dict = {}
    for (_ts, journal, node, _rank, lines, first), skip in taken:
        if journal >= 0 and len(lines) > skip:
            position = (journal, first + len(lines) - 1)
            if position > marks.get(node, (-1, -1)):
                marks[node] = position
    return marks


class Scrollback:
    """Fetches a source's lines older than a view's floors, as pages of entries to put in front.

    Per node: ``before`` is the position the next page ends at (at first the view's floor),
    ``pending`` what was read back but not handed out yet. With several nodes the pages are
    merged backwards by time: a line is handed out only once every node that may still hold
    something newer has been read back past it; within a node, strictly in position order, so
    that :attr:`floors` (the oldest position handed out per node) stays a floor of the view.
    """

    def __init__(self, state: RunState, source: tuple, floors: dict[str, tuple | None]):
        self.state = state
        self.source = source
        known = {n: f for n, f in floors.items() if f is not None and n in state.nodes}
        self.floors = dict(known)
        self.before = dict(known)
        self.unknown = sorted(n for n, f in floors.items() if f is None)  # agents without positions
        self.files = {n: fids_of(state, source, n) for n in known}
        self.done = {n for n, f in known.items() if f <= (self.files[n][1], 0)}
        self.fresh = set(known) - self.done  # before[n] is still the view's own floor
        self.low: dict[str, float] = {}  # node -> time of the oldest line read back from it
        self.pending: dict[str, list] = {n: [] for n in known}
        self.fetches = 0

    @property
    def exhausted(self) -> bool:
        """Nothing older is left on any node (that says where its lines are)."""
        return len(self.done) == len(self.floors) and not any(self.pending.values())

    async def older(self, fetch: Fetch) -> list:
        """The next entries older than everything handed out so far, oldest first.

        ``fetch(node, fids, before, since)`` returns the agent's ``(records, start)``. Returns [] only
        when :attr:`exhausted`, or after ``MAX_FETCHES`` pages turned up nothing of this source.
        If fetch raises, nothing handed out or pending is lost: call again.
        """
        for _ in range(MAX_FETCHES):
            waiting = [n for n in self.floors if n not in self.done]
            if not waiting:
                break
            unread = [n for n in waiting if n not in self.low]
            for node in unread or [max(waiting, key=lambda n: self.low[n])]:
                await self._read(node, fetch)
            out = self._hand_out()
            if out:
                return out
        return self._hand_out()

    def _hand_out(self) -> list:
        waiting = [self.low.get(n, float("inf")) for n in self.floors if n not in self.done]
        mark = max(waiting, default=float("-inf"))  # nothing unread is newer than this
        out = []
        pending = self.pending
        while True:
            tails = [n for n, lines in pending.items() if lines]
            if not tails:
                break
            node = max(tails, key=lambda n: pending[n][-1].ts)
            if pending[node][-1].ts < mark:
                break
            out.append(pending[node].pop())
        out.reverse()
        for entry in out:
            if entry.position < self.floors[entry.node]:
                self.floors[entry.node] = entry.position
        return out

    async def _read(self, node: str, fetch: Fetch) -> None:
        journal, index = self.before[node]
        fids, since = self.files[node]
        records, start = await fetch(node, fids, offset_before((journal, index)), since)
        self.fetches += 1
        entries = page_entries(self.state, node, records, (journal, index),
                               keep_partial=node not in self.fresh)
        self.fresh.discard(node)
        self.pending[node][:0] = entries
        if entries:
            self.low[node] = min(self.low.get(node, float("inf")), min(e.ts for e in entries))
        self.before[node] = (start, 0)
        if start <= 0:
            self.done.add(node)


def page_entries(state: RunState, node: str, records: list, before: tuple,
                 keep_partial: bool) -> list:
    """A page of ``scrollback`` records as entries before position ``before``, oldest first.

    Lines are cut as RunState cuts live data (console/lines/lines.py ``split_lines``). The piece after a file's last newline is the start of a line the view
    already holds when the page ends at the view's own floor (dropped), else a line of its own.
    """
    files = state.nodes[node].files
    partial: dict[int, tuple] = {}  # fid -> (text, ts, journal, index, rank)
    out = []
    for rec in records:
        meta = rec[0]
        text = rec[1] if len(rec) > 1 else ""
        fid, journal, ts = meta.get("f"), meta.get("j"), meta.get("ts") or 0.0
        if journal is None or journal >= offset_before(before):
            continue
        fi = files.get(fid)
        rank = None if fi is None else rank_of(fi.rank, fi.stream)
        head = partial.pop(fid, None)
        lines, rest = split_lines(head[0] if head else "", text, state.masker)
        limit = before[1] if journal == before[0] else len(lines)
        out.extend(Entry(ts, node, rank, line, journal, k)
                   for k, line in enumerate(lines[:limit]))
        if rest:
            partial[fid] = (rest, ts, journal, len(lines), rank)
    if keep_partial:
        out.extend(Entry(ts, node, rank, state.masker.mask(text), journal, k)
                   for (text, ts, journal, k, rank) in partial.values())
        out.sort(key=lambda e: e.position)
    return out

