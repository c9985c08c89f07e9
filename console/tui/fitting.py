"""Lines that fit their width: pieces dropped by importance, or laid over more lines.

A line here is a sequence of ``(text, style)`` pieces (RowsView's form). ``fitted`` leaves
out the least important pieces until the line fits, so what stays is whole (``477/700W``,
never ``477/70``); ``wrapped`` breaks a line between its pieces (and a piece too long for a
line between its words), so nothing is cut at the edge.
"""

from __future__ import annotations

from .cells import width_of


def fitted(pieces: list[tuple[str, str, int]], width: int) -> tuple:
    """``(text, style, rank)`` pieces, the highest ``rank`` left out first (the last of
    equals first) until the rest fits ``width``; rank 0 pieces always stay."""
    kept = list(pieces)
    while sum(width_of(t) for t, _s, _r in kept) > width:
        droppable = [i for i, (_t, _s, rank) in enumerate(kept) if rank > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: (kept[i][2], i))
        del kept[worst]
    return tuple((text, style) for text, style, _rank in kept)


def wrapped(pieces: tuple, width: int, indent: str = "  ") -> list[tuple]:
    """One line of pieces laid over as many lines as ``width`` needs; a continued line
    starts with ``indent``, pieces' leading spaces dropped there."""
    lines: list[list] = [[]]
    used = 0
    for text, style in pieces:
        if not text:
            continue
        for word in _words(text, width - len(indent)):
            cells = width_of(word)
            if used and used + cells > width:
                lines.append([(indent, "")])
                used = len(indent)
                word = word.lstrip(" ")
                cells = width_of(word)
            lines[-1].append((word, style))
            used += cells
    return [tuple(line) for line in lines if line]


def _words(text: str, room: int) -> list[str]:
    """``text`` whole when it fits ``room``, else its words (each keeps its leading space)."""
    if width_of(text) <= room:
        return [text]
    out, word = [], ""
    for ch in text:
        if ch == " " and word.strip():
            out.append(word)
            word = ""
        word += ch
    return out + ([word] if word else [])
