"""What the run's judge decided, into RunState: the judge (agent/judge/judge.py) writes its events
into its own journal on the rendezvous host; every console reads that journal as it reads a
node's (the rendezvous host's link subscribes to it as ``judge``) and shows the same thing.

With a judge the console only looks: it applies none of the judge's rules (RunController's
housekeeping asks :func:`judged`), or only those a judge older than some of them does not
list (:func:`judge_applies`); `w` and `why` ask the judge for a fresh verdict; the run's wait
(``waiting``: what its rendezvous waits for) comes from the judge's ``waiting`` and ``waiting
over`` events. Without one (an agent older than the judge, or the judge gone) the console
applies the same rules itself (console/judgement/local_judge.py), whose events come in here
too (:func:`apply_event`), and says once that it judges the run (``judge`` event).

Records: ``event`` metas with ``what`` in JUDGE_EVENTS (docs/PROTOCOL.md "The judge"), checked
by console/run/messages.py before they arrive here. Plain code: no asyncio, no Textual.
"""

from __future__ import annotations

import time

from ..lines.sanitize import clean, clean_tree
from ..model.state import RunState

JUDGE_EVENTS = ("judge", "stalled", "stepping", "verdict", "policy", "restarted", "ending",
                "notify_failed", "judge_error", "run_ended", "diverged", "straggler",
                "straggler cleared", "surgery", "waiting", "waiting over", "cordon proposed",
                "loop", "resume mismatch")


def judged(state: RunState) -> bool:
    """A judge on the hosts watches this run (its journal said so)."""
    return state.judge is not None


def judge_applies(state: RunState, rule: str) -> bool:
    """The run's judge applies ``rule`` (``waiting``: a rendezvous that waits; ``cpu``: a run
    that prints no steps stalls on its ranks' CPU); its ``judge`` event lists them, a judge
    older than those rules lists none."""
    return state.judge is not None and rule in state.judge["rules"]


def apply_judge_records(state: RunState, recs: list, end: int, host: str) -> None:
    """The ``recs`` of a ``journal`` message of the ``judge`` subscription on ``host``'s link
    (the node whose change listeners hear of it: they know nodes, not the judge)."""
    for rec in recs:
        meta = rec[0]
        if meta.get("k") == "event" and meta.get("what") in JUDGE_EVENTS:
            apply_event(state, meta)
    state.judge_offset = end
    state.changed(host)


def settle(state: RunState) -> None:
    """Ranks the judge says are stalled show as stalled: also those whose node's journal was
    replayed after the judge's (``status`` from a new shell reads them side by side)."""
    for rank in state.judge_stalled:
        rs = state.ranks.get(rank)
        if rs is not None and rs.state == "running":
            rs.state = "stalled"


def apply_event(state: RunState, meta: dict, by_judge: bool = True) -> None:
    """One event of the judge's rules into RunState: the judge's (from its journal), or
    ``by_judge=False`` this console's own, when it applies the same rules to RunState
    (console/judgement/local_judge.py: the rule marked the rank and kept the wait itself)."""
    what, node, rank = meta["what"], meta.get("node"), meta.get("rank")
    node = node if node in state.nodes else None
    text = clean(meta.get("text") or what, limit=600)
    rs = state.ranks.get(rank) if isinstance(rank, int) else None
    if what == "judge" and meta.get("action") == "ended":
        state.judge = None  # it is gone: this console judges again
    elif what == "judge":
        rules = meta.get("rules") if isinstance(meta.get("rules"), list) else []
        state.judge = {"stall_after": meta.get("stall_after"), "on_hang": meta.get("on_hang"),
                       "max_wall": meta.get("max_wall"), "notify": meta.get("notify"),
                       "rules": [r for r in rules if isinstance(r, str)]}
        if isinstance(meta.get("stall_after"), (int, float)) and not state.stall_min_given:
            state.stall_min_s = float(meta["stall_after"])  # the run's own, unless asked
    elif what == "verdict" and isinstance(meta.get("verdict"), dict):
        state.set_verdict(clean_tree(meta["verdict"]))
        return  # set_verdict says it, once when it is news
    elif what == "stalled" and isinstance(rank, int) and not by_judge:
        if rs is not None and not rs.reports:
            state.silent_waiting.add(rank)  # the run's next step wakes it (console/model/ranks.py)
    elif what == "stalled" and isinstance(rank, int):
        state.judge_stalled.add(rank)
        settle(state)
    elif what == "stepping" and isinstance(rank, int):
        state.judge_stalled.discard(rank)
        if rs is not None and rs.state == "stalled":
            rs.state = "running"
            state.silent_waiting.discard(rs.rank)
    elif what == "waiting" and by_judge:
        state.waiting = _wait(meta, text)
    elif what == "waiting over" and by_judge:
        state.waiting = None
    elif what == "surgery" and meta.get("who") == "judge" and meta.get("action") == "outcome":
        _judge_surgery(state, meta, text)
    elif what == "diverged":
        if rs is None or rs.diverged is not None:
            return  # this console saw it first (console/model/ranks.py): said once
        rs.diverged = meta.get("step")
    state.add_event(node, what if what != "judge" else "judge", text, rank, meta.get("ts"))


def _judge_surgery(state: RunState, meta: dict, text: str) -> None:
    """A cordon the judge did itself (``--auto-cordon``, agent/judge/cordon.py): the node is
    cordoned and the spare in the run, in this console too; kept for the run record."""
    out, spare = meta.get("out"), meta.get("in")
    outcome = clean(str(meta.get("outcome") or ""), limit=300)
    if out not in state.nodes or (spare is not None and spare not in state.nodes):
        return
    if meta.get("fenced") is True or outcome.startswith("done"):
        state.set_role(out, "cordoned")
    if spare is not None and outcome.startswith("done"):
        state.set_role(spare, "active")
    state.judge_surgeries.append({
        "who": "judge", "what": text.split(": ", 1)[0], "node": out, "spare": spare,
        "when": meta.get("ts") if isinstance(meta.get("ts"), (int, float)) else time.time(),
        "outcome": outcome, "gpu": clean(str(meta.get("gpu") or ""), limit=100),
        "left": [p for p in meta.get("left") or [] if isinstance(p, (int, list))]
        if isinstance(meta.get("left"), list) else []})


def _wait(meta: dict, text: str) -> dict:
    """The run's wait (``status --json`` ``waiting_for``) from the judge's ``waiting`` event:
    since when in the judge host's clock, as the host's phases were."""
    def whole(key):
        value = meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    waited = meta.get("waited_s") if isinstance(meta.get("waited_s"), (int, float)) else 0.0
    ts = meta.get("ts") if isinstance(meta.get("ts"), (int, float)) else time.time()
    missing = [clean_tree({k: m.get(k) for k in ("node", "state", "phase")})
               for m in meta.get("missing") or [] if isinstance(m, dict)] \
        if isinstance(meta.get("missing"), list) else []
    inside = [clean(n, limit=100) for n in meta.get("in") or [] if isinstance(n, str)] \
        if isinstance(meta.get("in"), list) else []
    return {"since": ts - waited, "round": whole("round"),
            "joined": whole("joined") or 0, "nodes": whole("nodes") or 0, "in": inside,
            "missing": missing, "text": text}
