"""LogPanes: one to four LogPanes, side by side where their lines fit (stacked where they do
not: console/tui/align.py), and which one is active.

The app hands it flushed line batches (``add_lines``) and the shared options (wrap,
timestamps, collapse, filter); it passes each batch only to the panes showing that source
and tells the feed (``watch``) which sources are shown, so nothing else is kept.
"""

from __future__ import annotations

import re

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal

from ..model.sources import ALL, NODE, RANK
from ..model.state import RunState
from .align import align, needed_width, side_by_side
from .logpane import LogPane
from .messages import FollowChanged, PausedScroll

MAX_PANES = 4


def second_source(state: RunState) -> tuple | None:
    """Beside rank 0, the last rank (the far end of the run from rank 0), once a rank other
    than 0 is known; None until then."""
    last = max(state.ranks, default=0)
    return (RANK, last) if last != 0 else None


def placeholder_source(state: RunState) -> tuple:
    """What the second pane shows until a rank other than 0 is known: the last node merged
    (its torchrun lines), or every rank while no node is known yet."""
    last = next(reversed(state.nodes), None)
    return (NODE, last) if last is not None else (ALL, None)


def default_sources(state: RunState) -> list[tuple]:
    return [(RANK, 0), second_source(state) or placeholder_source(state)]


class LogPanes(Horizontal):
    DEFAULT_CSS = """
    LogPanes { height: 1fr; }
    """

    def __init__(self, state: RunState, watch, secrets=(), sources=None, fetch=None, **kwargs):
        """``fetch``: RunController.scrollback, for older lines than memory holds; ``watch``:
        told the shown sources (RunFeed.watch) in the same call that refills a pane, so no
        line arriving in between is lost."""
        super().__init__(**kwargs)
        self.state = state
        self.fetch = fetch
        self.watch = watch
        self.secrets = tuple(secrets or ())
        self._initial = list(sources or default_sources(state))[:MAX_PANES]
        # the second pane's source until a rank other than 0 is known, then it moves to the
        # last rank: every run opens pane 2 the same way, never on rank 0's node
        self._placeholder = self._initial[1] if not sources and len(self._initial) > 1 and \
            self._initial[1][0] != RANK else None
        self.active = 0
        self.wrap = False
        self.timestamps = False
        self.collapse = True
        self.pattern: re.Pattern | None = None
        self.together = True  # side by side (Horizontal's layout) or stacked

    def compose(self) -> ComposeResult:
        for i, source in enumerate(self._initial):
            yield LogPane(i + 1, source, self.fetch)

    def on_mount(self) -> None:
        for pane in self.panes:
            self._configure(pane)
            pane.show(pane.source, self.state, self.secrets)
        self._mark_active()
        self._announce()

    def on_resize(self, event: events.Resize) -> None:
        self.fit_layout()

    def fit_layout(self) -> None:
        """Side by side where the panes' lines fit next to each other, else stacked."""
        panes, width = self.panes, self.size.width
        if not width or not panes:
            return
        together = side_by_side(width, len(panes), needed_width(p.view for p in panes))
        if together != self.together:
            self.together = together
            self.styles.layout = "horizontal" if together else "vertical"

    # -- scrolling together ----------------------------------------------------------------
    def on_paused_scroll(self, message: PausedScroll) -> None:
        """The active pane scrolled while paused: side by side, the others follow by step."""
        message.stop()
        panes = self.panes
        if not self.together or len(panes) < 2:
            return
        leader = self.active_pane
        if message.view is leader.view:
            align(self.state, leader, [p for p in panes if p is not leader])

    def on_follow_changed(self, message: FollowChanged) -> None:
        """Side by side, the active pane following again takes the others with it."""
        panes = self.panes
        if message.follow and self.together and panes and \
                message.view is self.active_pane.view:
            for pane in panes:
                pane.view.follow = True

    # -- reading ---------------------------------------------------------------------------
    @property
    def panes(self) -> list[LogPane]:
        return list(self.query_children(LogPane))

    @property
    def active_pane(self) -> LogPane:
        panes = self.panes
        return panes[min(self.active, len(panes) - 1)]

    @property
    def sources(self) -> frozenset:
        return frozenset(p.source for p in self.panes)

    # -- lines -----------------------------------------------------------------------------
    def add_lines(self, lines: dict) -> None:
        for pane in self.panes:
            entries = lines.get(pane.source)
            if entries:
                pane.add_entries(entries)

    def refresh_titles(self) -> None:
        if self._placeholder is not None:
            self._settle_second_pane()
        for pane in self.panes:
            pane.update_title(self.state)
        self.fit_layout()

    def _settle_second_pane(self) -> None:
        """The second pane leaves its placeholder (a node merged) for a rank once known,
        unless the user chose what it shows meanwhile."""
        panes = self.panes
        if len(panes) < 2 or panes[1].source != self._placeholder:
            self._placeholder = None
            return
        source = second_source(self.state)
        if source is not None:
            self._placeholder = None
            self.show(source, 1)

    # -- choosing what to show -------------------------------------------------------------
    def show(self, source: tuple, pane: int | None = None) -> None:
        index = self.active if pane is None else pane
        if index == 1:
            self._placeholder = None  # chosen: it stays
        target = self.panes[index]
        target.show(source, self.state, self.secrets)
        self._announce()

    def step(self, delta: int) -> None:
        """Next/previous rank (or node) in the active pane."""
        pane = self.active_pane
        kind, value = pane.source
        if kind == RANK:
            ranks = sorted(self.state.ranks) or [0]
            pos = ranks.index(value) if value in ranks else -1
            self.show((RANK, ranks[(pos + delta) % len(ranks)]))
        elif kind == NODE:
            nodes = list(self.state.nodes)
            pos = nodes.index(value) if value in nodes else -1
            self.show((NODE, nodes[(pos + delta) % len(nodes)]))

    def cycle_kind(self) -> None:
        pane = self.active_pane
        self.show(pane.cycle_kind(self.state))

    def add_pane(self) -> None:
        panes = self.panes
        if len(panes) >= MAX_PANES:
            self.app.notify("at most %d log panes" % MAX_PANES, severity="warning")
            return
        ranks = sorted(self.state.ranks) or [0]
        shown = {p.source[1] for p in panes if p.source[0] == RANK}
        rank = next((r for r in ranks if r not in shown), ranks[-1])
        pane = LogPane(len(panes) + 1, (RANK, rank), self.fetch)
        self.mount(pane)
        self.call_after_refresh(self._adopt, pane)

    def _adopt(self, pane: LogPane) -> None:
        self._configure(pane)
        pane.show(pane.source, self.state, self.secrets)
        self.active = len(self.panes) - 1
        self._mark_active()
        self._announce()

    def remove_pane(self) -> None:
        panes = self.panes
        if len(panes) <= 1:
            return
        victim = panes[self.active]
        victim.remove()
        remaining = [p for p in panes if p is not victim]
        for i, p in enumerate(remaining):
            p.number = i + 1
            p.update_title(self.state)
        self.active = min(self.active, len(remaining) - 1)
        self._mark_active(remaining)
        self.watch(frozenset(p.source for p in remaining))
        self.call_after_refresh(self.fit_layout)

    def focus_pane(self, index: int) -> None:
        panes = self.panes
        if 0 <= index < len(panes):
            self.active = index
            view = panes[index].view
            # now, not via call_later as Widget.focus does: keys typed right after the
            # number (already queued) must reach this pane
            view.screen.set_focus(view)
            self._mark_active()

    # -- options ---------------------------------------------------------------------------
    def set_options(self, **options) -> None:
        for key, value in options.items():
            setattr(self, key, value)
        for pane in self.panes:
            self._configure(pane)
            pane.update_title(self.state)

    def _configure(self, pane: LogPane) -> None:
        pane.view.configure(wrap=self.wrap, timestamps=self.timestamps, collapse=self.collapse,
                            pattern=self.pattern)

    def toggle_follow(self) -> None:
        pane = self.active_pane
        pane.view.follow = not pane.view.follow
        pane.update_title(self.state)

    # -- focus -----------------------------------------------------------------------------
    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        for i, pane in enumerate(self.panes):
            if event.widget in pane.walk_children():
                self.active = i
                self._mark_active()

    def _mark_active(self, panes=None) -> None:
        for i, pane in enumerate(panes if panes is not None else self.panes):
            pane.set_class(i == self.active, "-active")

    def _announce(self) -> None:
        self.watch(self.sources)
        self.refresh_titles()
