"""A node's deep-preflight result as the run keeps it (``launch --preflight deep``,
docs/HEALTH.md): the entry console/run/deep.py makes of each node's check, kept in the run's
record and in ``status``'s ``nodes[].health`` (docs/STATUS.md), checked again wherever it is
read back (a record may come from a host: ``watch RUN -i``), and its short form for the
nodes table's health column and the status table (``ok 9.8G``, ``slow 0.05G``, ``disk``).
"""

from __future__ import annotations

from agent.rules import kinds

from ..lines.sanitize import clean

# what a problem is about, by the words deep.py starts it with: the first one names the node
KINDS = ("network", "probe", "link", "disk", "clock", "versions", "gpu", "code", "host")
MAX_PROBLEMS = 16
PROBLEM_MAX = 400
SHORT = {"network": "slow", "probe": "net?", "link": "link", "disk": "disk", "clock": "clock",
         "versions": "vers", "gpu": "gpu", "code": "code", "host": "bad"}
NONE = "-"  # no deep check ran for the node


def _figure(value):
    if not kinds.finite(value) or value < 0:
        return None
    return float(value)


def checked(value) -> dict | None:
    """A health entry as the run keeps it, from what may be a host's copy of the record:
    ``{"ok", "kind", "problems", "net_gbps", "disk_write_mbps"}`` with every field of the
    right type (text cleaned and bounded), or None when ``value`` is no entry."""
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        return None
    problems = value.get("problems")
    problems = [clean(str(p), limit=PROBLEM_MAX).replace("\n", " ")
                for p in (problems if isinstance(problems, list) else [])[:MAX_PROBLEMS]]
    kind = value.get("kind")
    if value["ok"]:
        kind = "ok"
    elif kind not in KINDS:
        kind = "host"
    return {"ok": value["ok"], "kind": kind, "problems": problems,
            "net_gbps": _figure(value.get("net_gbps")),
            "disk_write_mbps": _figure(value.get("disk_write_mbps"))}


def short(entry: dict | None) -> str:
    """The health column's words: ``ok 9.8G`` (its network figure, Gbit/s), ``slow 0.05G``
    (a slow node: its figure), ``link`` (a slow link to it), ``disk``, ``clock``, ``vers``,
    ``gpu``, ``code``, ``net?`` (the network probe failed), ``bad`` (a problem of the plain
    preflight's), ``-`` with no deep check."""
    if not entry:
        return NONE
    word = "ok" if entry["ok"] else SHORT.get(entry["kind"], "bad")
    if entry["kind"] in ("ok", "network") and entry.get("net_gbps") is not None:
        return "%s %sG" % (word, gbit(entry["net_gbps"]))
    return word


def gbit(value: float) -> str:
    """A Gbit/s figure in at most 4 characters: 12, 9.8, 0.05."""
    return "%.0f" % value if value >= 10 else "%.1f" % value if value >= 0.1 else "%.2f" % value
