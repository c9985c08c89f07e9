"""`rankdeck goodput RUN`: where a run's time went and what each incident cost, in words.

The figures are agent/rules/goodput.py's (the same rule a run nobody watches is reduced by);
this module only says them: the lines `goodput` prints, the section `report` adds
(console/records/report.py), and the header's ``goodput 94%`` (console/tui/header.py).
docs/GOODPUT.md says how each bucket is counted.
"""

from __future__ import annotations

import time

from agent.rules import kinds
from agent.rules.goodput import BUCKETS, MAX_INCIDENTS

from ..lines.sanitize import clean
from ..lines.text import hms

FRESH_S = 90.0  # the judge's report of a run that goes on, older than this: replay the journals

LATENCIES = (("detect_s", "detect"), ("decide_s", "decide"), ("act_s", "act"),
             ("recover_s", "recover"))


def share(report: dict) -> str:
    """``94%``, or ``-`` before the run has a wall to share."""
    value = report.get("goodput")
    return "-" if value is None else "%.0f%%" % (100 * value)


def header_piece(report: dict) -> str | None:
    """``goodput 94%, at risk 0.3 GPU-h``; None before any rank stepped."""
    if report.get("goodput") is None or not report.get("ranks"):
        return None
    risk = report.get("work_at_risk_gpu_h")
    if risk is None or report.get("ended"):
        return "goodput %s" % share(report)
    return "goodput %s, at risk %s GPU-h" % (share(report), _gpu_h(risk))


def goodput_lines(report: dict) -> list[str]:
    """The text `rankdeck goodput RUN` prints."""
    wall = report.get("wall_s") or 0.0
    lines = ["goodput %s of %s%s" % (share(report), hms(wall),
                                     "" if report.get("ended") else " (the run goes on)")]
    for name, seconds in report["buckets"].items():
        lines.append("  %-11s %9s  %5.1f%%" % (name, hms(seconds),
                                               100 * seconds / wall if wall else 0.0))
    if report.get("work_at_risk_gpu_h") is not None and not report.get("ended"):
        lines.append("work at risk: %s GPU-h since the newest complete checkpoint"
                     % _gpu_h(report["work_at_risk_gpu_h"]))
    for inc in report["incidents"]:
        lines.append(incident_line(inc))
    if not report["incidents"]:
        lines.append("no incident")
    return lines


def incident_line(inc: dict) -> str:
    """``19:02:11 stall rank 2 on node2 step 7 -> restart: detect 6.2 s, decide 1.5 s, ...``"""
    who = " ".join(p for p in (
        "rank %s" % inc["rank"] if inc.get("rank") is not None else "",
        "on %s" % clean(str(inc["node"]), limit=64) if inc.get("node") else "",
        "step %s" % inc["step"] if inc.get("step") is not None else "") if p)
    parts = ["%s %.1f s" % (word, inc[key]) for key, word in LATENCIES
             if inc.get(key) is not None]
    redone = inc.get("steps_redone") or 0
    return "%s %s%s%s: %s; %d step%s redone, %s GPU-h lost" % (
        time.strftime("%H:%M:%S", time.localtime(inc["at"])), inc["what"],
        " " + who if who else "", " -> %s" % inc["action"] if inc.get("action") else "",
        ", ".join(parts) or "no latency known", redone, "" if redone == 1 else "s",
        _gpu_h(inc.get("gpu_hours_lost") or 0.0))


def report_section(report: dict, text) -> list[str]:
    """The ``## Goodput`` section of `rankdeck report` (``text``: its escaping of host text)."""
    lines = ["## Goodput", "", "Goodput **%s** of %s (docs/GOODPUT.md)." % (
        share(report), hms(report.get("wall_s") or 0.0)), "",
        "| bucket | time | share |", "| --- | --- | --- |"]
    wall = report.get("wall_s") or 0.0
    for name, seconds in report["buckets"].items():
        lines.append("| %s | %s | %.1f%% |" % (name, hms(seconds),
                                               100 * seconds / wall if wall else 0.0))
    lines.append("")
    for inc in report["incidents"]:
        lines.append("- " + text(incident_line(inc)))
    return lines + ([""] if report["incidents"] else [])


def _gpu_h(value: float) -> str:
    return "%.2f" % value if value >= 0.1 else "%.3f" % value


def from_judge(data) -> dict | None:
    """The report the run's judge wrote (serve's ``goodput`` answer: ``{"report", "written",
    "now"}``, docs/PROTOCOL.md), checked field by field as any host's data; None when there is
    none, it is no report, or the run goes on and it is older than FRESH_S (the judge writes one
    every 30 s: it is gone or stuck). ``source`` says ``judge``; ``as_of_s``: its age."""
    if not isinstance(data, dict) or not isinstance(data.get("report"), dict):
        return None
    written, now = data.get("written"), data.get("now")
    if not (_finite(written) and _finite(now)):
        return None
    try:
        out = _checked(data["report"])
    except (KeyError, TypeError, ValueError):
        return None
    age = max(0.0, now - written)
    if not out["ended"] and age > FRESH_S:
        return None
    out.update(source="judge", as_of_s=round(age, 1))
    return out


def _checked(rep: dict) -> dict:
    """A report from a host, rebuilt from the fields it must have, each of its kind."""
    incidents = rep["incidents"]
    if not isinstance(incidents, list) or len(incidents) > MAX_INCIDENTS:
        raise ValueError("incidents")
    ended = rep["ended"]
    if not isinstance(ended, bool):
        raise ValueError("ended")
    return {"wall_s": _num(rep["wall_s"]), "ended": ended,
            "goodput": _num(rep.get("goodput"), True),
            "buckets": {b: _num(rep["buckets"][b]) for b in BUCKETS},
            "incidents": [_incident(inc) for inc in incidents],
            "incidents_left_out": _whole(rep.get("incidents_left_out", 0)),
            "ranks": _whole(rep["ranks"]),
            "work_at_risk_gpu_h": _num(rep.get("work_at_risk_gpu_h"), True),
            "clock": "judge" if rep.get("clock") == "judge" else "hosts"}


def _incident(inc) -> dict:
    if not isinstance(inc, dict):
        raise ValueError("incident")
    out = {"at": _num(inc["at"]), "what": clean(str(inc.get("what")), limit=20),
           "action": None if inc.get("action") is None else clean(str(inc["action"]), limit=20),
           "node": None if inc.get("node") is None else clean(str(inc["node"]), limit=200),
           "rank": _whole(inc.get("rank"), True), "step": _whole(inc.get("step"), True)}
    for key, _word in LATENCIES:
        out[key] = _num(inc.get(key), True)
    out["steps_redone"] = _whole(inc.get("steps_redone", 0))
    out["gpu_hours_lost"] = _num(inc.get("gpu_hours_lost", 0.0))
    return out


def _finite(value) -> bool:
    return kinds.finite(value) and abs(value) < 1e15


def _num(value, none_ok: bool = False):
    if value is None and none_ok:
        return None
    if not _finite(value):
        raise ValueError("not a number")
    return value


def _whole(value, none_ok: bool = False):
    if value is None and none_ok:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 62):
        raise ValueError("not a whole number")
    return value
