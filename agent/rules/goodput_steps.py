"""A rank's steps as goodput keeps them (agent/rules/goodput.py): not every step, but its
contiguous stepping as segments, so what a rank costs stays bounded however long the run.

A segment is a run of step records whose steps rise (or repeat) and whose times follow each other without a
long gap: its first and last record (time and step), its count, its highest step and, for the
steps redone after a resume, the time the segment first passed the highest step its rank (and
the run) had made before it began, and, for a segment resumed below its rank's highest step, the
times of its last :data:`MAX_REDO` steps up to the one that passes it again. A record whose step does not rise (a restart resumed lower), or
that comes after a gap longer than :data:`GAP_FACTOR` times the segment's mean step time (and
:data:`GAP_MIN`), begins a new segment; so a stall's last step ends a segment, and the judge's
``stalled`` event finds that step's time exactly. A rank keeps at most :data:`MAX_SEGMENTS`
segments: beyond, the two whose gap is the shortest are merged (their inner figures are then
estimated between their ends; a restart's and a stall's ends are kept longest).

Plain data, no I/O; standard library only; Python >= 3.9.
"""

from math import floor

MAX_REDO = 8  # a resumed segment's newest steps kept (with their times) until it passes its
# rank's highest: the steps the redone time ends at
MAX_SEGMENTS = 32  # a rank's segments kept; beyond, two neighbours are merged into one
GAP_MIN = 0.5  # seconds: a shorter gap between two steps never begins a new segment
GAP_FACTOR = 2.0  # a gap longer than this many mean steps of its segment begins a new one
NO_STEP = -(1 << 63)  # below any step a record may carry (agent/rules/goodput.py STEP_MOST)


class Segment:
    """Steps s0..s1 at host times t0..t1 (``n`` records, ``top`` the highest); ``hi``/``ghi``:
    the highest step of the rank/of the run before it began; ``pass_t``/``gpass_t``: the time
    of its first record above each (None: not yet)."""

    __slots__ = ("t0", "s0", "t1", "s1", "n", "top", "hi", "pass_t", "ghi", "gpass_t", "gap",
                 "gap_t", "gap_s", "u1", "redo")

    def __init__(self, ts, step, hi, ghi):
        self.t0 = self.t1 = self.u1 = ts  # u1: its last step's first record
        self.s0 = self.s1 = self.top = step
        self.n = 1
        self.hi, self.ghi = hi, ghi
        self.pass_t = ts if step > hi else None
        self.gpass_t = ts if step > ghi else None
        self.gap, self.gap_t, self.gap_s = 0.0, ts, step  # its longest gap, and the record before
        # resumed below its rank's highest step: (step, time) of each step until it passes it
        self.redo = [(step, ts)] if step <= hi else None

    def step_at(self, t, off=0.0):
        """The step of its last record at or before ``t`` (its times put on the judge's clock
        by ``off``, added as goodput adds it: the same rounding); estimated inside."""
        if self.t1 + off <= t:
            return self.top
        if self.u1 + off <= t:  # its last step's first record, not its newest: a step printed twice
            return self.s1
        t_a, s_a = self.t0, self.s0  # the newest record known exactly before t, then between
        for step, ts in reversed(self.redo or ()):
            if ts + off <= t:
                t_a, s_a = ts, step
                break
        t -= off
        if self.u1 <= t_a or t <= t_a:
            return s_a
        return min(self.s1 - 1, s_a + int(floor((t - t_a) / (self.u1 - t_a) * (self.s1 - s_a))))

    def time_of(self, step):
        """The host time of its first record at or above ``step`` (estimated inside)."""
        if step <= self.s0 or self.s1 <= self.s0:
            return self.t0
        return self.t0 + (min(step, self.s1) - self.s0) / (self.s1 - self.s0) * (self.t1 - self.t0)


class RankSteps:
    """One rank's step records on ``node``'s clock, as segments (the module docstring)."""

    __slots__ = ("node", "first", "last_ts", "high", "segs", "pace")

    def __init__(self, node):
        self.node = node
        self.first = None  # host time of its first step record
        self.last_ts = None  # and of its newest, in journal order
        self.high = NO_STEP  # its highest step
        self.segs = []
        self.pace = float("inf")  # its last segment's mean step time (a first step: any gap)

    def add(self, ts, step, run_high):
        """A step record (in journal order); ``run_high``: the run's highest step so far."""
        segs = self.segs
        if segs:
            seg = segs[-1]
            gap = ts - seg.t1
            pace = (seg.t1 - seg.t0) / (seg.s1 - seg.s0) if seg.s1 > seg.s0 else self.pace
            if step >= seg.s1 and gap >= 0 and (gap <= GAP_MIN or gap <= GAP_FACTOR * pace):
                if gap > seg.gap:  # a stall its ranks came out of by themselves, likely
                    seg.gap, seg.gap_t, seg.gap_s = gap, seg.t1, seg.s1
                if step > seg.s1:
                    seg.u1 = ts
                    redo = seg.redo
                    if redo is not None and redo[-1][0] <= seg.hi:
                        redo.append((step, ts))
                        if len(redo) > MAX_REDO:
                            del redo[0]
                seg.t1, seg.s1, seg.n = ts, step, seg.n + 1
                if step > seg.top:
                    seg.top = step
                if seg.pass_t is None and step > seg.hi:
                    seg.pass_t = ts
                if seg.gpass_t is None and step > seg.ghi:
                    seg.gpass_t = ts
                self.last_ts = ts
                if step > self.high:
                    self.high = step
                return
            if seg.s1 > seg.s0:
                self.pace = (seg.t1 - seg.t0) / (seg.s1 - seg.s0)
        else:
            self.first = ts
        segs.append(Segment(ts, step, self.high, run_high))
        if len(segs) > MAX_SEGMENTS:
            _merge(segs)
        self.last_ts = ts
        if step > self.high:
            self.high = step

    def times_of(self, step):
        """Host times of its records of ``step`` that a segment keeps exactly (its ends, the
        record before its longest gap)."""
        out = []
        for seg in self.segs:
            if seg.gap_s == step and seg.gap_t != seg.t0:
                out.append(seg.gap_t)
            if seg.s0 == step:
                out.append(seg.t0)
            if seg.s1 == step:  # a step printed twice: its first and newest record
                out.extend(t for t in (seg.u1, seg.t1) if t != seg.t0)
        return out

    def around(self, off, fault, acted):
        """(the highest step of its records at or before ``fault``, the step of its first
        record after ``acted``), on the judge's clock (``off`` added to its host's times)."""
        top = first = None
        for seg in self.segs:
            a, b = seg.t0 + off, seg.t1 + off
            if b <= fault:
                top = seg.top if top is None or seg.top > top else top
                continue
            if a <= fault:  # stepping through the fault: the step it had reached then
                at = seg.step_at(fault, off)
                top = at if top is None or at > top else top
            if b > acted:
                first = seg.s0 if a > acted else min(seg.top, seg.step_at(acted, off) + 1)
                break
        return top, first

    def passed(self, off, acted, top):
        """The judge's time of its first record after ``acted`` above step ``top``: when it
        made a step it had not made before the fault (None: not yet)."""
        for seg in self.segs:
            b = seg.t1 + off
            if b <= acted or seg.top <= top:
                continue
            a = seg.t0 + off
            if a > acted:
                if seg.s0 > top:
                    return a
                redo = seg.redo or ()
                if redo and redo[0][0] <= top:  # kept from below top: the first above is exact
                    for step, ts in redo:
                        if step > top:
                            return ts + off
                if seg.hi == top and seg.pass_t is not None:
                    return seg.pass_t + off
                if seg.ghi == top and seg.gpass_t is not None:
                    return seg.gpass_t + off
            at = seg.time_of(top + 1) + off
            return at if at > acted else b
        return None


def _merge(segs):
    """Two neighbouring segments made one: of those where stepping went on (steps still rise),
    the two with the shortest gap between them (a restart's and a stall's ends are kept
    longest); with none, the two oldest (``top`` then holds their highest step)."""
    at, least = 0, None
    for i in range(len(segs) - 1):
        a, b = segs[i], segs[i + 1]
        if b.s0 > a.s1 and (least is None or b.t0 - a.t1 < least):
            at, least = i, b.t0 - a.t1
    a, b = segs[at], segs[at + 1]
    if b.gap > a.gap or b.t0 - a.t1 > a.gap:
        a.gap, a.gap_t, a.gap_s = max((b.gap, b.gap_t, b.gap_s), (b.t0 - a.t1, a.t1, a.s1))
    a.top = max(a.top, b.top)
    if a.pass_t is None and b.top > a.hi:
        a.pass_t = b.pass_t if b.pass_t is not None else b.t0
    if a.gpass_t is None and b.top > a.ghi:
        a.gpass_t = b.gpass_t if b.gpass_t is not None else b.t0
    a.t1, a.s1, a.n, a.u1 = b.t1, b.s1, a.n + b.n, b.u1
    del segs[at + 1]
