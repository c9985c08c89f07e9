"""Short plain-text forms that the run's event texts and every view share.

Sizes, numbers, durations, clock times, rank ranges, a kill report in one line, and rows laid
out as columns. Pure functions of plain values: RunState's reducer uses them for event texts,
so this module imports nothing of the console.
"""

from __future__ import annotations

import time


def human_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``?`` for unknown."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "?"


def gib(n: float | None) -> str:
    """Bytes as GiB with one decimal, no unit (GPU memory columns)."""
    return "-" if n is None else "%.1f" % (n / 2 ** 30)


def fmt_float(v: float | None, digits: int = 4) -> str:
    """A loss or learning rate: fixed point, or exponent form when very small or large."""
    if v is None:
        return "-"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return "%.2e" % v
    return "%.*f" % (digits, v)


def hms(seconds: float | None) -> str:
    """A duration as ``H:MM:SS``; ``?`` for unknown."""
    if seconds is None:
        return "?"
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return "%d:%02d:%02d" % (h, rest // 60, rest % 60)


def clock_text(ts: float | None) -> str:
    """A timestamp as local ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "--:--:--"


def kill_summary(report: dict) -> str:
    """An agent's kill report in one line: what was signalled, killed, left, GPU memory."""
    if not report:
        return "nothing to kill"
    parts = ["%d process(es) signalled" % len(report.get("sigterm", []))]
    if report.get("killed"):
        parts.append("%d needed SIGKILL" % len(report["killed"]))
    if report.get("dstate"):
        parts.append("HOST NEEDS ATTENTION: %s stuck in uninterruptible sleep"
                     % report["dstate"])
    elif report.get("left"):
        parts.append("LEFT RUNNING: %s" % report["left"])
    elif isinstance(report.get("torchrun_exiting"), int):
        parts.append("workers gone, torchrun %s exiting (SIGKILL after the grace)"
                     % report["torchrun_exiting"])
    else:
        parts.append("none left")
    gpu = report.get("gpu")
    if gpu is not None:
        if gpu.get("held"):
            parts.append("GPU MEMORY STILL HELD: %s by %s" % (human_bytes(gpu["held"]),
                                                              gpu.get("pids")))
        else:
            parts.append("GPU memory freed")
    return ", ".join(parts)


def columns(rows: list[tuple[str, ...]], rule: bool = False) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart, one string a row; ``rule``
    puts a line of dashes under the first (heading) row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
