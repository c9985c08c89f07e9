"""RunFeed: RunState callbacks adapted into app messages, batched and throttled.

RunState calls back once per journal record (thousands a second on a big run). Posting a
message each time would swamp the app, so lines are kept per watched source and posted as
one :class:`LogLines` every ``flush_s``; state changes become at most one :class:`RunChanged`
every ``change_s``. Lines of sources no pane shows are not kept here: a pane that starts
showing a source refills from RunState's own bounded buffers.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from ..lines.lines import Entry
from ..lines.sanitize import clean
from ..model.sources import ALL, NODE, RANK, rank_of
from ..model.state import RunState
from ..model.nodes import Event, LineBatch
from .messages import LogLines, RunChanged, RunEventAdded

PENDING_CAP = 5000  # per source between two flushes; more than a pane would keep anyway


class RunFeed:
    def __init__(self, state: RunState, target, secrets=(), flush_s: float = 0.1,
                 change_s: float = 0.5):
        self.state = state
        self.target = target  # anything with post_message (the app)
        self.secrets = tuple(secrets or ())
        self.flush_s = flush_s
        self.change_s = change_s
        self.watched: frozenset = frozenset()
        self._pending: dict[tuple, list] = defaultdict(list)
        self._flush_handle: asyncio.TimerHandle | None = None
        self._change_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.state.line_listeners.append(self._on_lines)
        self.state.event_listeners.append(self._on_event)
        self.state.change_listeners.append(self._on_change)

    def close(self) -> None:
        for listeners, cb in ((self.state.line_listeners, self._on_lines),
                              (self.state.event_listeners, self._on_event),
                              (self.state.change_listeners, self._on_change)):
            if cb in listeners:
                listeners.remove(cb)
        for handle in (self._flush_handle, self._change_handle):
            if handle is not None:
                handle.cancel()
        self._flush_handle = self._change_handle = None
        self._pending.clear()

    def watch(self, sources) -> None:
        """Follow exactly these sources from now on; lines of others are dropped here."""
        self.watched = frozenset(sources)
        for key in [k for k in self._pending if k not in self.watched]:
            del self._pending[key]

    # -- callbacks from RunState (on the event loop) -----------------------------------
    def _on_lines(self, batch: LineBatch) -> None:
        watched = self.watched
        if not watched or not batch.lines:
            return
        keys = []
        if batch.rank is not None and (RANK, batch.rank) in watched:
            keys.append((RANK, batch.rank))
        if (NODE, batch.node) in watched:
            keys.append((NODE, batch.node))
        if (ALL, None) in watched:
            keys.append((ALL, None))
        if not keys:
            return
        secrets = self.secrets
        ts, node, journal = batch.ts or None, batch.node, batch.journal
        rank = rank_of(batch.rank, batch.stream)
        entries = [Entry(ts, node, rank, clean(line, secrets), journal, k)
                   for k, line in enumerate(batch.lines)]
        for key in keys:
            pending = self._pending[key]
            pending.extend(entries)
            if len(pending) > PENDING_CAP:
                del pending[: len(pending) - PENDING_CAP]
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(self.flush_s,
                                                                       self._flush)

    def _on_event(self, event: Event) -> None:
        self.target.post_message(RunEventAdded(event))
        self._on_change(event.node or "")

    def _on_change(self, node: str) -> None:
        if self._change_handle is None:
            self._change_handle = asyncio.get_running_loop().call_later(self.change_s,
                                                                        self._changed)

    # -- flushes -----------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_handle = None
        if self._pending:
            lines, self._pending = dict(self._pending), defaultdict(list)
            self.target.post_message(LogLines(lines))

    def _changed(self) -> None:
        self._change_handle = None
        self.target.post_message(RunChanged())

