"""A node's telemetry as the views read it: one flat row per node, the odd node, hardware events.

The agent sends, once a second, a GPU snapshot and a host sample (docs/PROTOCOL.md, ``gpu``).
Both come from a host, so every value is checked here before it is used: a field that is not
a number reads as None ("n/a"), never an exception in a view.

- :func:`node_telemetry` folds one node's GPU snapshot, host sample and ranks into the flat
  row the nodes table, ``status --json`` (``nodes[].host``), ``export`` and ``report`` share.
- :func:`far_nodes` marks, per column, the nodes far from the others: further from the median
  than three scaled median absolute deviations (a robust z-score above 3), and at least a
  column's floor and 20 % of the median away, so 4 nodes at 95 % and one at 40 % stand out
  while 91 % vs 93 % does not.
- :func:`hardware_events` compares two telemetry messages of a node and says what happened in
  between: an Xid, new uncorrected or corrected ECC errors, a GPU starting to throttle, a
  network interface or InfiniBand port going down.
"""

from __future__ import annotations

import statistics

# the columns of a node's row, in the order the views show them
COLUMNS = ("gpu_util_min", "gpu_util_mean", "gpu_mem_used", "gpu_mem_total", "net_rx_gbps",
           "net_tx_gbps", "ib_rx_gbps", "ib_tx_gbps", "step_time", "tok_s", "cpu_pct",
           "mem_used", "mem_total", "load1", "disk_read_mbs", "disk_write_mbs",
           "gpu_temp_max", "gpu_power", "ecc_uncorrected", "xid_count")
# columns compared across nodes, and the least difference that counts as "far" for each
FAR_FLOORS = {"gpu_util_mean": 10.0, "net_rx_gbps": 0.5, "net_tx_gbps": 0.5,
              "step_time": 0.0, "tok_s": 0.0, "cpu_pct": 15.0}
FAR_Z = 3.0
FAR_RELATIVE = 0.2
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
# throttle reasons that slow a GPU down (gpu_idle and the clock settings do not)
SLOWING = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# no figure a host measures (bytes, Gbit/s, %, watts) comes near this; sums of a few stay finite
NUM_MAX = 1e18


def host_number(value) -> float | None:
    """A host's number, or None for anything else (text, bool, NaN, infinite or past
    ``NUM_MAX``: JSON's 1e400 or a 400-digit integer would overflow a mean or a format)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return value if -NUM_MAX <= value <= NUM_MAX else None


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _dicts(value) -> list[dict]:
    return [v for v in _list(value) if isinstance(v, dict)]


def _total(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values), 6) if values else None


def gpus_of(snap) -> list[dict]:
    return _dicts(snap.get("gpus")) if isinstance(snap, dict) else []


def node_telemetry(snap, host, ranks=(), hardware: dict | None = None) -> dict:
    """One node's row (``COLUMNS``, plus ``throttle`` and ``links_down``): every value may be
    None. ``snap``/``host``: the node's last GPU snapshot and host sample; ``ranks``: its
    RankStates (step time: their median; tokens/s: their sum). ``hardware``: what
    :func:`hardware_row` made of ``snap`` and ``host`` already (:func:`node_row` keeps it)."""
    row = hardware_row(snap, host) if hardware is None else dict(hardware)
    step_times = [t for t in (host_number(r.step_time) for r in ranks) if t is not None]
    row["step_time"] = statistics.median(step_times) if step_times else None
    row["tok_s"] = _total(host_number(r.tok_s) for r in ranks)
    return row


def node_row(ns, ranks=()) -> dict:
    """:func:`node_telemetry` of a NodeState: the hardware columns are made once for each
    GPU snapshot and host sample the node sends (at 64 nodes, making them for every node at
    each redraw of the nodes table was ~6 ms of the event loop at once)."""
    return node_telemetry(ns.gpu, ns.host, ranks, hardware_of(ns))


def hardware_of(ns) -> dict:
    """The node's :func:`hardware_row`, kept on it until its ``gpu`` or ``host`` changes."""
    kept = ns.hardware
    if kept is None or kept[0] is not ns.gpu or kept[1] is not ns.host:
        kept = ns.hardware = (ns.gpu, ns.host, hardware_row(ns.gpu, ns.host))
    return kept[2]


def hardware_row(snap, host) -> dict:
    """:func:`node_telemetry`'s row without the ranks' columns (None there)."""
    gpus = gpus_of(snap)
    host = host if isinstance(host, dict) else {}
    utils = [u for u in (host_number(g.get("util")) for g in gpus) if u is not None]
    temps = [t for t in (host_number(g.get("temp")) for g in gpus) if t is not None]
    ib = _dicts(host.get("ib"))
    disk = host.get("disk") if isinstance(host.get("disk"), dict) else {}
    load = _list(host.get("load"))
    return {
        "gpu_util_min": min(utils) if utils else None,
        "gpu_util_mean": round(statistics.fmean(utils), 1) if utils else None,
        "gpu_mem_used": _total(host_number(g.get("mem_used")) for g in gpus),
        "gpu_mem_total": _total(host_number(g.get("mem_total")) for g in gpus),
        "net_rx_gbps": host_number(host.get("net_rx_gbps")),
        "net_tx_gbps": host_number(host.get("net_tx_gbps")),
        "ib_rx_gbps": _total(host_number(p.get("rx_gbps")) for p in ib),
        "ib_tx_gbps": _total(host_number(p.get("tx_gbps")) for p in ib),
        "step_time": None,  # the ranks' (node_telemetry): here for the columns' order
        "tok_s": None,
        "cpu_pct": host_number(host.get("cpu_pct")),
        "mem_used": host_number(host.get("mem_used")),
        "mem_total": host_number(host.get("mem_total")),
        "load1": host_number(load[0]) if load else None,
        "disk_read_mbs": host_number(disk.get("read_mbs")),
        "disk_write_mbs": host_number(disk.get("write_mbs")),
        "gpu_temp_max": max(temps) if temps else None,
        "gpu_power": _total(host_number(g.get("power")) for g in gpus),
        "ecc_uncorrected": _total(host_number(g.get("ecc_uncorrected")) for g in gpus),
        "xid_count": _total(len(_list(g.get("xid"))) for g in gpus if g.get("xid") is not None),
        "throttle": sorted({str(r) for g in gpus for r in _list(g.get("throttle"))
                            if r in SLOWING}),
        "links_down": _links_down(host),
    }


def _links_down(host: dict) -> list[str]:
    names = [str(i.get("iface")) for i in _dicts(host.get("net")) if i.get("up") is False]
    return names + [str(p.get("port")) for p in _dicts(host.get("ib")) if p.get("up") is False]


def far_nodes(rows: dict[str, dict]) -> dict[str, set[str]]:
    """``{node: {column, ...}}``: the columns (``FAR_FLOORS``) in which a node is far from the
    other nodes. Needs three nodes with a value in that column; fewer have no "others"."""
    far: dict[str, set[str]] = {name: set() for name in rows}
    for column, floor in FAR_FLOORS.items():
        values = {n: r.get(column) for n, r in rows.items() if r.get(column) is not None}
        if len(values) < 3:
            continue
        median = statistics.median(values.values())
        mad = statistics.median(abs(v - median) for v in values.values())
        limit = max(FAR_Z * _MAD_TO_SIGMA * mad, FAR_RELATIVE * abs(median), floor)
        for name, value in values.items():
            if abs(value - median) > limit:
                far[name].add(column)
    return far


def hardware_events(old_snap, new_snap, old_host, new_host) -> list[tuple[str, str]]:
    """``[(kind, text), ...]`` that happened between two telemetry messages of one node."""
    events = []
    old_gpus = {g.get("index"): g for g in gpus_of(old_snap)}
    for gpu in gpus_of(new_snap):
        index = gpu.get("index")
        name = "GPU %s" % index
        for entry in _list(gpu.get("xid")):
            xid = host_number(entry[1]) if isinstance(entry, list) and len(entry) == 2 else None
            if xid is not None:
                events.append(("xid", "%s: Xid %d" % (name, xid)))
        old = old_gpus.get(index)
        if old is None:
            continue
        for key, words in (("ecc_uncorrected", "uncorrected"), ("ecc_corrected", "corrected")):
            before, now = host_number(old.get(key)), host_number(gpu.get(key))
            if before is not None and now is not None and now > before:
                events.append(("ecc", "%s: %d new %s ECC error%s (%d since the driver loaded)"
                               % (name, now - before, words, "" if now - before == 1 else "s",
                                  now)))
        started = [r for r in _list(gpu.get("throttle")) if r in SLOWING
                   and r not in _list(old.get("throttle"))]
        if started and old.get("throttle") is not None:
            events.append(("throttle", "%s: throttling (%s)" % (name, ", ".join(started))))
    was_up = _links_up(old_host) if isinstance(old_host, dict) else set()
    if isinstance(new_host, dict):
        events += [("link down", "%s is down" % link) for link in _links_down(new_host)
                   if link in was_up]
    return events


def _links_up(host: dict) -> set[str]:
    return ({str(i.get("iface")) for i in _dicts(host.get("net")) if i.get("up") is True} |
            {str(p.get("port")) for p in _dicts(host.get("ib")) if p.get("up") is True})


def _gbit(value) -> str:
    if value is None:
        return "-"
    return "%.0f" % value if value >= 100 else "%.1f" % value if value >= 0.1 else "%.2f" % value


def _pair(a, b, fmt) -> str:
    return "-" if a is None and b is None else "%s/%s" % (fmt(a), fmt(b))


def _pct(value) -> str:
    return "-" if value is None else "%.0f" % value


def row_cells(row: dict) -> list[tuple[str, tuple]]:
    """A node's row as short cells ``[(text, columns), ...]`` for one line of a narrow table:
    ``gpu 81/88%  net 41.2/40.8G  cpu 23%  0.52s  128k tok/s`` (what the host does not give
    is left out). ``columns``: the ``far_nodes`` columns a cell shows (to mark a far node);
    ``("alert",)`` for a cell that is bad news in itself (throttling, a link down)."""
    cells = []
    for label, low, high, fmt, columns in (
            ("gpu %s%%", "gpu_util_min", "gpu_util_mean", _pct, ("gpu_util_mean",)),
            ("net %sG", "net_rx_gbps", "net_tx_gbps", _gbit, ("net_rx_gbps", "net_tx_gbps")),
            ("ib %sG", "ib_rx_gbps", "ib_tx_gbps", _gbit, ())):
        if row.get(low) is not None or row.get(high) is not None:
            cells.append((label % _pair(row.get(low), row.get(high), fmt), columns))
    if row.get("cpu_pct") is not None:
        cells.append(("cpu %.0f%%" % row["cpu_pct"], ("cpu_pct",)))
    if row.get("step_time") is not None:
        cells.append(("%.2fs" % row["step_time"], ("step_time",)))
    if row.get("tok_s") is not None:
        tok = row["tok_s"]
        cells.append(("%s tok/s" % ("%.0fk" % (tok / 1000) if tok >= 10000 else "%.0f" % tok),
                      ("tok_s",)))
    if row.get("throttle"):
        cells.append(("throttled: " + ",".join(row["throttle"]), ("alert",)))
    if row.get("links_down"):
        cells.append(("down: " + ",".join(row["links_down"]), ("alert",)))
    return cells
