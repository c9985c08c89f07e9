"""RowsView: keyed rows of styled text lines; only the rows on screen are ever built.

The base of the nodes table and the GPU panel. With 256 ranks every row changes a few times
a second; a DataTable re-renders all its cells on any update. Here the subclass gives the
shape (row keys and how many lines each has) and builds a row's lines on demand
(``row_lines``), so a refresh costs the visible rows only. A line is a tuple of
``(text, style)`` pieces - plain strings and style names, never markup. Optional: a fixed
header line and a row cursor (up/down/pgup/pgdn/home/end, click; enter or a click on the
cursor row chooses it).
"""

from __future__ import annotations

from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .cells import width_of
from .guard import NA, shown_or
from .lru import LRU
from .scrolling import set_virtual_size


@lru_cache(maxsize=256)
def parse_style(style: str) -> Style:
    return Style.parse(style) if style else Style.null()


def line_strip(line: tuple) -> Strip:
    return Strip([Segment(text, parse_style(style)) for text, style in line if text],
                 sum(width_of(text) for text, _s in line))


def line_width(line: tuple | None) -> int:
    return sum(width_of(text) for text, _s in line) if line else 0


class RowsView(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"rowsview--cursor", "rowsview--header"}
    DEFAULT_CSS = """
    RowsView {
        background: $surface;
        overflow: auto auto;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 1;
        & > .rowsview--header { text-style: bold; color: $text-muted; }
        & > .rowsview--cursor { background: $panel-lighten-1; }
        &:focus > .rowsview--cursor { background: $accent 50%; }
    }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "Row up", show=False),
        Binding("down", "cursor(1)", "Row down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First row", show=False),
        Binding("end", "edge(1)", "Last row", show=False),
        Binding("enter", "choose", "Show the row's rank (or node merged) in the active pane; "
                "k/r then act on its node", show=False),
    ]

    def __init__(self, header: tuple | None = None, cursor: bool = True, **kwargs):
        """``header``: a line shown above the rows, not scrolled (None: no header line)."""
        super().__init__(**kwargs)
        self.header = header
        self.show_cursor = cursor
        self.cursor = 0  # row index
        self._keys: list[str] = []
        self._heights: list[int] = []
        self._starts: list[int] = []  # first line of each row
        self._lines: list[tuple[int, int]] = []  # (row index, line in row)
        self._built: dict[str, tuple] = {}  # rows built since the last invalidate()
        self._generation = 0
        self._width = 0  # the virtual width: the widest row built
        self._built_width = 0  # the widest row built since the last invalidate()
        self._cache = LRU(512)
        self._styles: dict | None = None

    # -- what subclasses provide -------------------------------------------------------
    def row_lines(self, key: str) -> tuple:
        """The lines of row ``key`` now: a tuple of lines of (text, style) pieces."""
        raise NotImplementedError

    def row_chosen(self, key: str) -> None:
        """Enter or a click on the cursor row; subclasses say what that means."""

    # -- shape and contents ------------------------------------------------------------
    def set_shape(self, keys: list[str], heights: list[int]) -> None:
        """The rows, in order, and how many lines each has; call ``invalidate`` after."""
        if keys == self._keys and heights == self._heights:
            return
        current = self.cursor_key
        self._keys, self._heights = list(keys), list(heights)
        self._starts, self._lines = [], []
        for i, height in enumerate(heights):
            self._starts.append(len(self._lines))
            self._lines.extend((i, j) for j in range(height))
        if current in keys:
            self.cursor = keys.index(current)
        self.cursor = max(0, min(self.cursor, len(keys) - 1))
        self._resize()

    def invalidate(self) -> None:
        """The data changed: rows on screen are rebuilt when next painted. The width shrinks
        to that of the rows built since the last call: one wide line during the launch
        ("NOT JOINED the rendezvous...") does not leave a scrollbar behind for good."""
        self._generation += 1
        if self._built and self._built_width < self._width:
            self._width = self._built_width
            self._resize()
        self._built.clear()
        self._built_width = 0
        self.refresh()

    def lines_of(self, key: str) -> tuple:
        lines = self._built.get(key)
        if lines is None:
            lines = self._built[key] = self._row_lines(key)
            width = max(line_width(line) for line in lines) if lines else 0
            self._built_width = max(self._built_width, width)
            if width > self._width:
                self._width = width
                self._resize()
        return lines

    @shown_or(lambda self, key: (((key.split(":", 1)[-1] + " " + NA, "dim"),),))
    def _row_lines(self, key: str) -> tuple:
        """row_lines, or the row's name and n/a when a value in it cannot be shown."""
        return self.row_lines(key)

    def _resize(self) -> None:
        width = max(self._width, line_width(self.header))
        set_virtual_size(self, Size(width, len(self._lines) + self._top))
        self.refresh()

    @property
    def _top(self) -> int:
        return 1 if self.header is not None else 0

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor] if self._keys and self.show_cursor else None

    def row_text(self, key: str) -> list[str]:
        """A row's lines as plain text (what the user reads)."""
        if key not in self._keys:
            return []
        return ["".join(text for text, _s in line) for line in self.lines_of(key)]

    def move_to(self, key: str) -> None:
        if key in self._keys:
            self.cursor = self._keys.index(key)
            self._cursor_moved()

    # -- rendering -------------------------------------------------------------------------
    def _style(self, name: str) -> Style:
        """Base and component styles, computed once per style change (Widget.rich_style
        walks the DOM, ~0.3 ms a call: too slow for every line)."""
        if self._styles is None:
            self._styles = {n: self.get_component_rich_style(n) for n in self.COMPONENT_CLASSES}
            self._styles["base"] = self.rich_style
        return self._styles[name]

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self._style("base")
        if self.header is not None and y == 0:
            strip = line_strip(self.header).apply_style(self._style("rowsview--header"))
            return strip.crop_extend(scroll_x, scroll_x + width, base)
        index = scroll_y + y - self._top
        if not 0 <= index < len(self._lines):
            return Strip.blank(width, base)
        row, j = self._lines[index]
        key = self._keys[row]
        on_cursor = self.show_cursor and row == self.cursor
        cache_key = (key, j, self._generation, on_cursor, width, scroll_x)
        cached = self._cache.get(cache_key)
        if cached is None:
            lines = self.lines_of(key)
            strip = line_strip(lines[j]) if j < len(lines) else Strip([])
            strip = Strip(Segment.apply_style(strip, base), strip.cell_length)
            strip = strip.crop_extend(scroll_x, scroll_x + width, base)
            if on_cursor:  # over the base style (apply_style would put it underneath)
                cursor = self._style("rowsview--cursor")
                strip = Strip(Segment.apply_style(strip, None, cursor), strip.cell_length)
            # Segments, not the Strip: see LogView._rows_of (reference cycles).
            cached = self._cache[cache_key] = (list(strip), strip.cell_length)
        return Strip(*cached)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._cache.clear()

    # Textual calls Widget's own focus and blur handlers as well, after these.
    def on_focus(self, event: events.Focus) -> None:
        self._styles = None  # the cursor style depends on focus
        self._cache.clear()
        self.refresh()

    def on_blur(self, event: events.Blur) -> None:
        self._styles = None
        self._cache.clear()
        self.refresh()

    # -- cursor ----------------------------------------------------------------------------
    def _cursor_moved(self) -> None:
        """Scroll so that every line of the cursor row is in view (below the header)."""
        if not self._keys:
            return
        row = self.cursor
        first = self._starts[row]
        last = first + self._heights[row] - 1
        height = max(1, self.scrollable_content_region.height - self._top)
        y = self.scroll_offset.y
        if first < y:
            y = first
        elif last >= y + height:
            y = last - height + 1
        self.scroll_to(y=y, animate=False, immediate=True)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        if self.show_cursor and self._keys:
            self.cursor = max(0, min(len(self._keys) - 1, self.cursor + delta))
            self._cursor_moved()
        else:
            self.scroll_relative(y=delta, animate=False)

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        self.action_cursor(len(self._keys) if end else -len(self._keys))

    def action_choose(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.row_chosen(key)

    def on_click(self, event: events.Click) -> None:
        index = event.y + self.scroll_offset.y - self._top
        if not self.show_cursor or not 0 <= index < len(self._lines):
            return
        row = self._lines[index][0]
        if row == self.cursor:
            self.row_chosen(self._keys[row])
        self.cursor = row
        self._cursor_moved()
