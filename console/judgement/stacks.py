"""Stack dumps of a run's ranks, grouped: the rank whose stack differs from the majority is
the one to look at in a hang (the others wait for it in a collective)."""

from __future__ import annotations

from collections import Counter

from agent.rules.verdict import main_thread_locations

from ..lines.sanitize import clean

def main_thread_frames(stack: str) -> list[str]:
    """``function (file)`` of the main thread's frames, innermost first, without line numbers
    (so that ranks waiting in the same call compare equal)."""
    return ["%s (%s)" % (fn, path.rsplit("/", 1)[-1])
            for fn, path, _line in main_thread_locations(stack)]


def group(ranks: list[dict]) -> tuple[list[dict], list[int]]:
    """Annotate each rank with ``frames`` and ``differs``; return (ranks, odd rank numbers).

    The majority is the most common main-thread call chain; with two groups of equal size
    nothing is marked.
    """
    for r in ranks:
        r["frames"] = main_thread_frames(r.get("stack") or "")
    sigs = Counter(tuple(r["frames"]) for r in ranks if r["frames"])
    odd: list[int] = []
    if len(sigs) > 1:
        (top, n1), (_second, n2) = sigs.most_common(2)
        if n1 > n2:
            for r in ranks:
                r["differs"] = bool(r["frames"]) and tuple(r["frames"]) != top
                if r["differs"]:
                    odd.append(r["rank"])
    return ranks, odd


def answered(node_results: dict) -> tuple[list[dict], list[str]]:
    """(every rank that answered, with its ``node``, by rank; a line per node's error)."""
    ranks, problems = [], []
    for node, res in node_results.items():
        if isinstance(res, BaseException):
            problems.append("%s: %s" % (node, res))
            continue
        if res.get("error"):
            problems.append("%s: %s" % (node, res["error"]))
        for r in res.get("ranks", []):
            ranks.append(dict(r, node=node))
    return sorted(ranks, key=lambda r: r["rank"]), problems


def render(node_results: dict) -> str:
    """Plain text: every rank's innermost frames, the odd ones marked."""
    ranks, lines = answered(node_results)
    ranks, odd = group(ranks)
    for r in ranks:
        mark = "  <-- DIFFERS FROM THE MAJORITY" if r.get("differs") else ""
        head = "[%s r%d] pid %d, %s%s" % (r["node"], r["rank"], r["pid"],
                                          r.get("method") or "no stack", mark)
        lines.append(head)
        if r.get("error"):
            lines.append("    " + r["error"])
        for f in r["frames"][:12]:
            lines.append("    " + f)
    if odd:
        lines.append("odd rank(s) out: %s" % ", ".join(map(str, odd)))
    return "\n".join(clean(line) for line in lines)  # host text: no escapes reach the terminal
