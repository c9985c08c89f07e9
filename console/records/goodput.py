"""`rankdeck goodput RUN`: where a run's time went and what each incident cost, in words.

The figures are agent/rules/goodput.py's (the same rule a run nobody watches is reduced by);
this module only says them: the lines `goodput` prints, the section `report` adds
(console/records/report.py), and the header's ``goodput 94%`` (console/tui/header.py).
docs/GOODPUT.md says how each bucket is counted.
"""

from __future__ import annotations

import time

from ..lines.sanitize import clean
from ..lines.text import hms

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
