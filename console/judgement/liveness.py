"""Liveness: the rules that time drives over RunState, apart from the records that feed it.

RunState changes when a record comes in (console/model/apply.py); these rules change it when
nothing comes in for too long. The RunController's housekeeping (console/run/housekeeping.py)
applies them every second (``rankdeck status`` once, after its replay), as it applies
console/judgement/finish.py's:

* :func:`check_stalls`: a rank that printed steps stalls after no step for longer than its
  threshold (``--stall-after``, or 5x its median step time); a silent rank (it prints no
  steps) stalls with the run's newest stepping rank; in a run where no rank prints steps,
  every rank stalls once no rank's CPU has advanced for that long (agent/rules/rankcpu.py);
* :func:`check_waiting`: a rendezvous waited in for longer than the threshold, and for whom
  (agent/rules/rendezvous.py);
* :func:`verdict_again_due`: when to ask again who is stuck, while a stall lasts and the last
  verdict named nobody.

Each stall, wait and recovery is said once, as an event. With a judge on the hosts these are
its rules (agent/rules/judge.py applies the same agent/rules/rendezvous.py and agent/rules/rankcpu.py),
and the console applies only what an older judge does not (:func:`beside_judge`). Plain code:
no asyncio, no Textual.
"""

from __future__ import annotations

import statistics
import time

from agent.rules import rankcpu

from ..model import rendezvous
from .judged import judge_applies
from ..model.state import RunState
from ..model.nodes import RankState

STALL_FACTOR = 5.0  # a rank stalls after this many of its median step times without a step
VERDICT_AGAIN_S = 10.0  # an unknown verdict is taken again this long after, while stalled,
VERDICT_AGAIN_MAX_S = 120.0  # doubling each time up to this


def stall_threshold(rs: RankState, minimum: float) -> float:
    """The larger of ``minimum`` and 5x the rank's median step time."""
    if rs.step_times:
        return max(minimum, STALL_FACTOR * statistics.median(rs.step_times))
    return minimum


def check_stalls(state: RunState, now: float | None = None) -> list[RankState]:
    """Mark ranks with no progress for longer than their threshold as stalled; the ranks
    that stalled just now. Also checks a rendezvous that waits (:func:`check_waiting`)."""
    now = now or time.time()
    check_waiting(state, now)  # the other way of not stepping: a rendezvous that waits
    newly = []
    for rs in state.ranks.values():
        if rs.state != "running" or rs.last_progress is None:
            continue
        if now - rs.last_progress > stall_threshold(rs, state.stall_min_s):
            rs.state = "stalled"
            newly.append(rs)
            state.add_event(rs.node, "stalled", "rank %d stalled: no step for %.0f s (last "
                            "step %s)" % (rs.rank, now - rs.last_progress, rs.step), rs.rank)
    return newly + _silent_stalls(state, now) + cpu_stalls(state, now)


def beside_judge(state: RunState, now: float | None = None) -> bool:
    """With a judge on the hosts: the rules a judge older than these does not apply (its
    ``judge`` event lists those it does), applied here as before; True when a stall began."""
    now = now or time.time()
    if not judge_applies(state, "waiting"):
        check_waiting(state, now)
    return not judge_applies(state, "cpu") and bool(cpu_stalls(state, now))


def cpu_stalls(state: RunState, now: float) -> list[RankState]:
    """A run where no rank prints steps stalls when no rank's CPU has advanced for
    longer than the stall threshold (agent/rules/rankcpu.py says why not one rank alone)."""
    idle = rankcpu.silent_run_idle_s(state.ranks, state.rank_cpu, state.stall_min_s)
    if idle is None:
        return []
    newly = [rs for rs in state.ranks.values() if rs.state == "running"]
    for rs in newly:
        rs.state = "stalled"
        state.add_event(rs.node, "stalled", rankcpu.stall_text(rs.rank, idle), rs.rank)
    return newly


def _silent_stalls(state: RunState, now: float) -> list[RankState]:
    """A silent rank waits with the run: when the run has made no step for longer than
    the threshold of its newest stepping rank, every running silent rank stalls too (and
    the run's next step wakes it: RunState's ``silent_waiting``)."""
    steppers = [r for r in state.ranks.values() if r.last_progress is not None]
    if not steppers:
        return []
    newest = max(steppers, key=lambda r: r.last_progress)
    idle = now - newest.last_progress
    if idle <= stall_threshold(newest, state.stall_min_s):
        return []
    newly = [rs for rs in state.ranks.values() if not rs.reports and rs.state == "running"]
    for rs in newly:
        rs.state = "stalled"
        state.silent_waiting.add(rs.rank)
        state.add_event(rs.node, "stalled", "rank %d stalled: it prints no steps and the run "
                        "has made none for %.0f s (last step %s)" % (rs.rank, idle,
                                                                     newest.step), rs.rank)
    return newly


def check_waiting(state: RunState, now: float | None = None) -> dict | None:
    """The rendezvous waited in for longer than the stall threshold (``--stall-after``: no
    step for that long either way; agent/rules/rendezvous.py), kept in ``state.waiting``; a
    ``waiting`` event names what it waits for, once per round and set of missing nodes."""
    now = now or time.time()
    wait = rendezvous.waiting(state.nodes, list(state.ranks.values()), now, state.stall_min_s)
    if wait and (state.waiting is None or rendezvous.wait_key(wait)
                 != rendezvous.wait_key(state.waiting)):
        state.add_event(None, "waiting", wait["text"])
    state.waiting = wait
    return wait


def verdict_again_due(state: RunState, now: float | None = None) -> bool:
    """The stall goes on and the verdict named nobody (``unknown``: on a loaded host the
    ranks may still have been entering collectives in the two samples): time to look
    again, ``VERDICT_AGAIN_S`` after the first look, doubling up to ``VERDICT_AGAIN_MAX_S``."""
    if state.verdict is None or state.verdict.get("kind") != "unknown":
        state.verdict_tries = 0
        return False
    if not any(rs.state == "stalled" for rs in state.ranks.values()):
        return False
    wait = min(VERDICT_AGAIN_MAX_S, VERDICT_AGAIN_S * 2 ** state.verdict_tries)
    if (now or time.time()) - state.verdict_at < wait:
        return False
    state.verdict_tries += 1
    return True
