"""LogView: a ScrollView of log lines with filter, highlight, collapse, wrap and timestamps.

Lines are plain text (cleaned by console/lines/sanitize.py) and are never parsed as markup: each
becomes segments of its literal text with only our own styles (timestamp, who, matches).
Rendering is per visible row through ``render_line`` with an LRU cache of strips, so appending
thousands of lines costs list appends, not layout. Entries arrive in batches (``add_entries``)
into the view's :class:`~console.lines.window.EntryWindow`, which holds at most ``max_lines`` of
them while the view follows, ``SCROLLBACK`` more while paused; changing an option rebuilds
the shown lines from it.

Scrolling back: the window's floors say, per node, from which position on the view holds
every line of its source. Scrolling up at the top posts :class:`OlderWanted`; the pane
fetches what lies before the floors and puts it in front (``prepend_older``).
"""

from __future__ import annotations

import itertools
import re
from collections import deque

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from agent.rules.verdict import rank_ranges

from ..lines.text import clock_text
from ..lines.window import EntryWindow
from .cells import fit, width_of
from .messages import FollowChanged, OlderWanted, PausedScroll
from .lru import LRU
from .scrolling import set_virtual_size

CACHED_ROWS = 1024
SCROLLBACK = 50_000  # lines a paused view may hold beyond max_lines (fetched older ones)
RECENT = 1024  # how far back an identical line from another rank is collapsed into
MEASURED = 256  # the newest lines whose widths say how wide the pane's lines are
NODE_STYLES = ("cyan", "yellow", "magenta", "green", "blue", "bright_red", "bright_cyan",
               "bright_yellow", "bright_magenta", "bright_green", "bright_blue", "red")
_serial = itertools.count()


class LogLine:
    """One shown line: an entry, or identical entries of several ranks collapsed into one."""

    __slots__ = ("ts", "node", "rank", "text", "ranks", "serial", "version", "nrows", "journal",
                 "index")

    def __init__(self, ts, node, rank, text, journal=None, index=0):
        self.ts, self.node, self.rank, self.text = ts, node, rank, text
        self.journal, self.index = journal, index  # its position on its node (None: unknown)
        self.ranks: list | None = None
        self.serial = next(_serial)
        self.version = 0
        self.nrows = 1


class LogView(ScrollView, can_focus=True):
    """The lines of one log source; the parent pane decides which entries come in."""

    COMPONENT_CLASSES = {"logview--timestamp", "logview--who", "logview--match"}
    DEFAULT_CSS = """
    LogView {
        background: $surface;
        overflow: auto auto;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 1;
        &:focus { background-tint: $foreground 4%; }
        & > .logview--timestamp { color: $text-muted; }
        & > .logview--who { text-style: bold; }
        & > .logview--match { background: $warning 70%; color: $text; text-style: bold; }
    }
    """

    HELP_TITLE = "Log panes"
    # ScrollView's keys, described for what they do here (the help screen shows these).
    BINDINGS = [
        Binding("up", "scroll_up", "Scroll back a line (pauses following); at the top, "
                "fetch older lines from the hosts", show=False),
        Binding("down", "scroll_down", "Scroll down a line", show=False),
        Binding("pageup", "page_up", "Scroll back a page (pauses following); at the top, "
                "fetch older lines from the hosts", show=False),
        Binding("pagedown", "page_down", "Scroll down a page", show=False),
        Binding("home", "scroll_home", "The start of the log (fetched from the hosts)",
                show=False),
        Binding("end", "scroll_end", "The newest line, and follow again", show=False),
        Binding("left", "scroll_left", "Long lines: scroll sideways (with wrap off)",
                show=False),
        Binding("right", "scroll_right", "Long lines: scroll sideways (with wrap off)",
                show=False),
        Binding("ctrl+pageup", "page_left", "Long lines: a page sideways", show=False),
        Binding("ctrl+pagedown", "page_right", "Long lines: a page sideways", show=False),
    ]

    follow: var[bool] = var(True)

    def __init__(self, max_lines: int = 5000, multi_rank: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.max_lines = max_lines
        self.multi_rank = multi_rank
        self.show_node = False  # prefix lines with their node too (every rank merged)
        self.wrap = False
        self.timestamps = False
        self.collapse = False
        self.pattern: re.Pattern | None = None
        self.window = EntryWindow()  # what is held; _lines/_rows: what of it is shown
        self._lines: list[LogLine] = []
        self._rows: list[tuple[LogLine, int]] = []
        self._recent: dict[str, LogLine] = {}
        self._width = 0
        self.widths: deque = deque(maxlen=MEASURED)  # the newest lines' (align.py)
        self._wrap_width = 0
        # Rendered rows of recently shown lines (see _rows_of).
        self._cache = LRU(CACHED_ROWS)
        self._styles: dict | None = None

    # -- options (set by the pane; each rebuilds from the kept entries) -----------------
    def configure(self, *, wrap=None, timestamps=None, collapse=None, pattern=...,
                  multi_rank=None, show_node=None) -> None:
        if wrap is not None:
            self.wrap = wrap
        if timestamps is not None:
            self.timestamps = timestamps
        if collapse is not None:
            self.collapse = collapse
        if pattern is not ...:
            self.pattern = pattern
        if multi_rank is not None:
            self.multi_rank = multi_rank
        if show_node is not None:
            self.show_node = show_node
        self._rebuild()

    @property
    def limit(self) -> int:
        """Entries kept: ``max_lines`` while following, up to ``SCROLLBACK`` more while paused."""
        return self.max_lines if self.follow else self.max_lines + SCROLLBACK

    def set_entries(self, entries, floors: dict | None = None) -> None:
        """Replace everything shown (a pane switched source and refills from RunState)."""
        self.window.replace(entries, floors, self.limit)
        self._rebuild()

    def prepend_entries(self, entries: list) -> None:
        """Older kept entries in front of what is shown (a refill's backlog; floors include them)."""
        if entries:
            self.window.prepend(entries, self.limit)
            self._rebuild()

    def prepend_older(self, entries: list, floors: dict, to_start: bool = False) -> int:
        """Entries fetched from before the floors, in front; the lines on screen stay put
        (``to_start``: the view goes to the first line instead).

        ``floors``: the fetcher's, below what it handed out. Past the paused limit only the
        newest entries that fit are taken (EntryWindow.prepend_older). Returns how many were
        added.
        """
        taken = self.window.prepend_older(entries, floors, self.limit)
        if not taken:
            return 0
        before = self.line_count
        y = self.scroll_y
        self._rebuild()
        y = 0 if to_start else y + self.line_count - before
        # After the next refresh, like the key's own scroll that may still be pending.
        self.scroll_to(y=y, animate=False)
        return len(taken)

    def add_entries(self, entries: list) -> None:
        """Append a batch of entries (console/lines/lines.py ``Entry``), oldest first."""
        if not entries:
            return
        self.window.add(entries, self.limit)
        dropped = self._ingest(entries)
        self._after_change(dropped)

    @property
    def matches(self) -> int:
        """Lines shown that match the filter (0 without one)."""
        return len(self._lines) if self.pattern is not None else 0

    @property
    def line_count(self) -> int:
        return len(self._rows) if self.wrap else len(self._lines)

    def lines_text(self) -> list[str]:
        """The shown lines as plain text, one per line (not per wrapped row)."""
        return [self._plain(line) for line in self._lines]

    def entry_count(self) -> int:
        """Entries held (shown or filtered out)."""
        return len(self.window)

    @property
    def shown_lines(self) -> list[LogLine]:
        """The shown lines, oldest first (console/tui/align.py reads their positions)."""
        return self._lines

    # -- building lines ----------------------------------------------------------------
    def _rebuild(self) -> None:
        self._lines, self._rows, self._recent = [], [], {}
        self._width = 0
        self.widths.clear()
        self._cache.clear()
        self._wrap_width = max(1, self.scrollable_content_region.width) if self.is_mounted \
            else 80
        self._ingest(self.window.entries)
        self._after_change(0, rebuilt=True)

    def _ingest(self, entries) -> int:
        """Filter, collapse and append; returns how many rows were dropped from the top."""
        pattern = self.pattern
        collapse = self.collapse and self.multi_rank
        recent = self._recent
        lines = self._lines
        new: list[LogLine] = []
        regrow = False
        for ts, node, rank, text, journal, k in entries:
            if pattern is not None and pattern.search(text) is None:
                continue
            if collapse and rank is not None and rank >= 0:
                prev = recent.get(text)
                if prev is not None and prev.rank != rank and (
                        prev.ranks is None or rank not in prev.ranks):
                    if prev.ranks is None:
                        prev.ranks = [prev.rank]
                    prev.ranks.append(rank)
                    prev.version += 1
                    regrow = regrow or self.wrap
                    continue
            line = LogLine(ts, node, rank, text, journal, k)
            if collapse:
                recent.pop(text, None)
                recent[text] = line
                if len(recent) > RECENT:
                    del recent[next(iter(recent))]
            new.append(line)
        lines.extend(new)
        self.widths.extend(self._line_width(line) for line in new[-MEASURED:])
        if self.wrap:
            if regrow:  # a collapsed line got longer: its row count may have changed
                self._rebuild_rows()
            else:
                self._append_rows(new)
        else:
            for line in new:
                w = self._line_width(line)
                if w > self._width:
                    self._width = w
        dropped = 0
        # Trim at once (not in chunks): a constant height once full keeps the scrollbar
        # still, and a still scrollbar is not repainted ten times a second.
        if len(lines) > self.limit:
            cut = len(lines) - self.limit
            dropped = sum(line.nrows for line in lines[:cut]) if self.wrap else cut
            del lines[:cut]
            if self.wrap:
                del self._rows[:dropped]
        return dropped

    def _append_rows(self, lines) -> None:
        width = self._wrap_width
        rows = self._rows
        for line in lines:
            n = max(1, -(-self._line_width(line) // width))
            line.nrows = n
            rows.extend((line, k) for k in range(n))

    def _rebuild_rows(self) -> None:
        self._rows = []
        self._append_rows(self._lines)

    def _after_change(self, dropped: int, rebuilt: bool = False) -> None:
        if not self.is_mounted:
            return
        width = self._wrap_width if self.wrap else self._width
        set_virtual_size(self, Size(width, self.line_count))
        if self.follow and not self.is_vertical_scrollbar_grabbed:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        elif dropped and not rebuilt:
            self.scroll_to(y=max(0, self.scroll_y - dropped), animate=False, immediate=True)
        self.refresh()

    # -- composing and rendering -------------------------------------------------------
    def _who(self, line: LogLine) -> str:
        if line.ranks is not None and len(line.ranks) > 1:
            real = [r for r in line.ranks if r is not None and r >= 0]
            parts = [rank_ranges(real)] if real else []
            if len(real) < len(line.ranks):  # torchrun's own output (rank -1) said it too
                parts.append("torchrun")
            return "ranks %s: " % "+".join(parts)
        if not self.multi_rank:
            return ""
        node = line.node + " " if self.show_node else ""
        if line.rank is None:
            return "%s?: " % node
        if line.rank < 0:
            return "%storchrun: " % node
        return "%sr%d: " % (node, line.rank)

    def _line_width(self, line: LogLine) -> int:
        return (9 if self.timestamps else 0) + len(self._who(line)) + width_of(line.text)

    def _style(self, name: str) -> Style:
        """Our styles over the widget's base style, computed once per style change."""
        if self._styles is None:
            base = self.rich_style
            self._styles = {n: base + self.get_component_rich_style(n)
                            for n in self.COMPONENT_CLASSES}
            self._styles["base"] = base
            for colour in NODE_STYLES:
                self._styles[colour] = base + Style.parse(colour)
        return self._styles[name]

    def _plain(self, line: LogLine) -> str:
        ts = clock_text(line.ts) + " " if self.timestamps else ""
        return ts + self._who(line) + line.text

    def _segments(self, line: LogLine) -> list[Segment]:
        """The line as segments with our styles only: the text itself is never parsed."""
        segments = []
        if self.timestamps:
            segments.append(Segment(clock_text(line.ts) + " ", self._style("logview--timestamp")))
        who = self._who(line)
        if who:
            colour = NODE_STYLES[sum(map(ord, line.node or "")) % len(NODE_STYLES)]
            segments.append(Segment(who, self._style(colour)))
        text, base = line.text, self._style("base")
        if self.pattern is None:
            segments.append(Segment(text, base))
            return segments
        match_style, pos = self._style("logview--match"), 0
        for m in self.pattern.finditer(text):
            if m.end() > m.start():
                if m.start() > pos:
                    segments.append(Segment(text[pos:m.start()], base))
                segments.append(Segment(text[m.start():m.end()], match_style))
                pos = m.end()
        if pos < len(text):
            segments.append(Segment(text[pos:], base))
        return segments

    def _rows_of(self, line: LogLine, width: int) -> list[tuple[list[Segment], int]]:
        """The rows of a line as (segments, cells), each exactly ``width`` cells, cached.

        Segments, not Strips, are cached: Textual's compositor caches a Strip inside itself
        when it divides it (a reference cycle), so a Strip kept for seconds becomes garbage
        that only a full collection frees. A Strip made per render dies young.
        """
        key = (line.serial, line.version, width)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        length = self._line_width(line)
        base = self._style("base")
        segments = self._segments(line)
        if not self.wrap or length <= self._wrap_width:
            parts = [fit(segments, length, width, base)]
        else:
            step = self._wrap_width
            cuts = list(range(step, length, step)) + [length]
            parts = [fit(list(part), part.cell_length, width, base)
                     for part in Strip(segments, length).divide(cuts)]
        rows = [(part, width) for part in parts]
        self._cache[key] = rows
        return rows

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        index = scroll_y + y
        style = self._style("base")  # Widget.rich_style walks the DOM: ~0.3 ms a call
        if self.wrap:
            if index >= len(self._rows):
                return Strip.blank(width, style)
            line, k = self._rows[index]
            rows = self._rows_of(line, width)
            return Strip(*rows[k]) if k < len(rows) else Strip.blank(width, style)
        if index >= len(self._lines):
            return Strip.blank(width, style)
        line = self._lines[index]
        if scroll_x == 0:
            return Strip(*self._rows_of(line, width)[0])
        strip = Strip(self._segments(line), self._line_width(line))  # scrolled: not cached
        return strip.crop_extend(scroll_x, scroll_x + width, style)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._cache.clear()

    def on_resize(self, event: events.Resize) -> None:
        if self.wrap and self.scrollable_content_region.width != self._wrap_width:
            self._rebuild()  # following, it ends at the newest line (_after_change)
        elif self.follow and not self.is_vertical_scrollbar_grabbed:
            # a pane made taller or shorter (the panes stack where lines do not fit) keeps its
            # scroll_y: following, the newest line stays at the bottom (the snapshots at
            # 120x35 and 160x48 showed either, by the order of the lines and the layout)
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if not self.follow and round(old_value) != round(new_value):
            self.post_message(PausedScroll(self))

    # -- follow / pause ------------------------------------------------------------------
    def watch_follow(self, follow: bool) -> None:
        if follow and len(self.window) > self.max_lines:  # back to the live limit
            self.window.trim(self.limit)
            self._rebuild()
        if follow and self.is_mounted:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.post_message(FollowChanged(follow, self))

    def _up(self, home: bool = False) -> None:
        """Scrolling up: pause; already at the top (or going ``home``), ask for older lines."""
        self.follow = False
        if home or self.scroll_y <= 0:
            self.post_message(OlderWanted(to_start=home))

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._up()  # before Widget's own handler (Textual calls it next) scrolls

    def action_scroll_up(self) -> None:
        self._up()
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._up()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._up(home=True)  # the start of the log: older lines than memory holds too
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.follow = True
        super().action_scroll_end()
