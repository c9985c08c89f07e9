"""Goodput: where every second of a run went, and what each incident cost, from its journals
alone (docs/GOODPUT.md says how each bucket is counted, from which records, on which clock).

:class:`Goodput` is fed every journal record's meta as it is read, the nodes' (``add(node,
meta)``) and the judge's (``add(None, meta)``), in any order between journals and in journal
order within one; :meth:`Goodput.report` says ``{wall_s, goodput, buckets, incidents,
work_at_risk_gpu_h}``. The run's judge feeds it live (agent/judge/judge.py) and writes its report
into its folder; a console feeds it as it replays (console/run/link.py).

Bounded and incremental: a rank's steps are kept as segments of contiguous stepping
(agent/rules/goodput_steps.py), never a step each; the judge's events are reduced into incidents
and waits as they come; checkpoint saves, waits and incidents beyond MAX_SPANS/MAX_INCIDENTS are
folded into the buckets' totals. A report reads ranks x segments + incidents + spans, no step.

Times: the judge's records are on the judge host's clock, each node's on its own. A node's
records are put on the judge's clock by the offset its ranks' stalls show (the judge's
``stalled`` event says a rank's last step came ``idle_s`` before it; the node's own record of
that step has the host's time); with no such event, a node's clock is taken as it is.
Plain data, no I/O, no threads; standard library only; Python >= 3.9.
"""

from .goodput_steps import NO_STEP, RankSteps
from .kinds import finite, integer

BUCKETS = ("start-up", "productive", "rendezvous", "checkpoint", "stalled", "recovery",
           "redone", "end")
# a second claimed by two buckets counts in the first of these (productive: in none)
PRIORITY = ("start-up", "end", "stalled", "recovery", "redone", "rendezvous", "checkpoint")
ACTIONS = ("restart", "stop", "restart_all", "cordon")  # a judge `policy` event that acts
ACTED = ("restarted", "surgery", "ending")  # judge events that are an action themselves
STEP_MOST = 1 << 62  # a step beyond this is a host's nonsense (and no 64-bit slot holds 2**70)
MAX_SPANS = 256  # checkpoint saves and rendezvous waits kept each; older ones are folded
MAX_INCIDENTS = 256  # incidents kept (and listed); older ones are folded
MAX_STALLS = 256  # the judge's newest `stalled` events kept for the nodes' clock offsets
MAX_CKPTS = 64  # checkpoint lines' steps kept for work at risk (at and above the complete one)


class _Stall:
    """A judge's ``stalled`` event as a node's clock offset needs it: the judge's time of the
    rank's last step (``at``) and the host's time of that step (``host``, once a record gives
    it: the one nearest ``at``)."""

    __slots__ = ("rank", "step", "at", "host", "node")

    def __init__(self, rank, step, at):
        self.rank, self.step, self.at = rank, step, at
        self.host = self.node = None

    def seen(self, node, ts):
        if self.host is None or abs(self.at - ts) < abs(self.at - self.host):
            self.host, self.node = ts, node


class Goodput:
    """Goodput's state, updated as records come (see the module docstring): bounded however
    long the run (docs/GOODPUT.md, "Cost")."""

    def __init__(self):
        self.files = {}  # (node, fid) -> rank
        self.ranks = {}  # rank -> RankSteps
        self.high = NO_STEP  # the run's highest step so far
        self.last = {}  # (node, fid) -> (host ts, step) of its newest step record
        self.saves = []  # [node, start, end] host times: step records to their checkpoint lines
        self.save_of = {}  # node -> its newest save (a list of self.saves, merged in place)
        self.ckpt_ts = {}  # step -> earliest (node, host ts) of its checkpoint line
        self.complete = None  # newest complete checkpoint's step
        self.launched = {}  # node -> host time of its first launch
        self.ended = {}  # node -> host time of its newest `ended`
        # the judge's events, its clock, reduced as they come
        self.judge_start = None  # its earliest `judge` event
        self.judge_last = None  # its newest event's time
        self.run_ended = None  # its newest `run_ended`
        self.stalls = []  # _Stall, the newest MAX_STALLS
        self.pending = {}  # (rank, step) -> [_Stall] a later record of that step may date
        self.closed = []  # incidents over: (marks, back)
        self.cur = None  # the incident going on
        self.waits = []  # (since, until) of the judge's rendezvous waits
        self.wait_since = None
        self.folded = dict.fromkeys(BUCKETS, 0.0)  # seconds of spans no longer kept
        self.left_out = 0  # incidents folded, not listed

    def add(self, node, meta):
        """One journal record's meta: ``node`` the node whose journal it is, None the judge's."""
        kind = meta.get("k")
        if kind == "data" or kind == "sample" or kind == "telemetry":
            return  # most of a journal: nothing goodput reads
        ts = meta.get("ts")
        if node is None:
            if kind == "event" and _num(ts):
                self._judge(meta, ts)
            return
        if kind == "metric":
            step = meta.get("step")
            fid = meta.get("f")
            rank = self.files.get((node, fid))
            if not (_num(ts) and _step(step)) or rank is None:
                return
            rs = self.ranks.get(rank)
            if rs is None or rs.node != node:
                rs = self.ranks[rank] = RankSteps(node)
            rs.add(ts, step, self.high)
            if step > self.high:
                self.high = step
            self.last[(node, fid)] = (ts, step)
            if self.pending:
                for stall in self.pending.get((rank, step), ()):
                    stall.seen(node, ts)
        elif kind == "file":
            if isinstance(meta.get("rank"), int):
                self.files[(node, meta.get("f"))] = meta["rank"]
        elif kind == "ckpt" and _num(ts):
            before = self.last.get((node, meta.get("f")))
            if before is not None and before[1] == meta.get("step") and ts > before[0]:
                self._save(node, before[0], ts)
            step = meta.get("step")
            if isinstance(step, int) and (step not in self.ckpt_ts or ts < self.ckpt_ts[step][1]):
                self._ckpt(step, node, ts)
        elif kind == "ckpt_done" and meta.get("complete") and isinstance(meta.get("step"), int):
            self.complete = max(meta["step"], self.complete or meta["step"])
            for step in [s for s in self.ckpt_ts if s < self.complete]:
                del self.ckpt_ts[step]
        elif kind == "event" and _num(ts):
            what = meta.get("what")
            if what == "launched":
                self.launched.setdefault(node, ts)
            elif what == "ended":
                self.ended[node] = ts

    def add_all(self, node, recs):
        """The records of a ``journal`` message (``[meta, data]`` each): :meth:`add` each meta."""
        for rec in recs:
            if rec and isinstance(rec[0], dict):
                self.add(node, rec[0])

    def _save(self, node, a, b):
        """A checkpoint save on ``node``'s clock: one span with its node's newest when they
        overlap (its ranks save at once), the oldest folded beyond MAX_SPANS."""
        prev = self.save_of.get(node)
        if prev is not None and a <= prev[2] and b >= prev[1]:
            prev[1], prev[2] = min(prev[1], a), max(prev[2], b)
            return
        prev = self.save_of[node] = [node, a, b]
        self.saves.append(prev)
        if len(self.saves) > MAX_SPANS:
            old = self.saves.pop(0)
            self._fold("checkpoint", old[2] - old[1])
            if self.save_of.get(old[0]) is old:
                del self.save_of[old[0]]

    def _ckpt(self, step, node, ts):
        if self.complete is not None and step < self.complete:
            return
        self.ckpt_ts[step] = (node, ts)
        if len(self.ckpt_ts) > MAX_CKPTS:
            del self.ckpt_ts[min(s for s in self.ckpt_ts if s != self.complete)]

    def _fold(self, bucket, seconds):
        self.folded[bucket] += max(0.0, seconds)

    # -- the judge's events, as they come ------------------------------------------------------
    def _judge(self, ev, ts):
        what = ev.get("what")
        self.judge_last = ts if self.judge_last is None else max(self.judge_last, ts)
        if what == "judge":
            self.judge_start = ts if self.judge_start is None else min(self.judge_start, ts)
        elif what == "run_ended":
            self.run_ended = ts if self.run_ended is None else max(self.run_ended, ts)
        elif what == "waiting" and self.wait_since is None:
            self.wait_since = ts - (ev["waited_s"] if _num(ev.get("waited_s")) else 0.0)
        elif what == "waiting over" and self.wait_since is not None:
            self.waits.append((self.wait_since, ts))
            self.wait_since = None
            if len(self.waits) > MAX_SPANS:
                since, until = self.waits.pop(0)
                self._fold("rendezvous", until - since)
        if what == "stalled":
            self._stalled(ev, ts)
        self._incident(ev, ts, what)

    def _stalled(self, ev, ts):
        """A ``stalled`` event kept for its node's clock offset: its step's host time now, or
        when a record of it comes."""
        rank, step = _int(ev.get("rank")), ev.get("step")
        if not _num(ev.get("idle_s")) or rank is None or not _step(step):
            return
        stall = _Stall(rank, step, ts - ev["idle_s"])
        rs = self.ranks.get(rank)
        if rs is not None:
            for host in rs.times_of(step):
                stall.seen(rs.node, host)
        self.stalls.append(stall)
        self.pending.setdefault((rank, step), []).append(stall)
        if len(self.stalls) > MAX_STALLS:
            old = self.stalls.pop(0)
            waiting = self.pending[(old.rank, old.step)]
            waiting.remove(old)
            if not waiting:
                del self.pending[(old.rank, old.step)]

    def _incident(self, ev, ts, what):
        """Each stall (its ranks' ``stalled`` to every one ``stepping`` again) or action with
        no stall before it (a restart, a cordon): one incident, as the judge's events come."""
        cur = self.cur
        if what == "stalled":
            if cur is None:
                fault = ts - (ev["idle_s"] if _num(ev.get("idle_s")) else 0.0)
                cur = self.cur = {"at": fault, "what": "stall", "node": _name(ev.get("node")),
                                  "rank": _int(ev.get("rank")), "step": _int(ev.get("step")),
                                  "seen": ts, "verdict": None, "acted": None, "action": None,
                                  "waiting": set()}
            _hold(cur["waiting"], ev.get("rank"))
        elif cur is not None and what == "verdict" and cur["verdict"] is None:
            cur["verdict"] = ts
            suspects = (ev.get("verdict") or {}).get("suspects") or []
            if suspects and isinstance(suspects[0], dict):
                cur["node"] = _name(suspects[0].get("node"))
                cur["rank"] = _int(suspects[0].get("rank"))
        elif _acts(ev):
            if cur is None:  # an action with no stall before it: a crash or an operator's
                # every rank known so far must step again (ranks known later: not waited for)
                cur = self.cur = {"at": ts, "what": _kind(ev), "node": _name(ev.get("node")),
                                  "rank": None, "step": None, "seen": None, "verdict": None,
                                  "acted": None, "action": None, "waiting": set(self.ranks)}
            if cur["acted"] is None:
                cur["acted"], cur["action"] = ts, _kind(ev)
                cur["node"] = cur["node"] or _name(ev.get("node"))
        elif cur is not None and what == "stepping":
            _drop(cur["waiting"], ev.get("rank"))
            if not cur["waiting"]:
                self.closed.append((cur, ts))
                self.cur = None
                if len(self.closed) > MAX_INCIDENTS:
                    self._fold_incident(*self.closed.pop(0))

    def _fold_incident(self, cur, back):
        """The oldest incident, no longer listed: its seconds kept in the buckets' totals."""
        spans = {b: [] for b in PRIORITY}
        self._closed(cur, back, _on(self.offsets()), spans, back)
        ends = [t for kept in spans.values() for span in kept for t in span] or [back]
        for bucket, seconds in _paint(spans, min(ends), max(ends)).items():
            if bucket != "productive":
                self._fold(bucket, seconds)
        self.left_out += 1

    # -- the reduction -------------------------------------------------------------------------
    def offsets(self):
        """node -> seconds to add to its host's times to put them on the judge's clock."""
        found = {}
        for stall in self.stalls:
            if stall.host is not None:
                found.setdefault(stall.node, []).append(stall.at - stall.host)
        return {node: sorted(d)[len(d) // 2] for node, d in found.items()}

    def report(self, now=None):
        """The run's goodput (module docstring); ``now``: the judge's clock now, for a run
        that goes on (its wall and work at risk end there), None for one that ended. O(ranks
        x their segments + incidents + spans kept): never a step's record."""
        off = self.offsets()
        on = _on(off)
        starts = [on(n, t) for n, t in self.launched.items()]
        if self.judge_start is not None:
            starts.append(self.judge_start)
        firsts = [on(rs.node, rs.first) for rs in self.ranks.values()]
        lasts = [on(rs.node, rs.last_ts) for rs in self.ranks.values()]
        start = min(starts or firsts or [None], key=lambda x: float("inf") if x is None else x)
        end_ts = self.run_ended
        if end_ts is None and self.ended and len(self.ended) >= len(self.launched):
            end_ts = max(on(n, t) for n, t in self.ended.items())
        ended = end_ts is not None
        if not ended:
            end_ts = now if now is not None else max(
                lasts + starts + ([self.judge_last] if self.judge_last is not None else [])
                or [0.0])
        if start is None:
            return _empty(ended)
        end_ts = max(end_ts, start)
        first = min(firsts) if firsts else None
        spans = {b: [] for b in PRIORITY}
        spans["start-up"].append((start, first if first is not None else end_ts))
        if ended and lasts:
            spans["end"].append((max(lasts), end_ts))
        incidents = [self._closed(cur, back, on, spans, end_ts) for cur, back in self.closed]
        if self.cur is not None:
            incidents.append(self._closed(self.cur, None, on, spans, end_ts))
        spans["rendezvous"] = list(self.waits)
        if self.wait_since is not None:
            spans["rendezvous"].append((self.wait_since, end_ts))
        spans["checkpoint"] = [(on(n, a), on(n, b)) for n, a, b in self.saves]
        buckets = _paint(spans, start, end_ts)
        for bucket, seconds in self.folded.items():
            if seconds:
                buckets[bucket] += seconds
                buckets["productive"] = max(0.0, buckets["productive"] - seconds)
        wall = end_ts - start
        risk = self._at_risk(on, first, end_ts)
        return {"wall_s": round(wall, 3), "ended": ended,
                "goodput": round(buckets["productive"] / wall, 4) if wall > 0 else None,
                "buckets": {b: round(s, 3) for b, s in buckets.items()},
                "incidents": incidents, "incidents_left_out": self.left_out,
                "ranks": len(self.ranks),
                "work_at_risk_gpu_h": None if risk is None else round(risk, 4),
                "clock": "judge" if self.judge_last is not None else "hosts"}

    def _at_risk(self, on, first, end_ts):
        """GPU-hours since the newest complete checkpoint's line (the first step without one)."""
        if self.complete is not None and self.complete in self.ckpt_ts:
            since = on(*self.ckpt_ts[self.complete])
        else:
            since = first
        if since is None:
            return None
        return len(self.ranks) * max(0.0, end_ts - since) / 3600.0

    def _closed(self, cur, back, on, spans, end_ts):
        """An incident's figures and spans: ``back`` when every rank stepped again (None:
        not yet, or never)."""
        fault, acted = cur["at"], cur["acted"]
        stop = acted if acted is not None else (back if back is not None else end_ts)
        if cur["what"] == "stall":
            spans["stalled"].append((fault, stop))
        if acted is not None:
            spans["recovery"].append((acted, back if back is not None else end_ts))
        redone, redo_until = self._redone(fault, acted, on)
        if back is not None and redo_until is not None:
            spans["redone"].append((back, redo_until))
        lost_s = ((back if back is not None else end_ts) - fault
                  + (max(0.0, redo_until - back) if back is not None and redo_until else 0.0))
        marks = [fault, cur["seen"], cur["verdict"], acted, back]
        return {"at": round(fault, 3), "what": cur["what"], "action": cur["action"],
                "node": cur["node"], "rank": cur["rank"], "step": cur["step"],
                "detect_s": _between(marks, 0, 1), "decide_s": _between(marks, 1, 2),
                "act_s": _between(marks, 2, 3), "recover_s": _between(marks, 3, 4),
                "steps_redone": redone,
                "gpu_hours_lost": round(len(self.ranks) * max(0.0, lost_s) / 3600.0, 5)}

    def _redone(self, fault, acted, on):
        """(steps redone, the time the run's steps passed the fault's again) after ``acted``:
        the newest step before the fault, less the first any rank made after the action."""
        if acted is None:
            return 0, None
        top, first_after, passed = None, None, None
        for rank, rs in self.ranks.items():
            r_top, r_first = rs.around(on(rs.node, 0.0), fault, acted)
            if r_top is not None:
                top = r_top if top is None else max(top, r_top)
            if r_first is not None:
                first_after = r_first if first_after is None else min(first_after, r_first)
        if top is None or first_after is None:
            return 0, None
        for rs in self.ranks.values():
            t = rs.passed(on(rs.node, 0.0), acted, top)
            if t is not None:
                passed = t if passed is None else min(passed, t)
        return max(0, top - first_after + 1), passed


def _on(off):
    """A node's host time put on the judge's clock by its offset."""
    def on(node, ts):
        return ts + off.get(node, 0.0)
    return on


def _hold(waiting, rank):
    try:
        waiting.add(rank)
    except TypeError:  # a host's rank that is no key (a list): no rank to wait for
        pass


def _drop(waiting, rank):
    try:
        waiting.discard(rank)
    except TypeError:
        pass


def _paint(spans, start, end):
    """Seconds of each bucket between ``start`` and ``end``: a second two spans claim counts in
    the earlier bucket of PRIORITY, one no span claims is productive; they add up to the wall."""
    marks = []
    for i, name in enumerate(PRIORITY):
        for a, b in spans[name]:
            a, b = max(a, start), min(b, end)
            if b > a:
                marks.append((a, 1, i))
                marks.append((b, -1, i))
    marks.sort()
    out = dict.fromkeys(BUCKETS, 0.0)
    open_ = [0] * len(PRIORITY)
    at = start
    for t, delta, i in marks:
        if t > at:
            top = next((j for j, n in enumerate(open_) if n), None)
            out["productive" if top is None else PRIORITY[top]] += t - at
            at = t
        open_[i] += delta
    out["productive"] += max(0.0, end - at)
    return out


def _acts(ev):
    what = ev.get("what")
    return (what == "policy" and ev.get("action") in ACTIONS) or what in ACTED


def _kind(ev):
    what = ev.get("what")
    if what == "surgery":
        return "cordon"
    if what == "ending":
        return "stop"
    if what == "restarted":
        return "restart"
    return str(ev.get("action"))


def _between(marks, a, b):
    if marks[a] is None or marks[b] is None:
        return None
    return round(max(0.0, marks[b] - marks[a]), 3)


def _empty(ended):
    return {"wall_s": 0.0, "ended": ended, "goodput": None,
            "buckets": dict.fromkeys(BUCKETS, 0.0), "incidents": [], "ranks": 0,
            "work_at_risk_gpu_h": None, "clock": "hosts"}


def _name(value):
    """A node's name from a judge's event: a string (the console cleans it to show it)."""
    return value[:200] if isinstance(value, str) else None


def _int(value):
    return value if integer(value) else None


def _step(value):
    """A step a rank's record may carry: a whole number its array holds (a host's JSON may
    hold any integer: 2**70 would not fit a 64-bit slot)."""
    return integer(value) and abs(value) < STEP_MOST


_num = finite  # a host's JSON may hold NaN or Infinity, which Python reads
