"""GpuPanel: each node's GPUs - utilisation, memory, temperature, power - and their ranks.

One heading line per node (its GPU model and count, or "no GPUs (reason)" when the agent
found none), then one line per GPU. Which rank runs on a GPU: the ranks whose worker pid is
among the processes NVML lists on it; where NVML lists none of them (no per-process data, or
pids of another PID namespace), the rank with that local rank, as ``cuda:LOCAL_RANK`` gives
(shown with a ``?``).
"""

from __future__ import annotations

from ..sanitize import clean
from ..state import RunState
from .rowsview import RowsView
from ..summary import ranks_by_node
from ..text import gib, rank_ranges

BAR = 8


def util_bar(util: int | None) -> tuple[str, str]:
    if util is None:
        return "%s   -" % ("·" * BAR), "dim"
    filled = max(0, min(BAR, round(util * BAR / 100)))
    style = "green" if util >= 60 else "yellow" if util >= 20 else "red"
    return "%s%s %3d%%" % ("█" * filled, "·" * (BAR - filled), util), style


def no_gpu_text(snap: dict | None) -> str:
    if not snap:
        return "no GPU data yet"
    reason = snap.get("reason") or "none found"
    return reason if reason.startswith("no GPUs") else "no GPUs (%s)" % reason


def node_gpu_lines(state: RunState, name: str, ranks: list) -> tuple:
    """A node's heading line and one line per GPU, as (text, style) pieces."""
    ns = state.nodes[name]
    snap = ns.gpu or {}
    gpus = snap.get("gpus") or []
    if not gpus:
        return (((name, "bold"), ("  " + clean(no_gpu_text(ns.gpu)),
                                  "yellow" if ns.gpu else "dim")),)
    models = sorted({clean(str(g.get("name") or "?")) for g in gpus})
    lines = [((name, "bold"), ("  %s x%d" % (", ".join(models), len(gpus)), "dim"))]
    by_local: dict = {}
    by_pid: dict = {}
    for rs in ranks:
        by_local.setdefault(rs.local_rank, []).append(rs.rank)
        if rs.pid is not None:
            by_pid[rs.pid] = rs.rank
    for g in gpus:
        index = g.get("index")
        bar, style = util_bar(g.get("util"))
        temp, power, limit = g.get("temp"), g.get("power"), g.get("power_limit")
        on_gpu = sorted({by_pid[p] for p in g.get("pids") or () if p in by_pid})
        guess = not on_gpu
        ranks = on_gpu or by_local.get(index)
        lines.append((
            (" %2s " % index, ""), (bar, style),
            ("  %s/%sG" % (gib(g.get("mem_used")), gib(g.get("mem_total"))), ""),
            ("  %s" % ("  -" if temp is None else "%d°C" % temp),
             "bold red" if temp is not None and temp >= 85 else ""),
            ("  %s/%sW" % ("-" if power is None else "%.0f" % power,
                           "-" if limit is None else "%.0f" % limit), ""),
            ("  r" + rank_ranges(ranks) + ("?" if guess else "") if ranks else "", "cyan"),
        ))
    return tuple(lines)


class GpuPanel(RowsView):
    DEFAULT_CSS = """
    GpuPanel { height: 1fr; }
    """

    def __init__(self, state: RunState, **kwargs):
        super().__init__(header=None, cursor=False, **kwargs)
        self.state = state
        self._by_node: dict[str, list] = {}

    def on_mount(self) -> None:
        self.refresh_rows()

    def lines(self) -> list[str]:
        return [line for node in self.state.nodes for line in self.row_text(node)]

    def refresh_rows(self) -> None:
        """Re-read RunState: the shape now, the nodes on screen when painted."""
        self._by_node = ranks_by_node(self.state)
        nodes = list(self.state.nodes)
        self.set_shape(nodes, [1 + len((self.state.nodes[n].gpu or {}).get("gpus") or [])
                               for n in nodes])
        self.invalidate()

    def row_lines(self, key: str) -> tuple:
        return node_gpu_lines(self.state, key, self._by_node.get(key, []))
