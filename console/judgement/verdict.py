"""Who is stuck, in words: the lines `why`, `--no-tui` and the view print for a verdict.

The verdict itself is decided by agent/rules/verdict.py (plain data, standard library only), on the
hosts by the run's judge (agent/judge/judge.py) or here when no judge is found (console/judgement/why.py).
"""

from __future__ import annotations

from agent.rules.verdict import rank_ranges

from ..lines.sanitize import clean


def verdict_lines(verdict: dict) -> list[str]:
    """Plain text: the kind and summary, then per suspect a line and its source line."""
    lines = ["%s: %s" % (verdict["kind"], verdict["summary"])]
    for s in verdict["suspects"]:
        lines.append("  suspect rank %d on %s at %s" % (s["rank"], s["node"], s["frame"] or "?"))
        if s.get("source"):
            lines.append("    > " + s["source"])
    return lines


def _in(c: dict) -> str:
    return "%s #%s (pg %s) sizes %s" % (c.get("op"), c.get("seq"), c.get("pg"), c.get("sizes"))


def evidence_lines(verdict: dict) -> list[str]:
    """Plain text: what the verdict rests on (which collective the others wait in, each
    rank's collective in a mismatch, the nodes that did not answer, lateness, or why not; a
    verdict from the stacks alone says so first)."""
    ev, lines = verdict.get("evidence") or {}, []
    if ev.get("flight_recorder"):  # first: everything below rests on the stacks alone
        lines.append(ev["flight_recorder"])
    if ev.get("waiting_at"):
        lines.append("rank(s) %s wait in a collective, at %s"
                     % (rank_ranges(ev.get("waiting_ranks") or []), ev["waiting_at"]))
    if ev.get("waiting_in"):
        lines.append("rank(s) %s wait in %s" % (rank_ranges(ev.get("waiting_ranks") or []),
                                                _in(ev["waiting_in"])))
    for rank, c in (ev.get("suspect_last") or {}).items():
        lines.append("rank %s finished %s last" % (rank, _in(c)))
    if ev.get("majority"):
        lines.append("the majority waits in " + _in(ev["majority"]))
    for rank, c in (ev.get("collectives") or {}).items():
        lines.append("rank %s waits in %s" % (rank, _in(c)))
    for node, cause in (ev.get("unreachable") or {}).items():
        lines.append("%s did not answer: %s" % (node, cause))
    if "unreachable" in ev:
        lines.append("rank(s) waiting: %s" % (rank_ranges(ev.get("waiting_ranks") or []) or "none"))
    for rank, late in (ev.get("lateness_s") or {}).items():
        lines.append("rank %s enters %.0f ms after the median rank" % (rank, late * 1000))
    if ev.get("why"):
        lines.append(ev["why"])
    return [clean(line, limit=400) for line in lines]
