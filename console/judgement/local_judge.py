"""The console's judge when the run has none: the judge's own rules (agent/rules/judge.py),
applied to this console's RunState.

A run's rules are written once, in agent/rules/judge.py, over the judge's view
(agent/rules/judge_view.py: nodes and ranks with their state, steps and CPU, the verdict's
timing, the rendezvous wait). :class:`StateView` is the one adapter between that view and
RunState: it shows RunState as a view, field for field, so the rules read and mark the same
RankState and NodeState objects the console's views and ``status`` read. What they return
(``stalled``, ``waiting``, ``waiting over`` events) goes into RunState through the path the
judge's own events take (console/judgement/judged.py ``apply_event``), so the events, the
view and ``status`` read the same with a judge or without.

When the console applies them (console/run/housekeeping.py every second; ``rankdeck status``
once after its replay, console/verbs/recorded.py):

* no judge on the hosts (an agent older than the judge, or the judge gone): every rule the
  console can apply (:data:`RULES`: stalls, CPU stalls, the rendezvous wait, the verdict
  again, the run's end), and it says once that it judges the run itself
  (console/run/judge.py, console/judgement/judged.py);
* beside a judge: only the rules that judge does not list in its ``judge`` event (an older
  judge; one older than the list applied :data:`agent.rules.judge.FIRST_RULES`).

Clock: the rules compare ``now`` with when a rank last stepped. RunState keeps a step's
time as its record's ``ts`` (the host's clock when it was written; console/model/ranks.py),
so ``now`` is this console's clock (``time.time()``). A live console and ``status`` after a
replay of the journals (every record arrives at once) read the same times: a replay says a
rank idle for as long as its host's records say, not for the few seconds since they arrived.
Plain code: no asyncio, no Textual.
"""

from __future__ import annotations

import time

from agent.rules import judge as rules

from ..model.state import RunState
from ..model.nodes import RankState
from .judged import apply_event, judge_applies

# the rules a console applies when no judge does (named as in the judge's RULES)
RULES = ("stalls", "cpu", "waiting", "verdict", "finish")


def _of_state(name: str) -> property:
    """A view's field that is RunState's own (the rules read and set it there)."""
    return property(lambda view: getattr(view.state, name),
                    lambda view, value: setattr(view.state, name, value))


class StateView:
    """RunState shown as the judge's RunView (agent/rules/judge_view.py): its active nodes
    (a spare or a cordoned node is out of the run, as the judge's view drops it), their
    ranks, the stall threshold, the ranks' CPU, the wait and the verdict's timing."""

    def __init__(self, state: RunState):
        self.state = state
        self.nodes = {n: ns for n, ns in state.nodes.items() if ns.role == "active"}
        self.ranks = {r: rs for r, rs in state.ranks.items() if rs.node in self.nodes}
        self.stall_after = state.stall_min_s
        self.rank_cpu = state.rank_cpu

    waiting = _of_state("waiting")
    verdict = _of_state("verdict")
    verdict_at = _of_state("verdict_at")
    verdict_tries = _of_state("verdict_tries")


def judge_locally(state: RunState, now: float | None = None,
                  apply: tuple[str, ...] = RULES) -> tuple[list[RankState], bool]:
    """The rules in ``apply`` over ``state`` now: (the ranks that stalled just now, whether
    to ask again who is stuck). With the ``verdict`` rule, only the ranks of a stall that
    began now (agent/rules/judge.py ``stall_began``): one that reaches more ranks later is the
    same stall, with no second verdict."""
    now = now or time.time()
    view = StateView(state)
    news = []
    if "stalls" in apply:
        news += rules.step_stalls(view, now)
    if "cpu" in apply:
        news += rules.cpu_stalls(view, now)
    if "waiting" in apply:
        news += rules.check_waiting(view, now)
    for ev in news:
        apply_event(state, ev, by_judge=False)
    again = "verdict" in apply and rules.verdict_again_due(view, now)
    if "verdict" in apply and not rules.stall_began(view, news):
        return [], again
    return [state.ranks[e["rank"]] for e in news if e["what"] == "stalled"], again


def missing_rules(state: RunState) -> tuple[str, ...]:
    """The rules of :data:`RULES` the run's judge does not apply (all, with no judge)."""
    if state.judge is None:
        return RULES
    return tuple(r for r in RULES if r not in rules.FIRST_RULES and not judge_applies(state, r))


def beside_judge(state: RunState, now: float | None = None) -> bool:
    """With a judge on the hosts: the rules that judge does not apply (its ``judge`` event
    lists those it does), applied here with the same functions; True when a stall began or
    the verdict is due again."""
    stalled, again = judge_locally(state, now, missing_rules(state))
    return bool(stalled) or again


def check_stalls(state: RunState, now: float | None = None) -> list[RankState]:
    """Every rule but the verdict's: the ranks that stalled just now."""
    return judge_locally(state, now, tuple(r for r in RULES if r != "verdict"))[0]


def check_waiting(state: RunState, now: float | None = None) -> dict | None:
    """The rendezvous waited in too long (agent/rules/judge.py ``check_waiting``), kept in
    ``state.waiting`` and said once per round and set of missing nodes."""
    judge_locally(state, now, ("waiting",))
    return state.waiting


def verdict_again_due(state: RunState, now: float | None = None) -> bool:
    """Time to ask again who is stuck (agent/rules/judge.py ``verdict_again_due``)."""
    return rules.verdict_again_due(StateView(state), now or time.time())


def ends_due(state: RunState) -> dict[str, dict]:
    """``{node: {"state", "cause", "say"}}``: live nodes to stop now that the run is over,
    and how each ends (agent/rules/judge.py ``ends_due``, stopped by rankdeck)."""
    return {node: {"state": end["state"], "cause": end["cause"], "say": end["text"]}
            for node, end in rules.ends_due(StateView(state), by="rankdeck").items()}
