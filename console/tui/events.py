"""EventsLog: the run's events in time order, one line each (eventlines.py says how they
read); EventsScreen (Enter on the pane): every event in full, checkpoint paths included.

A low-rate feed, so a RichLog; every text is cleaned and added as ``Text`` (never markup).
Events from different nodes can arrive out of order (a node's journal is replayed after it
connects), and a checkpoint's line changes as each node's save comes in: then the log is
redrawn, once for a burst. The latest alert (a crash, a stall, a verdict...) is pinned under
the pane, so it is never scrolled away among the saves.
"""

from __future__ import annotations

import bisect

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import RichLog, Static

from ..lines.sanitize import clean
from ..model.state import EVENTS, RunState
from ..model.nodes import Event
from ..lines.text import clock_text
from .eventlines import ALERTS, checkpoint_step, folded, item_text, pinned_text, who_of


class EventsLog(RichLog):
    DEFAULT_CSS = """
    EventsLog { height: 1fr; background: $surface; scrollbar-size-vertical: 1; }
    """
    BINDINGS = [Binding("enter", "details", "Events in full (checkpoint paths)")]

    def __init__(self, state: RunState, secrets=(), **kwargs):
        super().__init__(max_lines=EVENTS, markup=False, highlight=False, wrap=True,
                         min_width=20, auto_scroll=True, **kwargs)
        self.state = state
        self.secrets = tuple(secrets or ())
        self._events: list[tuple[float, int, Event]] = []
        self._count = 0
        self._redraw_pending = False
        self._steps_shown: set[str] = set()  # checkpoint steps with a line already
        self._alerts: list[Event] = []
        self._width = 0
        self._written: list[tuple] = []  # what each line shows (_key), in order

    @property
    def events(self) -> list[Event]:
        return [ev for _ts, _n, ev in self._events]

    @property
    def shown(self) -> list[str]:
        """The pane's lines as plain text, as the user reads them (before any cut)."""
        return [item_text(item, self.state, self.secrets).plain
                for item in folded(self.events)]

    @property
    def pinned(self) -> str:
        text = pinned_text(self._alerts, self.secrets)
        return "" if text is None else text.plain

    def on_mount(self) -> None:
        for ev in list(self.state.events):
            self.add(ev)

    def on_resize(self) -> None:
        width = self.scrollable_content_region.width
        if width != self._width:  # lines are cut to the width when written: all again
            self._width = width
            self._written = []
            self._schedule_redraw()

    def add(self, ev: Event) -> None:
        self._count += 1
        item = (ev.ts or 0.0, self._count, ev)
        late = bool(self._events) and item < self._events[-1]
        bisect.insort(self._events, item)
        if len(self._events) > EVENTS:
            del self._events[: len(self._events) - EVENTS]
            late = True
        if ev.kind in ALERTS:
            self._alerts = [e for e in self.events if e.kind in ALERTS]
            self.border_subtitle = pinned_text(self._alerts, self.secrets)
        step = checkpoint_step(ev)
        if late or self._redraw_pending or step in self._steps_shown:
            self._schedule_redraw()  # an earlier line, or a step's line, changes
        else:
            item = (step, [ev])
            if step is not None:
                self._steps_shown.add(step)
            self.write(item_text(item, self.state, self.secrets))
            self._written.append(_key(item))

    def _schedule_redraw(self) -> None:
        if not self._redraw_pending:  # one redraw for a burst of events
            self._redraw_pending = True
            self.call_after_refresh(self._redraw)

    def _redraw(self) -> None:
        """The lines from the first that changed on: a step's line changes as each node's
        save comes in, and rewriting the whole pane for each (2,000 events) took 150-400 ms
        of the event loop, a key's wait at a 64-node save. Every item is one line (no wrap),
        so line i is item i; when that does not hold (not sized yet), all is written again."""
        self._redraw_pending = False
        items = folded(self.events)
        keys = [_key(item) for item in items]
        same = 0
        if len(self.lines) == len(self._written):
            while same < min(len(keys), len(self._written)) and keys[same] == self._written[same]:
                same += 1
        else:
            self.clear()
        if same < len(self.lines):  # the lines after those that stay, taken off
            del self.lines[same:]
            self._line_cache.clear()
        self._written = keys[:same]
        self._steps_shown = {step for step, _evs in items if step is not None}
        for item, key in zip(items[same:], keys[same:]):
            self.write(item_text(item, self.state, self.secrets))
            self._written.append(key)

    def action_details(self) -> None:
        self.app.push_screen(EventsScreen(self.events, self.secrets))


def _key(item: tuple) -> tuple:
    """What a line shows: a step and how many of its events, or the one event."""
    step, events = item
    return (step, len(events)) if step is not None else (None, id(events[0]))


def full_text(ev: Event, secrets=()) -> Text:
    """An event as RunState worded it, wrapped, nothing left out."""
    text = Text()
    text.append(clock_text(ev.ts) + " ", "dim")
    who = who_of(ev)
    if who:
        text.append(clean(who, secrets) + " ", "bold")
    text.append(ev.kind + ": ", ALERTS.get(ev.kind, "cyan"))
    text.append(clean(ev.text, secrets))
    return text


class EventsScreen(ModalScreen[None]):
    """Every event the pane holds, unfolded and in full (each node's checkpoint path)."""

    DEFAULT_CSS = """
    EventsScreen { align: center middle; }
    EventsScreen > RichLog {
        width: 90%; height: 90%; padding: 0 1; border: thick $accent; background: $surface;
    }
    EventsScreen > Static { dock: bottom; width: 100%; height: 1; color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("q", "dismiss", "Close")]

    def __init__(self, events: list[Event], secrets=(), **kwargs):
        super().__init__(**kwargs)
        self.events = events
        self.secrets = secrets

    @property
    def lines(self) -> list[str]:
        return [full_text(ev, self.secrets).plain for ev in self.events]

    def compose(self) -> ComposeResult:
        yield RichLog(markup=False, highlight=False, wrap=True, id="all-events")
        yield Static(Text("every event in full, oldest first   esc: close"))

    def on_mount(self) -> None:
        log = self.query_one(RichLog)
        log.border_title = "events in full"
        for ev in self.events:
            log.write(full_text(ev, self.secrets))
        log.focus()
