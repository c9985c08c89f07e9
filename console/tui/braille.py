"""A braille dot canvas: each character cell holds 2 x 4 dots, so a plot gets 8 dots a cell.

Plain functions, no widget. ``plot`` draws series of (x, y) points as connected lines and
returns rows of (character, series index) so the caller can colour each cell.
"""

from __future__ import annotations

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


def bounds(series: list[list]) -> tuple[float, float, float, float] | None:
    xs = [p[0] for s in series for p in s]
    ys = [p[1] for s in series for p in s if p[1] == p[1]]  # NaN-free
    if not xs or not ys:
        return None
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 1.0, y1 + 1.0
    pad = (y1 - y0) * 0.05
    return x0, max(x1, x0 + 1), y0 - pad, y1 + pad


def plot(series: list[list], width: int, height: int, box: tuple) -> list[list[tuple]]:
    """Rows of ``(char, series_index or -1)``; later series draw over earlier ones."""
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
        for x, y in points:
            if y != y:  # NaN
                continue
            px = int((x - x0) / (x1 - x0) * (pw - 1))
            columns.setdefault(px, []).append(y)
        prev = None
        for px in sorted(columns):
            ys = columns[px]
            py = int((y1 - sum(ys) / len(ys)) / (y1 - y0) * (ph - 1))
            if prev is not None and px - prev[0] <= 4:
                lo, hi = sorted((prev[1], py))
                for yy in range(lo, hi + 1):
                    dot(px if yy != prev[1] else prev[0], yy, who)
            dot(px, py, who)
            prev = (px, py)
    return [[(chr(0x2800 + bits[r][c]) if bits[r][c] else " ", owner[r][c])
             for c in range(width)] for r in range(height)]
