"""What the run's judge decided, into RunState: the judge (agent/judge.py) writes its events
into its own journal on the rendezvous host; every console reads that journal as it reads a
node's (the rendezvous host's link subscribes to it as ``judge``) and shows the same thing.

With a judge the console only looks: its own stall, verdict and finish rules are off
(RunController's housekeeping asks :func:`judged`), `w` and `why` ask the judge for a fresh
verdict. Without one (an agent older than the judge, or the judge gone) the console judges
as before and says so once (``judge`` event).

Records: ``event`` metas with ``what`` in JUDGE_EVENTS (docs/PROTOCOL.md "The judge"), checked
by console/agent_messages.py before they arrive here. Plain code: no asyncio, no Textual.
"""

from __future__ import annotations

from .sanitize import clean, clean_tree
from .state import RunState

JUDGE_EVENTS = ("judge", "stalled", "stepping", "verdict", "policy", "restarted", "ending",
                "notify_failed", "judge_error", "run_ended", "diverged", "straggler",
                "straggler cleared", "surgery")


def judged(state: RunState) -> bool:
    """A judge on the hosts watches this run (its journal said so)."""
    return state.judge is not None


def apply_judge_records(state: RunState, recs: list, end: int, host: str) -> None:
    """The ``recs`` of a ``journal`` message of the ``judge`` subscription on ``host``'s link
    (the node whose change listeners hear of it: they know nodes, not the judge)."""
    for rec in recs:
        meta = rec[0]
        if meta.get("k") == "event" and meta.get("what") in JUDGE_EVENTS:
            _event(state, meta)
    state.judge_offset = end
    state.changed(host)


def settle(state: RunState) -> None:
    """Ranks the judge says are stalled show as stalled: also those whose node's journal was
    replayed after the judge's (``status`` from a new shell reads them side by side)."""
    for rank in state.judge_stalled:
        rs = state.ranks.get(rank)
        if rs is not None and rs.state == "running":
            rs.state = "stalled"


def _event(state: RunState, meta: dict) -> None:
    what, node, rank = meta["what"], meta.get("node"), meta.get("rank")
    node = node if node in state.nodes else None
    text = clean(meta.get("text") or what, limit=600)
    rs = state.ranks.get(rank) if isinstance(rank, int) else None
    if what == "judge" and meta.get("action") == "ended":
        state.judge = None  # it is gone: this console judges again
    elif what == "judge":
        state.judge = {"stall_after": meta.get("stall_after"), "on_hang": meta.get("on_hang"),
                       "max_wall": meta.get("max_wall"), "notify": meta.get("notify")}
        if isinstance(meta.get("stall_after"), (int, float)) and not state.stall_min_given:
            state.stall_min_s = float(meta["stall_after"])  # the run's own, unless asked
    elif what == "verdict" and isinstance(meta.get("verdict"), dict):
        state.set_verdict(clean_tree(meta["verdict"]))
        return  # set_verdict says it, once when it is news
    elif what == "stalled" and isinstance(rank, int):
        state.judge_stalled.add(rank)
        settle(state)
    elif what == "stepping" and isinstance(rank, int):
        state.judge_stalled.discard(rank)
        if rs is not None and rs.state == "stalled":
            rs.state = "running"
            state.silent_waiting.discard(rs.rank)
    elif what == "diverged":
        if rs is None or rs.diverged is not None:
            return  # this console saw it first (console/state.py): said once
        rs.diverged = meta.get("step")
    state.add_event(node, what if what != "judge" else "judge", text, rank, meta.get("ts"))
