"""GpuPanel: each node's GPUs - utilisation, memory, temperature, power, health - and ranks.

One heading line per node (its GPU model and count, or "no GPUs (reason)" when the agent
found none), a host line (CPU, memory, load, network, InfiniBand, workdir disk) when the agent
sends one, then one line per GPU: after power, the SM clock, slowing throttle reasons and
uncorrected ECC errors where NVML gives them. Which rank runs on a GPU: the ranks whose worker pid is
among the processes NVML lists on it; where NVML lists none of them (no per-process data, or
pids of another PID namespace), the rank with that local rank, as ``cuda:LOCAL_RANK`` gives
(shown with a ``?``).
"""

from __future__ import annotations

from agent.verdict import rank_ranges

from ..sanitize import clean
from ..state import RunState
from ..telemetry import SLOWING, hardware_of
from .rowsview import RowsView
from ..summary import ranks_by_node
from ..text import gib

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


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt % value


def host_lines(ns) -> tuple:
    """The node's host line, when the agent sent a host sample:
    ``cpu 23%  mem 4.0/16.0G  load 2.5  net 41.2↓ 40.8↑G  ib 182↓ 181↑G  disk 12 r 300 w MB/s``."""
    if not isinstance(ns.host, dict):
        return ()
    row = hardware_of(ns)
    text = "  cpu %s%%  mem %s/%sG  load %s  net %s↓ %s↑G" % (
        _num(row["cpu_pct"], "%.0f"), gib(row["mem_used"]), gib(row["mem_total"]),
        _num(row["load1"], "%.1f"), _num(row["net_rx_gbps"], "%.1f"),
        _num(row["net_tx_gbps"], "%.1f"))
    if row["ib_rx_gbps"] is not None or row["ib_tx_gbps"] is not None:
        text += "  ib %s↓ %s↑G" % (_num(row["ib_rx_gbps"], "%.0f"), _num(row["ib_tx_gbps"], "%.0f"))
    if row["disk_read_mbs"] is not None:
        text += "  disk %s r %s w MB/s" % (_num(row["disk_read_mbs"], "%.0f"),
                                          _num(row["disk_write_mbs"], "%.0f"))
    down = row["links_down"]
    return (((text, "dim"), ("  down: " + clean(",".join(down)) if down else "", "bold red")),)


def health_pieces(g: dict) -> tuple:
    """SM clock, slowing throttle reasons and uncorrected ECC errors: only what NVML gave."""
    clock, ecc = g.get("sm_clock"), g.get("ecc_uncorrected")
    slowing = [r for r in g.get("throttle") or () if r in SLOWING]
    return (("  %dMHz" % clock if isinstance(clock, int) else "", "dim"),
            ("  " + ",".join(slowing) if slowing else "", "yellow"),
            ("  ECC %d" % ecc if isinstance(ecc, int) and ecc > 0 else "", "bold red"))


def node_gpu_lines(state: RunState, name: str, ranks: list) -> tuple:
    """A node's heading line and one line per GPU, as (text, style) pieces."""
    ns = state.nodes[name]
    snap = ns.gpu or {}
    gpus = snap.get("gpus") or []
    if not gpus:
        return (((name, "bold"), ("  " + clean(no_gpu_text(ns.gpu)),
                                  "yellow" if ns.gpu else "dim")),) + host_lines(ns)
    models = sorted({clean(str(g.get("name") or "?")) for g in gpus})
    lines = [((name, "bold"), ("  %s x%d" % (", ".join(models), len(gpus)), "dim"))]
    lines += host_lines(ns)
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
        ) + health_pieces(g) + (
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
        self.set_shape(nodes, [1 + len((self.state.nodes[n].gpu or {}).get("gpus") or []) +
                               len(host_lines(self.state.nodes[n])) for n in nodes])
        self.invalidate()

    def row_lines(self, key: str) -> tuple:
        return node_gpu_lines(self.state, key, self._by_node.get(key, []))
