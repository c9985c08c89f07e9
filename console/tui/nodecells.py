"""The nodes table's detail column fitted to the room it has: whole cells, never a cut figure.

A node row's telemetry (console/model/telemetry.py ``row_cells``: ``gpu 84/86%  net 1.2/0.9G ...``)
and a rank row's detail (``loss 1.400  0.50s/step``) are longer than the column left to them
in a narrow side column (7 cells at 120x35). Cells are kept by importance, each in its full
form or, when that does not fit, a deliberate short one with its unit (``gpu 86%`` is the
mean of ``gpu 84/86%``, ``net 1.2G`` the larger of ``net 1.2/0.9G``); a cell that fits in
neither is left out, never cut at the column's edge (which read ``net 0.00/0.``).
"""

from __future__ import annotations

from .cells import width_of

GAP = "  "
# a node state Slurm has not up and well, as short as sinfo's own compact states (%t)
SLURM_SHORT = {"draining": "drain", "drained": "drain", "down": "down", "failing": "fail",
               "fail": "fail", "not_responding": "down*", "maint": "maint",
               "reboot_requested": "reboot", "unknown": "unk"}


def short_form(text: str, row: dict) -> str:
    """The abbreviated form of a node telemetry cell ``text`` (itself if it has none)."""
    if text.startswith("gpu "):
        value = row.get("gpu_util_mean")
        value = row.get("gpu_util_min") if value is None else value
        return "gpu %.0f%%" % value if value is not None else text
    for label, rx, tx in (("net", "net_rx_gbps", "net_tx_gbps"),
                          ("ib", "ib_rx_gbps", "ib_tx_gbps")):
        if text.startswith(label + " "):
            values = [v for v in (row.get(rx), row.get(tx)) if v is not None]
            return "%s %sG" % (label, _gbit(max(values))) if values else text
    if text.startswith("slurm "):  # "slurm draining (disk full)" -> sinfo's own "drain"
        state = text[len("slurm "):].split(" (", 1)[0].split(",", 1)[0]
        return SLURM_SHORT.get(state, state[:6])
    if text.endswith(" tok/s"):
        return text[:-len(" tok/s")] + " t/s"
    if ": " in text:  # "throttled: hw_slowdown,power" -> "throttled"
        return text.split(": ", 1)[0]
    return text


def fit_cells(cells: list[tuple[str, str, int]], room: int | None) -> list[tuple[int, str]]:
    """``(full, short, importance)`` cells (0 the most important) fitted into ``room`` cells
    with GAP between them: ``[(index, text), ...]`` in the cells' order. The most important
    first, each whole or short or left out; ``room`` None: every cell whole."""
    if room is None:
        return [(i, full) for i, (full, _short, _imp) in enumerate(cells)]
    chosen: dict[int, str] = {}
    used = 0
    for i in sorted(range(len(cells)), key=lambda i: (cells[i][2], i)):
        full, short, _imp = cells[i]
        for form in (full, short):
            cost = width_of(form) + (len(GAP) if chosen else 0)
            if used + cost <= room:
                chosen[i] = form
                used += cost
                break
    return sorted(chosen.items())


def _gbit(value: float) -> str:
    return "%.0f" % value if value >= 10 else "%.1f" % value if value >= 0.1 else "%.2f" % value
