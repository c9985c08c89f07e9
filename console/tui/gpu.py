"""GpuPanel: each node's GPUs - utilisation, memory, temperature, power, health - and ranks.

One heading per node (its GPU model and count, or "no GPUs (reason)" when the agent found
none), a host line (CPU, memory, load, network, InfiniBand, workdir disk) when the agent
sends one, then one line per GPU: after power, the SM clock, slowing throttle reasons and
uncorrected ECC errors where NVML gives them. Every figure is whole and has its unit: the
heading and host line wrap at the panel's width, a GPU line leaves out its least needed
pieces (fitting.py). Which rank runs on a GPU: the ranks whose worker pid is
among the processes NVML lists on it; where NVML lists none of them (no per-process data, or
pids of another PID namespace), the rank with that local rank, as ``cuda:LOCAL_RANK`` gives
(shown with a ``?``).
"""

from __future__ import annotations

from agent.rules.verdict import rank_ranges

from ..lines.sanitize import clean
from ..model.state import RunState
from ..model.telemetry import SLOWING, hardware_of
from .fitting import fitted, wrapped
from .rowsview import RowsView
from ..model.summary import ranks_by_node
from ..lines.text import gib

BAR = 8
MIN_WIDTH = 24  # the panel's lines are laid out for at least this many columns


def util_bar(util: int | None) -> tuple[str, str]:
    """The utilisation bar and its style (by how busy the GPU is)."""
    if util is None:
        return "·" * BAR, "dim"
    filled = max(0, min(BAR, round(util * BAR / 100)))
    style = "green" if util >= 60 else "yellow" if util >= 20 else "red"
    return "█" * filled + "·" * (BAR - filled), style


def no_gpu_text(snap: dict | None) -> str:
    if not snap:
        return "no GPU data yet"
    reason = snap.get("reason") or "none found"
    return reason if reason.startswith("no GPUs") else "no GPUs (%s)" % reason


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt % value


def host_pieces(ns) -> tuple:
    """The node's host sample as pieces, each figure with its unit:
    ``cpu 23%  mem 4.0/16.0G  load 2.5  net 41.2↓ 40.8↑ Gb/s  ib 182↓ 181↑ Gb/s
    disk 12r 300w MB/s``; () when the agent sent none."""
    if not isinstance(ns.host, dict):
        return ()
    row = hardware_of(ns)
    pieces = [("cpu %s%%" % _num(row["cpu_pct"], "%.0f"), "dim"),
              ("  mem %s/%sG" % (gib(row["mem_used"]), gib(row["mem_total"])), "dim"),
              ("  load %s" % _num(row["load1"], "%.1f"), "dim"),
              ("  net %s↓ %s↑ Gb/s" % (_num(row["net_rx_gbps"], "%.1f"),
                                      _num(row["net_tx_gbps"], "%.1f")), "dim")]
    if row["ib_rx_gbps"] is not None or row["ib_tx_gbps"] is not None:
        pieces.append(("  ib %s↓ %s↑ Gb/s" % (_num(row["ib_rx_gbps"], "%.0f"),
                                              _num(row["ib_tx_gbps"], "%.0f")), "dim"))
    if row["disk_read_mbs"] is not None:
        pieces.append(("  disk %sr %sw MB/s" % (_num(row["disk_read_mbs"], "%.0f"),
                                                _num(row["disk_write_mbs"], "%.0f")), "dim"))
    down = row["links_down"]
    if down:
        pieces.append(("  down: " + clean(",".join(down)), "bold red"))
    return tuple(pieces)


def host_lines(ns, width: int = 1000) -> list:
    """The node's host line, laid over as many lines as ``width`` needs (none without a
    host sample)."""
    pieces = host_pieces(ns)
    return wrapped((("  ", ""),) + pieces, width, "  ") if pieces else []


def heading_lines(name: str, ns, width: int, same_as: str | None = None) -> list:
    """The node's name and its GPU model and count, or why it has none (wrapped; ``no GPUs
    (as node0)`` when ``same_as``, a node above, said the same)."""
    gpus = (ns.gpu or {}).get("gpus") or []
    if gpus:
        models = sorted({clean(str(g.get("name") or "?")) for g in gpus})
        return wrapped(((name, "bold"), ("  %s x%d" % (", ".join(models), len(gpus)), "dim")),
                       width, "    ")
    why = "no GPUs (as %s)" % clean(same_as) if same_as else clean(no_gpu_text(ns.gpu))
    return wrapped(((name, "bold"), ("  " + why, "yellow" if ns.gpu else "dim")), width, "    ")


def same_reasons(state: RunState) -> dict:
    """Each node without GPUs whose reason a node before it gave word for word: that node
    (the reason is said once, not on every node of a CPU-only run)."""
    first: dict = {}
    same: dict = {}
    for name, ns in state.nodes.items():
        if ns.gpu and not ns.gpu.get("gpus"):
            why = no_gpu_text(ns.gpu)
            if why in first:
                same[name] = first[why]
            else:
                first[why] = name
    return same


def gpu_line(g: dict, ranks: list | None, guess: bool, width: int) -> tuple:
    """One GPU on one line, every figure whole with its unit:
    `` 0 ███████· 87%  41.0/80.0G  61°C  402/700W  1980MHz  r0``; in a narrow panel the
    least needed pieces are left out (the bar first), never cut."""
    bar, style = util_bar(g.get("util"))
    util, temp = g.get("util"), g.get("temp")
    power, limit = g.get("power"), g.get("power_limit")
    clock, ecc = g.get("sm_clock"), g.get("ecc_uncorrected")
    slowing = [r for r in g.get("throttle") or () if r in SLOWING]
    pieces = [
        ("%2s" % g.get("index"), "", 0),
        (" " + bar, style, 5),
        (" %s" % ("  -" if util is None else "%3d%%" % util), style, 0),
        ("  %s/%sG" % (gib(g.get("mem_used")), gib(g.get("mem_total"))), "", 0),
        ("  %s" % ("-°C" if temp is None else "%d°C" % temp),
         "bold red" if temp is not None and temp >= 85 else "", 1),
        ("  %s/%sW" % ("-" if power is None else "%.0f" % power,
                       "-" if limit is None else "%.0f" % limit), "", 1),
        ("  %dMHz" % clock if isinstance(clock, int) else "", "dim", 6),
        ("  " + ",".join(slowing) if slowing else "", "yellow", 3),
        ("  ECC %d" % ecc if isinstance(ecc, int) and ecc > 0 else "", "bold red", 1),
        ("  r" + rank_ranges(ranks) + ("?" if guess else "") if ranks else "", "cyan", 2),
    ]
    return fitted([p for p in pieces if p[0]], width)


def node_gpu_lines(state: RunState, name: str, ranks: list, width: int = 1000,
                   same_as: str | None = None) -> tuple:
    """A node's heading, host and GPU lines, as (text, style) pieces, fitted to ``width``."""
    ns = state.nodes[name]
    gpus = (ns.gpu or {}).get("gpus") or []
    lines = heading_lines(name, ns, width, same_as) + host_lines(ns, width)
    by_local: dict = {}
    by_pid: dict = {}
    for rs in ranks:
        by_local.setdefault(rs.local_rank, []).append(rs.rank)
        if rs.pid is not None:
            by_pid[rs.pid] = rs.rank
    for g in gpus:
        on_gpu = sorted({by_pid[p] for p in g.get("pids") or () if p in by_pid})
        lines.append(gpu_line(g, on_gpu or by_local.get(g.get("index")), not on_gpu, width))
    return tuple(lines)


class GpuPanel(RowsView):
    DEFAULT_CSS = """
    GpuPanel { height: 1fr; }
    """

    def __init__(self, state: RunState, **kwargs):
        super().__init__(header=None, cursor=False, **kwargs)
        self.state = state
        self._by_node: dict[str, list] = {}
        self._same: dict[str, str] = {}  # node -> the node above that gave its no-GPU reason

    def on_mount(self) -> None:
        self.refresh_rows()

    def lines(self) -> list[str]:
        return [line for node in self.state.nodes for line in self.row_text(node)]

    @property
    def line_width(self) -> int:
        """What a line may take: the panel's width less its scrollbar's column."""
        return max(MIN_WIDTH, self.size.width - 1)

    def on_resize(self) -> None:
        self.refresh_rows()

    def refresh_rows(self) -> None:
        """Re-read RunState: the shape now, the nodes on screen when painted."""
        self._by_node = ranks_by_node(self.state)
        self._same = same = same_reasons(self.state)
        nodes, width = list(self.state.nodes), self.line_width
        self.set_shape(nodes, [len(heading_lines(n, self.state.nodes[n], width, same.get(n))) +
                               len(host_lines(self.state.nodes[n], width)) +
                               len((self.state.nodes[n].gpu or {}).get("gpus") or [])
                               for n in nodes])
        self.invalidate()

    def row_lines(self, key: str) -> tuple:
        return node_gpu_lines(self.state, key, self._by_node.get(key, []), self.line_width,
                              self._same.get(key))
