"""Drawing the frame now, for a key that changed what a pane shows (`[ ] n`, a goto, Enter
or a click on the nodes table).

Textual draws what changed at its screen's update timer (up to 60 times a second), once each
changed widget has told the screen in a message of its own. At 512 ranks x 100 lines/s the
event loop ingests lines and redraws other widgets in between: the frame that answered a rank
switch came 10-35 ms of CPU after the switch (bench/tui.py, the slow keys traced). Drawing it
at once answers the key first; what it drew is not drawn again, and the rest of the screen
keeps to the timer.

This uses Textual's private ``Widget._repaint_required``, ``Screen._dirty_widgets`` and
``Screen._on_timer_update``: Textual has no public way to draw now (internals.py lists them;
tests/console/test_textual_internals.py fails if they go).
"""

from __future__ import annotations

from textual.screen import Screen


def paint_now(screen: Screen) -> None:
    """Draw the widgets of ``screen`` that asked to be repainted, now."""
    dirty = [w for w in screen.walk_children() if w._repaint_required and w.display]
    if not dirty:
        return
    for widget in dirty:
        widget._repaint_required = False  # drawn here: no second repaint of it
        screen._dirty_widgets.add(widget)
    screen._on_timer_update()
