"""Log panes side by side where their lines fit, and aligned by step there (plain helpers over
LogViews; LogPanes in console/tui/logs.py applies them).

Side by side or stacked: the panes stand side by side when each would be wide enough for its
lines (nine in ten of the newest: a long warning does not count), and stack otherwise. A
rank's step line is about 62 columns, so at 160 columns with the side panels hidden (``z``)
two panes stand side by side, at 240 three; at 120, or with the side panels shown at 160,
they stack. Before any line, a step line's width is assumed.

Aligned by step: a rank's steps are where its step metrics were read (console/model/buffers.py
``StepMarks``). While the active pane is paused and the panes stand side by side, scrolling it
scrolls the other rank panes so that the newest step it shows whole sits on the same row in
each; where ranks print a different number of lines per step, that one step is aligned and
the rows around it are not. Following, every pane shows its newest line at the bottom.
"""

from __future__ import annotations

from ..model.sources import RANK
from ..model.state import RunState

ASSUMED = 64  # a step line's width (step, loss, lr, step time, tok/s), before any line comes
CHROME = 2  # a pane's cells that are not its lines': its left border and its scrollbar


def needed_width(views) -> int:
    """The cells a pane needs for its lines: the widest of the views' typical widths."""
    widths = [typical_width(v.widths) for v in views]
    return max((w for w in widths if w), default=ASSUMED)


def typical_width(widths) -> int:
    """Cells that nine in ten of ``widths`` fit in; 0 for none."""
    if not widths:
        return 0
    ordered = sorted(widths)
    return ordered[(len(ordered) - 1) * 9 // 10]


def side_by_side(width: int, panes: int, line_width: int) -> bool:
    """Whether ``panes`` panes of whole ``line_width`` lines fit next to each other."""
    return panes <= 1 or panes * (line_width + CHROME) <= width


def line_at(lines, node: str, journal: int, index: int) -> int | None:
    """The index in ``lines`` (LogLines, in position order per node) of the last line of
    ``node`` at or before position ``(journal, index)``; None when there is none."""
    lo, hi, target = 0, len(lines), (journal, index)
    while lo < hi:
        mid = (lo + hi) // 2
        line = lines[mid]
        if line.node == node and line.journal is not None and (line.journal, line.index) > target:
            hi = mid
        else:
            lo = mid + 1
    for i in range(lo - 1, -1, -1):
        if lines[i].node == node:
            return i
        if lo - i > 64:  # other nodes' lines only: none of this node near
            return None
    return None


def step_rows(view, marks) -> list[tuple[int, int]]:
    """``(step, line index)`` of each marked step shown in ``view``, oldest first."""
    lines, rows = view.shown_lines, []
    for step, (node, journal, index) in marks:
        at = line_at(lines, node, journal, index)
        if at is not None:
            rows.append((step, at))
    return rows


def anchor(view, marks) -> tuple[int, int] | None:
    """``(step, row on screen)`` of the newest step whose line ``view`` shows."""
    top = round(view.scroll_y)
    bottom = top + view.scrollable_content_region.height - 1
    for step, at in reversed(step_rows(view, marks)):
        if top <= at <= bottom:
            return step, at - top
        if at < top:
            return None
    return None


def align(state: RunState, leader, others) -> None:
    """Scroll the LogPanes ``others`` so their line of the step the ``leader`` pane shows
    newest is on its row (each pauses). Rank panes only, wrap off."""
    if leader.source[0] != RANK or leader.view.wrap:
        return
    rs = state.ranks.get(leader.source[1])
    found = anchor(leader.view, rs.step_marks) if rs is not None else None
    if found is None:
        return
    step, row = found
    for pane in others:
        other = state.ranks.get(pane.source[1]) if pane.source[0] == RANK else None
        if other is None or pane.view.wrap:
            continue
        rows = [at for s, at in step_rows(pane.view, other.step_marks) if s <= step]
        if rows:
            view = pane.view
            view.follow = False
            view.scroll_to(y=max(0, rows[-1] - row), animate=False, immediate=True)
