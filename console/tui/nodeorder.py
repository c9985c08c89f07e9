"""How the nodes table orders its rows, and which row is the worst (plain data, no Textual).

Orders (``o`` cycles them): inventory order; state, the worst first (failed, unreachable,
lost > stalled > still starting > running > done); step, the lowest first (the rank holding
the others back); step time, the slowest first. A node sorts by its worst rank, so a collapsed
node with one stalled rank comes up with the stalled ranks. Ties keep inventory (rank) order.
"""

from __future__ import annotations

ORDERS = ("node", "state", "step", "step time")
FAILED = ("failed", "sync failed", "preflight failed", "unreachable", "lost")
DONE = ("exited", "succeeded", "stopped", "stopping")
NO_STEP = float("inf")


def state_rank(state: str) -> int:
    """0 failed or unreachable, 1 stalled, 2 on its way (connecting...restarting), 3 running,
    4 done: how urgently a row in this state wants the operator."""
    if state in FAILED:
        return 0
    if state == "stalled":
        return 1
    if state == "running":
        return 3
    if state in DONE:
        return 4
    return 2


def rank_badness(rs) -> tuple:
    """Smaller is worse: state, then the slowest step time, then the lowest step."""
    return (state_rank(rs.state), -(rs.step_time or 0.0),
            NO_STEP if rs.step is None else rs.step)


def node_badness(ns, ranks: list) -> tuple:
    """A node is as bad as its own state or its worst rank, whichever is worse."""
    own = (state_rank(ns.state), 0.0, NO_STEP)
    return min([own] + [rank_badness(rs) for rs in ranks])


def rank_sort_key(rs, order: str) -> tuple:
    if order == "state":
        return rank_badness(rs)[:1]
    if order == "step":
        return (NO_STEP if rs.step is None else rs.step,)
    if order == "step time":
        return (-(rs.step_time or 0.0),)
    return ()


def node_sort_key(ns, ranks: list, order: str) -> tuple:
    if order == "state":
        return node_badness(ns, ranks)[:1]
    keys = [rank_sort_key(rs, order) for rs in ranks]
    return min(keys) if keys else (NO_STEP if order == "step" else 0.0,)


def ordered(nodes: list, by_node: dict, order: str) -> list[tuple]:
    """``[(node, its ranks)]`` in ``order``; ``nodes`` in inventory order, ``by_node`` each
    node's ranks in rank order (summary.ranks_by_node). Sorting is stable: ties keep it."""
    rows = [(ns, sorted(by_node.get(ns.name, []), key=lambda rs: rank_sort_key(rs, order)))
            for ns in nodes]
    return sorted(rows, key=lambda row: node_sort_key(row[0], row[1], order))


def worst(nodes: list, by_node: dict, culprits: dict | None = None) -> tuple | None:
    """``(node, rank or None)`` the operator should look at first: a failed or unreachable
    node or rank before a stalled one, before the slowest step time, before the lowest step.
    A failed node's ranks all read "failed": ``culprits`` ({node: rank}, the rank its
    failure named) picks the one that did. The rank is None when the node itself is worse
    than every rank it has (or has none)."""
    culprits = culprits or {}
    best = None
    for ns in nodes:
        own = state_rank(ns.state)
        candidates = [((own, True, 0.0, NO_STEP), None)]
        for rs in by_node.get(ns.name, []):
            badness = rank_badness(rs)
            key = (badness[0], rs.rank != culprits.get(ns.name)) + badness[1:]
            candidates.append((key, rs))
        key, rs = min(candidates, key=lambda c: c[0])
        if best is None or key < best[0]:
            best = (key, ns, rs)
    return None if best is None else (best[1], best[2])
