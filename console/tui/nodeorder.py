"""How the nodes table orders its rows, and which row is the worst (plain data, no Textual).

Orders (``o`` cycles them, ``O`` backwards): inventory order; state, the worst first (failed,
unreachable, lost > stalled > still starting > running > done); step, the lowest first (the
rank holding the others back); step time, the slowest first. A node sorts by its worst rank,
so a collapsed node with one stalled rank comes up with the stalled ranks. Ties keep
inventory (rank) order.

Then the node's telemetry (console/model/telemetry.py ``node_telemetry``), each in the direction
that puts the node holding the others back on top; ranks keep rank order under a node:

- gpu util, the lowest mean first (then the lowest single GPU): in a synchronous job the busy
  GPUs all wait for the idle one, so the odd node is the one that computes least.
- tok/s, the lowest first: the node whose ranks deliver least.
- network, the least in+out (Ethernet and InfiniBand together) first: a node on a slow or
  down link moves fewer bytes than the others in every all-reduce.
- cpu, the highest first: a host pegged by data loading or another job starves its GPUs.

GPU memory is no order: healthy nodes of one job use the same memory, a node about to run
out fails (the state order puts it first), and the table has no memory cell to read it by -
the GPU panel shows it per GPU. A node without the value (n/a: the host sends none, or sends
something that is not a finite number) sorts last under these orders.
"""

from __future__ import annotations


from ..model.telemetry import host_number, node_row

ORDERS = ("node", "state", "step", "step time", "gpu util", "tok/s", "network", "cpu")
# the telemetry orders: (the row's columns it sorts by, 1 lowest first / -1 highest first,
# how the header names it)
TELEMETRY = {
    "gpu util": (("gpu_util_mean", "gpu_util_min"), 1, "gpu util, lowest first"),
    "tok/s": (("tok_s",), 1, "tok/s, lowest first"),
    "network": (("net_rx_gbps", "net_tx_gbps", "ib_rx_gbps", "ib_tx_gbps"), 1,
                "net in+out, least first"),
    "cpu": (("cpu_pct",), -1, "cpu %, highest first"),
}
FAILED = ("failed", "sync failed", "preflight failed", "unreachable", "lost", "gone")
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


def telemetry_key(row: dict | None, order: str) -> tuple:
    """A node's sort key under a telemetry order: ``(0, value...)``, or ``(1,)`` for n/a (no
    row, or no finite value), so that nodes without the value come last."""
    columns, direction, _label = TELEMETRY[order]
    row = row or {}
    if order == "network":  # in+out over every link the host reports
        values = [v for v in (host_number(row.get(c)) for c in columns) if v is not None]
        total = host_number(sum(values)) if values else None  # inf when it overflows
        return (1,) if total is None else (0, direction * total)
    values = [host_number(row.get(c)) for c in columns]
    if values[0] is None:
        return (1,)
    return (0,) + tuple(direction * (v if v is not None else values[0]) for v in values)


def header_label(order: str) -> str:
    """How the header names a telemetry order (above the detail column, where the node rows
    show their telemetry)."""
    return TELEMETRY[order][2]


def rank_sort_key(rs, order: str) -> tuple:
    if order == "state":
        return rank_badness(rs)[:1]
    if order == "step":
        return (NO_STEP if rs.step is None else rs.step,)
    if order == "step time":
        return (-(rs.step_time or 0.0),)
    return ()


def node_sort_key(ns, ranks: list, order: str, row: dict | None = None) -> tuple:
    """``row``: the node's telemetry (node_telemetry), for the telemetry orders; read from
    ``ns`` and ``ranks`` when not given."""
    if order in TELEMETRY:
        return telemetry_key(row if row is not None else
                             node_row(ns, ranks), order)
    if order == "state":
        return node_badness(ns, ranks)[:1]
    keys = [rank_sort_key(rs, order) for rs in ranks]
    return min(keys) if keys else (NO_STEP if order == "step" else 0.0,)


def ordered(nodes: list, by_node: dict, order: str,
            telemetry: dict | None = None) -> list[tuple]:
    """``[(node, its ranks)]`` in ``order``; ``nodes`` in inventory order, ``by_node`` each
    node's ranks in rank order (summary.ranks_by_node). Sorting is stable: ties keep it.
    ``telemetry``: ``{node: node_telemetry row}`` already computed (the others are read from
    the node)."""
    telemetry = telemetry or {}
    rows = [(ns, sorted(by_node.get(ns.name, []), key=lambda rs: rank_sort_key(rs, order)))
            for ns in nodes]
    return sorted(rows, key=lambda row: node_sort_key(row[0], row[1], order,
                                                      telemetry.get(row[0].name)))


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
