"""The goodput reducer as it was before it kept segments (every step of every rank, the whole
report reduced again each time): a brute-force reference for tests/unit/test_goodput_reducer.py,
which feeds it and agent/rules/goodput.py the same records and compares every figure."""

from array import array

from agent.rules.goodput import (  # unchanged by the segments: kept once
    ACTED, ACTIONS, BUCKETS, PRIORITY, STEP_MOST, _acts, _between, _empty, _int, _kind, _name,
    _num, _paint, _step
)


class _Rank:
    __slots__ = ("node", "ts", "steps")

    def __init__(self, node):
        self.node = node
        self.ts = array("d")  # host time of each step record, in journal order
        self.steps = array("q")


class Goodput:
    """The records goodput needs, kept as they come (see the module docstring)."""

    def __init__(self):
        self.files = {}  # (node, fid) -> rank
        self.ranks = {}  # rank -> _Rank
        self.last = {}  # (node, fid) -> (host ts, step) of its newest step record
        self.saves = []  # (node, start, end) host times: a step record to its checkpoint line
        self.ckpt_ts = {}  # step -> earliest host time (node, ts) of its checkpoint line
        self.complete = None  # newest complete checkpoint's step
        self.launched = {}  # node -> host time of its first launch
        self.ended = {}  # node -> host time of its newest `ended`
        self.judge = []  # the judge's events, its clock

    def add(self, node, meta):
        """One journal record's meta: ``node`` the node whose journal it is, None the judge's."""
        kind = meta.get("k")
        if kind == "data" or kind == "sample" or kind == "telemetry":
            return  # most of a journal: nothing goodput reads
        ts = meta.get("ts")
        if node is None:
            if kind == "event" and _num(ts):
                self.judge.append(meta)
            return
        if kind == "metric":
            step = meta.get("step")
            fid = meta.get("f")
            rank = self.files.get((node, fid))
            if not (_num(ts) and _step(step)) or rank is None:
                return
            rs = self.ranks.get(rank)
            if rs is None or rs.node != node:
                rs = self.ranks[rank] = _Rank(node)
            rs.ts.append(ts)
            rs.steps.append(step)
            self.last[(node, fid)] = (ts, step)
        elif kind == "file":
            if isinstance(meta.get("rank"), int):
                self.files[(node, meta.get("f"))] = meta["rank"]
        elif kind == "ckpt" and _num(ts):
            before = self.last.get((node, meta.get("f")))
            if before is not None and before[1] == meta.get("step") and ts > before[0]:
                self.saves.append((node, before[0], ts))
            step = meta.get("step")
            if isinstance(step, int) and (step not in self.ckpt_ts or ts < self.ckpt_ts[step][1]):
                self.ckpt_ts[step] = (node, ts)
        elif kind == "ckpt_done" and meta.get("complete") and isinstance(meta.get("step"), int):
            self.complete = max(meta["step"], self.complete or meta["step"])
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

    # -- the reduction ---------------------------------------------------------------------
    def offsets(self):
        """node -> seconds to add to its host's times to put them on the judge's clock."""
        found = {}
        for ev in self.judge:
            if ev.get("what") != "stalled" or not _num(ev.get("idle_s")):
                continue
            rs = self.ranks.get(ev.get("rank"))
            if rs is None or ev.get("step") not in rs.steps:
                continue
            at = ev["ts"] - ev["idle_s"]
            # a step made twice (redone after a restart): the time nearer the judge's
            host = min((t for t, step in zip(rs.ts, rs.steps) if step == ev["step"]),
                       key=lambda t: abs(at - t))
            found.setdefault(rs.node, []).append(at - host)
        return {node: sorted(d)[len(d) // 2] for node, d in found.items()}

    def report(self, now=None):
        """The run's goodput (module docstring); ``now``: the judge's clock now, for a run
        that goes on (its wall and work at risk end there), None for one that ended."""
        off = self.offsets()

        def on(node, ts):
            return ts + off.get(node, 0.0)

        judge_ev = sorted(self.judge, key=lambda e: e["ts"])
        starts = [on(n, t) for n, t in self.launched.items()]
        starts += [e["ts"] for e in judge_ev if e.get("what") == "judge"]
        firsts = [on(rs.node, rs.ts[0]) for rs in self.ranks.values() if rs.ts]
        lasts = [on(rs.node, rs.ts[-1]) for rs in self.ranks.values() if rs.ts]
        start = min(starts or firsts or [None], key=lambda x: float("inf") if x is None else x)
        over = [e["ts"] for e in judge_ev if e.get("what") == "run_ended"]
        end_ts = over[-1] if over else (max(on(n, t) for n, t in self.ended.items())
                                        if self.ended and len(self.ended) >= len(self.launched)
                                        else None)
        ended = end_ts is not None
        if not ended:
            end_ts = now if now is not None else max(lasts + starts + [e["ts"] for e in judge_ev]
                                                     or [0.0])
        if start is None:
            return _empty(ended)
        end_ts = max(end_ts, start)
        first = min(firsts) if firsts else None
        spans = {b: [] for b in PRIORITY}
        spans["start-up"].append((start, first if first is not None else end_ts))
        if ended and lasts:
            spans["end"].append((max(lasts), end_ts))
        incidents = self._incidents(judge_ev, on, spans, end_ts)
        _waits(judge_ev, spans["rendezvous"], end_ts)
        spans["checkpoint"] = [(on(n, a), on(n, b)) for n, a, b in self.saves]
        buckets = _paint(spans, start, end_ts)
        wall = end_ts - start
        risk = self._at_risk(on, first, end_ts)
        return {"wall_s": round(wall, 3), "ended": ended,
                "goodput": round(buckets["productive"] / wall, 4) if wall > 0 else None,
                "buckets": {b: round(s, 3) for b, s in buckets.items()},
                "incidents": incidents, "ranks": len(self.ranks),
                "work_at_risk_gpu_h": None if risk is None else round(risk, 4),
                "clock": "judge" if self.judge else "hosts"}

    def _at_risk(self, on, first, end_ts):
        """GPU-hours since the newest complete checkpoint's line (the first step without one)."""
        if self.complete is not None and self.complete in self.ckpt_ts:
            since = on(*self.ckpt_ts[self.complete])
        else:
            since = first
        if since is None:
            return None
        return len(self.ranks) * max(0.0, end_ts - since) / 3600.0

    def _incidents(self, judge_ev, on, spans, end_ts):
        """Each stall (its ranks' ``stalled`` to every one ``stepping`` again) or action with
        no stall before it (a restart, a cordon): one incident; its spans into ``spans``."""
        out, cur = [], None
        for ev in judge_ev:
            what = ev.get("what")
            if what == "stalled":
                if cur is None:
                    fault = ev["ts"] - (ev["idle_s"] if _num(ev.get("idle_s")) else 0.0)
                    cur = {"at": fault, "what": "stall", "node": _name(ev.get("node")),
                           "rank": _int(ev.get("rank")), "step": _int(ev.get("step")),
                           "seen": ev["ts"],
                           "verdict": None, "acted": None, "action": None, "waiting": set()}
                cur["waiting"].add(ev.get("rank"))
            elif cur is not None and what == "verdict" and cur["verdict"] is None:
                cur["verdict"] = ev["ts"]
                suspects = (ev.get("verdict") or {}).get("suspects") or []
                if suspects and isinstance(suspects[0], dict):
                    cur["node"] = _name(suspects[0].get("node"))
                    cur["rank"] = _int(suspects[0].get("rank"))
            elif _acts(ev):
                if cur is None:  # an action with no stall before it: a crash or an operator's
                    cur = {"at": ev["ts"], "what": _kind(ev), "node": _name(ev.get("node")),
                           "rank": None, "step": None, "seen": None, "verdict": None,
                           "acted": None, "action": None, "waiting": set(self.ranks)}
                if cur["acted"] is None:
                    cur["acted"], cur["action"] = ev["ts"], _kind(ev)
                    cur["node"] = cur["node"] or _name(ev.get("node"))
            elif cur is not None and what == "stepping":
                cur["waiting"].discard(ev.get("rank"))
                if not cur["waiting"]:
                    out.append(self._closed(cur, ev["ts"], on, spans, end_ts))
                    cur = None
        if cur is not None:
            out.append(self._closed(cur, None, on, spans, end_ts))
        return out

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
        for rs in self.ranks.values():
            for ts, step in zip(rs.ts, rs.steps):
                t = on(rs.node, ts)
                if t <= fault:
                    top = step if top is None else max(top, step)
                elif t > acted:
                    first_after = step if first_after is None else min(first_after, step)
                    break
        if top is None or first_after is None:
            return 0, None
        for rs in self.ranks.values():
            for ts, step in zip(rs.ts, rs.steps):
                t = on(rs.node, ts)
                if t > acted and step > top:
                    passed = t if passed is None else min(passed, t)
                    break
        return max(0, top - first_after + 1), passed


def _waits(judge_ev, into, end_ts):
    """The judge's ``waiting`` (since ``waited_s`` before it) to its ``waiting over``."""
    since = None
    for ev in judge_ev:
        if ev.get("what") == "waiting" and since is None:
            since = ev["ts"] - (ev["waited_s"] if _num(ev.get("waited_s")) else 0.0)
        elif ev.get("what") == "waiting over" and since is not None:
            into.append((since, ev["ts"]))
            since = None
    if since is not None:
        into.append((since, end_ts))


