"""LogPane: one log pane, a title line and a LogView following one source.

The source is a rank, a whole node (its ranks and torchrun merged, prefixed) or every rank.
Switching source refills the view from RunState's kept lines; afterwards the parent hands it
each flushed batch of that source only. Scrolling up past the top fetches older lines from
the nodes' journals (console/model/scrollback.py), a page at a time.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..lines.sanitize import cleaned, shown_text
from ..model.scrollback import (
    Fetch, Scrollback, entries_of, kept_chunks, newest_positions, split_newest
)
from ..model.sources import ALL, NODE, RANK, source_label, streams_of
from ..model.state import RunState
from ..model.nodes import LINES_PER_RANK
from .logview import LogView
from .messages import OlderWanted
from .styles import state_style

FIRST_PAINT = 300  # lines shown at once when a pane switches source; the rest follow


class LogPane(Vertical):
    """A titled log view; ``source`` says which lines it shows."""

    DEFAULT_CSS = """
    LogPane {
        width: 1fr;
        height: 1fr;
        border-left: vkey $panel;
        & > .logpane--title { height: 1; width: 100%; background: $panel; color: $text-muted; }
        &.-active > .logpane--title { background: $accent 40%; color: $text; }
    }
    """

    def __init__(self, number: int, source: tuple, fetch: Fetch | None = None, **kwargs):
        super().__init__(**kwargs)
        self.number = number
        self.source = source
        self.last_rank = source[1] if source[0] == RANK else 0
        self.fetch = fetch  # RunController.scrollback (None: no scrolling back)
        self.state: RunState | None = None
        self.secrets = ()
        self.older_status: str | None = None  # shown in the title: fetching, start of log...
        self._scrollback: Scrollback | None = None
        self._scrollback_version = -1
        self._generation = 0
        self._refilled_to: dict = {}
        self._filling = False  # the kept backlog is not in the view yet
        self._fetching = False
        self._shown: list = []  # the Kept buffers this pane protects from the line budget

    def compose(self) -> ComposeResult:
        yield Static(classes="logpane--title")
        multi = self.source[0] != RANK
        yield LogView(max_lines=(2 if multi else 1) * LINES_PER_RANK, multi_rank=multi)

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def show(self, source: tuple, state: RunState, secrets=()) -> None:
        """Follow ``source`` from now on, refilled from what RunState kept.

        The newest screenful or so is shown at once; the older kept lines are cleaned and
        put in front after the next refresh, so switching panes answers within a frame.
        """
        self.source = source
        self.state, self.secrets = state, tuple(secrets or ())
        self._generation += 1
        self._scrollback, self.older_status = None, None
        if source[0] == RANK:
            self.last_rank = source[1]
        view = self.view
        multi = source[0] != RANK
        # as many as RunState keeps of a rank; twice that for a merge of several
        view.max_lines = (2 if multi else 1) * state.lines_per_rank
        view.multi_rank = multi
        view.show_node = source[0] == ALL
        view.follow = True
        taken, floors = kept_chunks(state, source, view.max_lines)
        # the feed may hold lines of this source already in ``taken`` (another pane shows it)
        self._refilled_to = newest_positions(taken)
        older, newest = split_newest(taken, FIRST_PAINT)
        view.set_entries(entries_of(newest, shown_text(secrets)), floors)
        self._filling = bool(older)
        if older:
            self.call_after_refresh(self._backfill, self._generation, older, secrets)
        self.update_title(state)

    def add_entries(self, entries: list) -> None:
        """New lines of this pane's source (a feed flush)."""
        views = self.query(LogView)
        if not views:  # not composed yet, or being removed (seen in test_tui_stuck under
            return  # load): its show() refills from what RunState kept, these lines among them
        if self._refilled_to:
            entries = self._not_refilled(entries)
        if entries:
            views.first().add_entries(entries)

    def _not_refilled(self, entries: list) -> list:
        """``entries`` less those the last refill showed; a node's mark goes once passed."""
        marks = self._refilled_to
        fresh = []
        for entry in entries:
            mark = marks.get(entry.node)
            if mark is not None and entry.journal is not None:
                if entry.position <= mark:
                    continue
                del marks[entry.node]  # lines of a node come in order: the rest are new
            fresh.append(entry)
        return fresh

    def _backfill(self, generation: int, older: list, secrets) -> None:
        if generation == self._generation:  # still showing the same source
            self.view.prepend_entries(entries_of(older, shown_text(secrets)))
            self._filling = False

    # -- older lines from the nodes ------------------------------------------------------
    def on_older_wanted(self, message: OlderWanted) -> None:
        message.stop()
        if self.fetch is None or self.state is None or self._filling or self._fetching:
            return
        self._fetching = True
        self.fetch_older(self._generation, message.to_start)

    @work(group="scrollback")
    async def fetch_older(self, generation: int, to_start: bool = False) -> None:
        """One page of older lines in front of the view (a worker: the screen stays live)."""
        try:
            await self._fetch_older(generation, to_start)
        finally:
            self._fetching = False

    async def _fetch_older(self, generation: int, to_start: bool) -> None:
        view, state, window = self.view, self.state, self.view.window
        if self._scrollback is None or self._scrollback_version != window.version:
            self._scrollback = Scrollback(state, self.source, window.floors)
            self._scrollback_version = window.version
        scroll = self._scrollback
        if scroll.exhausted:
            self._set_older_status(self._start_text(scroll))
            return
        if len(window) >= view.limit:
            self._set_older_status("scrollback full: End follows again")
            return
        self._set_older_status("fetching older lines...")
        try:
            entries = await scroll.older(self.fetch)
        except Exception as exc:  # unreachable node, agent error: say so, keep the view
            if generation == self._generation:
                self._set_older_status("older lines: %s" % exc)
            return
        if generation != self._generation or scroll is not self._scrollback:
            return  # the pane switched source meanwhile
        version = window.version
        view.prepend_older(cleaned(entries, self.secrets), scroll.floors, to_start)
        if window.version == version:  # the floors are the fetcher's: it carries on from them
            self._scrollback_version = window.version
        self._set_older_status(self._start_text(scroll) if scroll.exhausted else None)

    def _start_text(self, scroll: Scrollback) -> str:
        if scroll.unknown:
            return "no older lines from %s (its agent gives no positions)" % ", ".join(
                scroll.unknown)
        return "start of log"

    def _set_older_status(self, text: str | None) -> None:
        self.older_status = text
        if self.state is not None and self.is_attached:
            self.update_title(self.state)

    def mark_shown(self, state: RunState) -> None:
        """Tell the run's line budget which streams are on screen: they keep their lines
        when it is tight. Every rank merged protects nothing (that would be everything)."""
        kept = [] if self.source[0] == ALL else [k for _r, k in streams_of(state, self.source)]
        if len(kept) == len(self._shown) and all(a is b for a, b in zip(kept, self._shown)):
            return
        for old in self._shown:
            old.shown_by.discard(self)
        for new in kept:
            new.shown_by.add(self)
        self._shown = kept

    def update_title(self, state: RunState) -> None:
        """Number, following/paused, source, its state and step, filter matches."""
        self.mark_shown(state)
        kind, value = self.source
        view = self.view
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(" %d " % self.number, "reverse")
        title.append(" ▶ " if view.follow else " ‖ PAUSED ", "green" if view.follow else
                     "bold yellow")
        if self.older_status and not view.follow:  # early: a narrow pane cuts the end off
            title.append("↑ %s " % self.older_status, "italic")
        title.append(source_label(self.source))
        if kind == RANK:
            rs = state.ranks.get(value)
            if rs is None:
                title.append("  (no output yet)", "dim")
            else:
                title.append(" @%s/lr%s " % (rs.node, rs.local_rank))
                title.append(rs.state, state_style(rs.state))
                if rs.step is not None:
                    title.append(" step %s" % rs.step)
        elif kind == NODE and value in state.nodes:
            ns = state.nodes[value]
            title.append(" ")
            title.append(ns.state, state_style(ns.state))
        if view.pattern is not None:
            title.append("  /%s/ %d match%s" % (view.pattern.pattern, view.matches,
                                                "" if view.matches == 1 else "es"), "bold")
        if view.collapse and kind != RANK:
            title.append("  collapsed", "dim")
        # One line, fixed size: no layout pass (a layout of the whole screen is costly).
        # None while the pane is being removed (an older-lines answer can come then: seen
        # as NoMatches in test_tui_real) or not composed yet: nothing to write into.
        titles = self.query(".logpane--title")
        if titles:
            titles.first(Static).update(title, layout=False)

    def cycle_kind(self, state: RunState) -> tuple:
        """rank -> its node merged -> every rank merged -> back to the rank."""
        kind, value = self.source
        if kind == RANK:
            rs = state.ranks.get(value)
            node = rs.node if rs else next(iter(state.nodes), None)
            return (NODE, node) if node else self.source
        if kind == NODE:
            return (ALL, None)
        return (RANK, self.last_rank)
