"""Stragglers, continuously: which rank the others wait for, from the supervisors' periodic
samples of when each rank entered its newest collectives (agent/supervisor/ranksample.py). Plain data.

In a synchronous job every rank's step takes as long as the slowest rank's, so step lines
cannot name it; entry times can. Per sample tick (every node samples on the same wall-clock
tick), over the collectives every rank recorded:

- a rank's *lateness* in a collective is how long after the median rank it entered it;
  lateness under ``LATE_MIN_S`` is dropped (host clocks: offsets of a few ms are noise);
- its *share* is its summed lateness over the time those collectives span: the part of
  the run's time the other ranks spent waiting for it (0 for a rank nobody waits for).

A rank is a straggler when the median of its last ``WINDOW`` shares (at least ``MIN_TICKS``)
is above the median rank's by ``SHARE_MIN`` and by 5 x the MAD of all ranks' shares; it is
cleared when that margin falls under half of ``SHARE_MIN``. ``slowdown`` = 1 / (1 - share):
how much slower than the others the rank is (a rank 3x slower makes the others wait 2/3 of
the time: slowdown 3.0).
"""

from collections import deque
from statistics import median

from .kinds import whole

LATE_MIN_S = 0.005
MIN_COMMON = 8  # collectives every rank recorded, for a tick to count
WINDOW = 6
MIN_TICKS = 3
SHARE_MIN = 0.30  # the others wait for it 30% of the time (1.43x slower): a clean run on 2
# busy cores shows shares of 0.1-0.2 for every rank (docs/BENCHMARKS.md)
MAD_FACTOR = 5.0
HISTORY = 24  # shares kept a rank for the view's strip
# ticks waiting for their last node: when `attach` replays the journals one node after the
# other, the first node's newest ticks wait for the others' (its older ones are dropped)
PENDING = HISTORY
# ticks, ranks, sequence numbers, entry times in us: past this (in us, the year 148,000) a
# value is garbage (and sums of larger ones overflow a float)
WHOLE_MAX = 2 ** 62


def _times(rank):
    """{(pg, seq): entry time in us} of one rank of a sample, malformed rows skipped."""
    out = {}
    rows = rank.get("fr")
    for row in rows if isinstance(rows, list) else []:
        if (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)
                and _whole(row[1]) and _whole(row[2])):
            out[(row[0], row[1])] = row[2]
    return out


def _whole(value):
    return whole(value, WHOLE_MAX)


def shares(times):
    """Each rank's share of the time the others waited for it, over the collectives every
    rank recorded; None with fewer than ``MIN_COMMON`` of them or fewer than 3 ranks."""
    if len(times) < 3:
        return None
    common = set.intersection(*(set(t) for t in times.values()))
    if len(common) < MIN_COMMON:
        return None
    mids = {key: median(t[key] for t in times.values()) for key in common}
    span_s = (max(mids.values()) - min(mids.values())) / 1e6
    if span_s <= 0:
        return None
    out = {}
    for rank, t in times.items():
        late = ((t[key] - mids[key]) / 1e6 for key in common)
        out[rank] = min(0.95, sum(x for x in late if x >= LATE_MIN_S) / span_s)
    return out


def over_median(found):
    """Each rank's share above the median rank's, and the bar a straggler's must reach:
    ``SHARE_MIN`` and ``MAD_FACTOR`` x the MAD of all ranks' shares. Used here on each rank's
    sustained share and by the ``why`` verdict (agent/rules/verdict.py) on one sample's."""
    mid = median(found.values())
    mad = median(abs(s - mid) for s in found.values())
    return {rank: share - mid for rank, share in found.items()}, max(SHARE_MIN, MAD_FACTOR * mad)


class Stragglers:
    """Fed the ``sample`` records of every node; says which rank is a straggler."""

    def __init__(self):
        self._ticks = {}  # tick -> rank -> times
        self.history = {}  # rank -> its shares, newest last
        self.flagged = set()
        self.ticks = 0  # ticks reduced into shares so far: the view redraws when it grows

    def add(self, meta, world):
        """One node's sample; returns ``[(rank, kind, text)]`` events (``straggler``,
        ``straggler cleared``) once every rank of the world has reported that tick."""
        tick = meta.get("tick")
        if not _whole(tick) or not isinstance(meta.get("ranks"), list):
            return []
        mine = self._pending(tick)
        if mine is None:
            return []
        for rank in meta["ranks"]:
            if isinstance(rank, dict) and _whole(rank.get("rank")) and "fr" in rank:
                mine[rank["rank"]] = _times(rank)
        if world is None or not all(r in mine for r in range(world)):
            return []
        del self._ticks[tick]
        found = shares({r: mine[r] for r in range(world)})
        if found is None:
            return []
        for rank, share in found.items():
            self.history.setdefault(rank, deque(maxlen=HISTORY)).append(share)
        self.ticks += 1
        return self._decide()

    def _pending(self, tick):
        """The ranks heard of for ``tick`` so far; None for a tick older than every one kept
        when ``PENDING`` are kept (a node that never reported those: they are lost)."""
        if tick not in self._ticks and len(self._ticks) >= PENDING:
            oldest = min(self._ticks)
            if tick < oldest:
                return None
            del self._ticks[oldest]
        return self._ticks.setdefault(tick, {})

    def sustained(self, rank):
        """The median of the rank's newest ``WINDOW`` shares; None before ``MIN_TICKS``."""
        kept = list(self.history.get(rank, ()))[-WINDOW:]
        return median(kept) if len(kept) >= MIN_TICKS else None

    def slowdown(self, rank):
        share = self.sustained(rank)
        return None if share is None else round(1.0 / (1.0 - share), 2)

    def _decide(self):
        now = {r: s for r in self.history if (s := self.sustained(r)) is not None}
        if len(now) < 3:
            return []
        margins, bar = over_median(now)
        events = []
        for rank, share in sorted(now.items()):
            margin = margins[rank]
            if rank not in self.flagged and margin >= bar:
                self.flagged.add(rank)
                events.append((rank, "straggler", "rank %d is a straggler: the others wait "
                               "for it %.0f%% of the time (%.2fx slower)"
                               % (rank, share * 100, self.slowdown(rank))))
            elif rank in self.flagged and margin < SHARE_MIN / 2:
                self.flagged.discard(rank)
                events.append((rank, "straggler cleared", "rank %d keeps pace again" % rank))
        return events
