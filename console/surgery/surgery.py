"""Node surgery, decided: what cordoning a node would do, before anything is done.

`rankdeck cordon` and `c` in the view show this plan first (docs/SURGERY.md): the node that
goes out, the spare that comes in (or the run shrinking, when ``--nnodes MIN:MAX`` allows
it), which global ranks move, the checkpoint every rank resumes from; or why it cannot be
done, in which case nothing is. Also where the run's rendezvous store lives, chosen so that
an operator can cordon any node. Plain code over RunState: no I/O, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inventory.model import Host, Inventory
from ..model.state import RunState

ACTIVE, SPARE, CORDONED = "active", "spare", "cordoned"


def store_host(inventory: Inventory, hosts: list[Host]) -> Host:
    """Where the run's rendezvous store and judge live, among the reachable ``hosts``: the
    inventory's ``store:`` host, else the first spare (a node no run depends on until it is
    put in), else the first host (as before spares: cordoning it leaves the store there)."""
    names = {h.name: h for h in hosts}
    if inventory.store and inventory.store in names:
        return names[inventory.store]
    spares = [h for h in hosts if h.spare]
    return spares[0] if spares else hosts[0]


def nnodes_range(nnodes: str | None, active: int) -> tuple[int, int]:
    """``(MIN, MAX)`` of the run's ``--nnodes`` (N: N:N; none given: the nodes it started)."""
    if not nnodes:
        return active, active
    low, _, high = nnodes.partition(":")
    return int(low), int(high or low)


@dataclass
class CordonPlan:
    """What `cordon` would do. ``refusal``: why it cannot (then nothing is done)."""

    run_id: str
    node: str
    spare: str | None = None
    shrink: bool = False
    ranks_out: list[int] = field(default_factory=list)  # the node's global ranks now
    spare_ranks: int = 0  # processes the spare brings
    active_before: int = 0
    active_after: int = 0
    nnodes: str = ""
    resume: str | None = None  # the last complete checkpoint, in words
    store_note: str | None = None  # the store (and judge) live on the node going out
    refusal: str | None = None

    def lines(self) -> list[str]:
        """The preview, one fact a line."""
        if self.refusal:
            return ["cordon %s: not possible, nothing was done:" % self.node, "  " + self.refusal]
        ranks = ranks_text(self.ranks_out) or "none"
        out = ["cordon %s of run %s:" % (self.node, self.run_id),
               "  out:    %s (stopped, fenced: never restarted by rankdeck; its logs stay)"
               % self.node]
        if self.spare:
            out.append("  in:     %s (spare, %d process(es)), same run id" % (
                self.spare, self.spare_ranks))
        elif self.shrink:
            out.append("  in:     no spare: the run shrinks to %d node(s) (--nnodes %s)"
                       % (self.active_after, self.nnodes))
        out.append("  ranks:  %s leave %s; torchrun's rendezvous numbers the %d node(s) "
                   "again, so ranks above them may move" % (ranks, self.node, self.active_after))
        out.append("  resume: every rank from %s" % (
            self.resume or "the trainer's newest save (no complete checkpoint seen yet)"))
        if self.store_note:
            out.append("  note:   " + self.store_note)
        return out


def ranks_text(ranks: list[int]) -> str:
    """``rank 4-5`` / ``ranks 1,3`` / ``rank 2``: a node's global ranks in words."""
    if not ranks:
        return ""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return "rank %d" % ranks[0]
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return "ranks %d-%d" % (ranks[0], ranks[-1])
    return "ranks " + ",".join(str(r) for r in ranks)


def current_ranks(state: RunState, node: str) -> list[int]:
    """The global ranks ``node`` runs now: the newest started of those last seen there, at most
    its processes (after a membership change a rank that moved on may not have said so yet)."""
    ranks = sorted(state.ranks_of(node), key=lambda r: r.started or 0, reverse=True)
    return sorted(r.rank for r in ranks[:max(1, state.nodes[node].slots)])


def plan_cordon(state: RunState, inventory: Inventory, nnodes: str | None, node: str,
                replace_with: str | None = None, store: str | None = None,
                static_world: str | None = None) -> CordonPlan:
    """What cordoning ``node`` would do now (``replace_with``: this spare, else the first
    spare of the inventory, else a shrink if ``nnodes`` allows it). ``store``: the host of
    the run's rendezvous store. ``static_world``: why the run's launcher cannot take a node
    out of its world or one in (console/launch/spec.py STATIC_WORLD, with a ``%s`` for the run id)."""
    plan = CordonPlan(state.run_id, node)
    roles = {name: ns.role for name, ns in state.nodes.items()}
    active = [n for n, r in roles.items() if r == ACTIVE]
    plan.active_before = len(active)
    plan.nnodes = nnodes or str(len(active))
    if node not in roles:
        plan.refusal = "run %s has no node %r; nodes: %s" % (state.run_id, node,
                                                             ", ".join(roles))
        return plan
    if roles[node] == CORDONED:
        plan.refusal = "%s is cordoned already (`rankdeck uncordon` makes it a spare)" % node
        return plan
    if roles[node] == SPARE:
        if replace_with:
            plan.refusal = "%s is a spare, not in the run: nothing to replace" % node
        plan.active_after = len(active)  # fencing a spare: it will not be put in
        return plan
    if static_world:
        plan.refusal = static_world % state.run_id
        return plan
    plan.ranks_out = current_ranks(state, node)
    spares = [h.name for h in inventory.hosts if roles.get(h.name) == SPARE]
    if replace_with is not None:
        if replace_with not in roles:
            plan.refusal = "run %s has no node %r to put in; spares: %s" % (
                state.run_id, replace_with, ", ".join(spares) or "none")
        elif roles[replace_with] != SPARE:
            plan.refusal = "%s is %s, not a spare; spares: %s" % (
                replace_with, "in the run" if roles[replace_with] == ACTIVE else
                "cordoned", ", ".join(spares) or "none")
        if plan.refusal:
            return plan
        plan.spare = replace_with
    elif spares:
        plan.spare = spares[0]
    low, _high = nnodes_range(nnodes, len(active))
    if plan.spare:
        plan.spare_ranks = inventory.host(plan.spare).slots
        plan.active_after = len(active)
    elif len(active) - 1 >= max(low, 1):
        plan.shrink, plan.active_after = True, len(active) - 1
    else:
        plan.refusal = (
            "no spare to put in for %s, and --nnodes %s needs %d node(s): the run cannot go "
            "on without it. Add a spare (`spare: true` in the inventory, or launch --spares) "
            "or launch an elastic run (--nnodes MIN:MAX)" % (node, plan.nnodes, low))
        return plan
    last = state.checkpoints.last_complete()
    if last is not None:
        plan.resume = "step %s (%s, saved on %s)" % (last.step, last.path, last.node)
    if store == node:
        plan.store_note = ("the rendezvous store and the judge stay on %s's host (they are not "
                           "part of the node); if that host is failing, the run goes with it: "
                           "name a `store:` host in the inventory" % node)
    return plan
