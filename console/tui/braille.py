"""A braille dot canvas: each character cell holds 2 x 4 dots, so a plot gets 8 dots a cell.

Plain functions, no widget. ``plot`` draws series of (x, y) points as connected lines and
returns rows of (character, series index) so the caller can colour each cell.
"""

from __future__ import annotations

import math

# Dot bits of a braille cell, indexed [column][row] (U+2800 + bits).
_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def sample(points: list, most: int) -> list:
    """At most ``most`` points, evenly strided, always keeping the last one."""
    if len(points) <= most:
        return points
    stride = -(-len(points) // most)
    out = points[::stride]
    if out[-1] is not points[-1]:
        out.append(points[-1])
    return out


def finite_points(points: list) -> list:
    """The points whose x and y are both finite numbers (a diverged loss is inf or NaN)."""
    return [p for p in points if math.isfinite(p[0]) and math.isfinite(p[1])]


def _fraction(v: float, lo: float, hi: float) -> float:
    """Where ``v`` lies from ``lo`` (0) to ``hi`` (1), clamped; halves keep ``hi - lo`` finite
    for bounds as far apart as -1e308 and 1e308 (a full subtraction overflows to inf)."""
    span = hi / 2 - lo / 2
    if not span > 0:
        return 0.0
    f = (v / 2 - lo / 2) / span
    return min(1.0, max(0.0, f)) if f == f else 0.0


def bounds(series: list[list]) -> tuple[float, float, float, float] | None:
    """(x0, x1, y0, y1) around the finite points of every series, y padded 5 %; None if none."""
    pts = [p for s in series for p in finite_points(s)]
    if not pts:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 / 2 - y0 / 2 < 1e-12:
        y0, y1 = y0 - 1.0, y1 + 1.0
    pad = (y1 / 2 - y0 / 2) * 0.1
    return x0, max(x1, x0 + 1), max(-_FLOAT_MAX, y0 - pad), min(_FLOAT_MAX, y1 + pad)


_FLOAT_MAX = 1.7e308


def plot(series: list[list], width: int, height: int, box: tuple) -> list[list[tuple]]:
    """Rows of ``(char, series_index or -1)``; later series draw over earlier ones. Points that
    are not finite are left out; any finite ones fit (the box's span may exceed a float's)."""
    x0, x1, y0, y1 = box
    pw, ph = width * 2, height * 4
    bits = [[0] * width for _ in range(height)]
    owner = [[-1] * width for _ in range(height)]

    def dot(px: int, py: int, who: int) -> None:
        if 0 <= px < pw and 0 <= py < ph:
            cx, cy = px >> 1, py >> 2
            bits[cy][cx] |= _BITS[px & 1][py & 3]
            owner[cy][cx] = who

    for who, points in enumerate(series):
        columns: dict[int, list[float]] = {}
        for x, y in finite_points(points):
            px = int(_fraction(x, x0, x1) * (pw - 1))
            columns.setdefault(px, []).append(y)
        prev = None
        for px in sorted(columns):
            ys = columns[px]
            mean = sum(y / len(ys) for y in ys)  # a sum of large ys overflows
            py = int((1.0 - _fraction(mean, y0, y1)) * (ph - 1))
            if prev is not None:  # a line to the point before: the curve stays one curve
                (ax, ay), n = prev, max(abs(px - prev[0]), abs(py - prev[1]), 1)
                for k in range(1, n):
                    dot(ax + round((px - ax) * k / n), ay + round((py - ay) * k / n), who)
            dot(px, py, who)
            prev = (px, py)
    return [[(chr(0x2800 + bits[r][c]) if bits[r][c] else " ", owner[r][c])
             for c in range(width)] for r in range(height)]
