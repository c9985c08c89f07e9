"""Changing a ScrollView's virtual size without a layout pass of the whole screen.

``Widget.virtual_size`` is a reactive with ``layout=True``: every change reflows every widget
of the screen and repaints all of their scrollbars. The log views change size on each flush
(ten times a second) and the tables whenever a line gets wider; in bench/tui.py (256 ranks,
50k lines/s) those layouts were most of the console's CPU. The views here are sized by CSS,
not by their content, so a new virtual size changes only their own scrollbars.
"""

from __future__ import annotations

from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.widget import Widget


def set_virtual_size(view: ScrollView, size: Size) -> None:
    old = view.virtual_size
    if size == old:
        return
    if not view.is_mounted or not view.container_size:
        view.virtual_size = size  # first sizing: let the layout happen
        return
    view.set_reactive(Widget.virtual_size, size)
    width, height = view.container_size
    shown = (view.show_horizontal_scrollbar, view.show_vertical_scrollbar)
    if shown != (size.width > width, size.height > height):
        # A scrollbar appears or goes: Textual's own update (private: internals.py) changes
        # its ``display``, which asks for the layout it needs.
        view._scroll_update(size)
    else:  # only the thumb of the scrollbar whose axis changed moves
        if size.height != old.height and view.show_vertical_scrollbar:
            view.vertical_scrollbar.window_virtual_size = size.height
        if size.width != old.width and view.show_horizontal_scrollbar:
            view.horizontal_scrollbar.window_virtual_size = size.width
        view.scroll_x = view.validate_scroll_x(view.scroll_x)
        view.scroll_y = view.validate_scroll_y(view.scroll_y)
    view.refresh()
