"""Terminal cells of plain text: how wide a string is, and segments cut to a width.

Shared by the views that render their own rows (LogView, RowsView) without building Strips.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style


def width_of(s: str) -> int:
    return len(s) if s.isascii() else cell_len(s)


def fit(segments: list[Segment], length: int, width: int, pad: Style) -> list[Segment]:
    """Segments cut or padded to exactly ``width`` cells (no intermediate Strips)."""
    if length == width:
        return segments
    if length < width:
        return segments + [Segment(" " * (width - length), pad)]
    out, used = [], 0
    for segment in segments:
        cells = width_of(segment.text)
        if used + cells <= width:
            out.append(segment)
            used += cells
            if used == width:
                break
        else:
            out.append(Segment(set_cell_size(segment.text, width - used), segment.style))
            break
    return out
