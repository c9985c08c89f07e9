"""EventsLog: the run's events in time order - checkpoints, restarts, exits, stalls.

A low-rate feed, so a RichLog; every text is cleaned and added as ``Text`` (never markup).
Events from different nodes can arrive out of order (a node's journal is replayed after it
connects): an event older than the newest shown is put in its place and the log redrawn.
"""

from __future__ import annotations

import bisect

from rich.text import Text
from textual.widgets import RichLog

from ..sanitize import clean
from ..state import EVENTS, Event, RunState
from ..text import clock_text

KIND_STYLE = {
    "checkpoint": "green", "launched": "cyan", "rendezvous": "cyan", "restarting": "magenta",
    "restarted": "magenta", "reconnected": "cyan", "killed": "magenta", "stopping": "magenta",
    "exited": "green", "stopped": "dim", "failed": "bold red", "lost": "bold red",
    "unreachable": "bold red", "stalled": "bold yellow", "recovered": "green",
}


def event_text(ev: Event, secrets=()) -> Text:
    text = Text(overflow="fold")
    text.append(clock_text(ev.ts) + " ", "dim")
    who = (ev.node or "") + ("/r%d" % ev.rank if ev.rank is not None else "")
    if who:
        text.append(who + " ", "bold")
    text.append(ev.kind, KIND_STYLE.get(ev.kind, ""))
    text.append(" " + clean(ev.text, secrets))
    return text


class EventsLog(RichLog):
    DEFAULT_CSS = """
    EventsLog { height: 1fr; background: $surface; scrollbar-size-vertical: 1; }
    """

    def __init__(self, state: RunState, secrets=(), **kwargs):
        super().__init__(max_lines=EVENTS, markup=False, highlight=False, wrap=True,
                         min_width=20, auto_scroll=True, **kwargs)
        self.state = state
        self.secrets = tuple(secrets or ())
        self._events: list[tuple[float, int, Event]] = []
        self._count = 0
        self._redraw_pending = False

    @property
    def shown(self) -> list[str]:
        return [event_text(ev, self.secrets).plain for _ts, _n, ev in self._events]

    def on_mount(self) -> None:
        for ev in list(self.state.events):
            self.add(ev)

    def add(self, ev: Event) -> None:
        self._count += 1
        item = (ev.ts or 0.0, self._count, ev)
        late = bool(self._events) and item < self._events[-1]
        bisect.insort(self._events, item)
        if len(self._events) > EVENTS:
            del self._events[: len(self._events) - EVENTS]
            late = True
        if late or self._redraw_pending:
            if not self._redraw_pending:  # one redraw for a burst of late events
                self._redraw_pending = True
                self.call_after_refresh(self._redraw)
        else:
            self.write(event_text(ev, self.secrets))

    def _redraw(self) -> None:
        self._redraw_pending = False
        self.clear()
        for _ts, _n, ev in self._events:
            self.write(event_text(ev, self.secrets))
