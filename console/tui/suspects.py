"""The verdict's marks on the nodes table (plain helpers, no widget): the suspect rows in
SUSPECT_STYLE saying where the rank is, the ranks merely waiting saying on what."""

from __future__ import annotations

from ..lines.sanitize import clean
from ..model.state import RunState
from .styles import SUSPECT_STYLE, WAITING_STYLE


def suspects_by_rank(state: RunState) -> dict[int, dict]:
    """The suspects of the verdict the run has now, by rank (none without a verdict)."""
    verdict = state.verdict or {}
    return {s["rank"]: s for s in verdict.get("suspects") or []}


def waiting_in(state: RunState) -> tuple[list[int], str]:
    """(ranks the verdict says wait, on what), e.g. ``([0, 1, 3], "gloo:all_reduce #17")``."""
    evidence = (state.verdict or {}).get("evidence") or {}
    collective = evidence.get("waiting_in") or evidence.get("majority") or {}
    on = "%s #%s" % (collective["op"], collective["seq"]) if collective else "the suspects"
    return list(evidence.get("waiting_ranks") or []), on


def marked_line(state: RunState, key: str, line: tuple) -> tuple:
    """A nodes-table line (``(text, style)`` pieces, name first, detail last) marked by the
    verdict: a suspect rank in SUSPECT_STYLE saying where it is, the node of a suspect with
    its name so, a rank that merely waits saying on what."""
    suspects = suspects_by_rank(state)
    if not suspects:
        return line
    (name, _style), *middle, (detail, detail_style) = line
    if key.startswith("n:"):
        if any(s["node"] == key[2:] for s in suspects.values()):
            return ((name, SUSPECT_STYLE), *middle, (detail, detail_style))
        return line
    rank = int(key[2:])
    if rank in suspects:
        where = suspects[rank]["frame"] or state.verdict["kind"]
        return ((name, SUSPECT_STYLE), *middle, ("suspect: " + clean(where), SUSPECT_STYLE))
    waiting, on = waiting_in(state)
    if rank in waiting:
        return ((name, _style), *middle, ("waits in %s" % clean(on), WAITING_STYLE))
    return line


def first_suspect_node(state: RunState) -> str | None:
    suspects = sorted(suspects_by_rank(state).values(), key=lambda s: s["rank"])
    return suspects[0]["node"] if suspects else None
