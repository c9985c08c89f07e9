"""LogPane: one log pane, a title line and a LogView following one source.

The source is a rank, a whole node (its ranks and torchrun merged, prefixed) or every rank.
Switching source refills the view from RunState's kept lines; afterwards the parent hands it
each flushed batch of that source only.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..state import LINES_PER_RANK, RunState
from .feed import ALL, NODE, RANK, cleaned, kept_lines
from .logview import LogView
from .summary import state_style

MERGED_LINES = 2 * LINES_PER_RANK
FIRST_PAINT = 300  # lines shown at once when a pane switches source; the rest follow


def source_label(source: tuple) -> str:
    kind, value = source
    if kind == RANK:
        return "rank %s" % value
    if kind == NODE:
        return "node %s merged" % value
    return "all ranks merged"


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

    def __init__(self, number: int, source: tuple, **kwargs):
        super().__init__(**kwargs)
        self.number = number
        self.source = source
        self.last_rank = source[1] if source[0] == RANK else 0
        self._generation = 0

    def compose(self) -> ComposeResult:
        yield Static(classes="logpane--title")
        multi = self.source[0] != RANK
        yield LogView(max_lines=MERGED_LINES if multi else LINES_PER_RANK, multi_rank=multi)

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def show(self, source: tuple, state: RunState, secrets=()) -> None:
        """Follow ``source`` from now on, refilled from what RunState kept.

        The newest screenful or so is shown at once; the older kept lines are cleaned and
        put in front after the next refresh, so switching panes answers within a frame.
        """
        self.source = source
        self._generation += 1
        if source[0] == RANK:
            self.last_rank = source[1]
        view = self.view
        multi = source[0] != RANK
        view.max_lines = MERGED_LINES if multi else LINES_PER_RANK
        view.multi_rank = multi
        view.show_node = source[0] == ALL
        view.follow = True
        raw = kept_lines(state, source, view.max_lines)
        older, newest = raw[:-FIRST_PAINT], raw[-FIRST_PAINT:]
        view.set_entries(cleaned(newest, secrets))
        if older:
            self.call_after_refresh(self._backfill, self._generation, older, secrets)
        self.update_title(state)

    def _backfill(self, generation: int, older: list, secrets) -> None:
        if generation == self._generation:  # still showing the same source
            self.view.prepend_entries(cleaned(older, secrets))

    def update_title(self, state: RunState) -> None:
        """Number, following/paused, source, its state and step, filter matches."""
        kind, value = self.source
        view = self.view
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(" %d " % self.number, "reverse")
        title.append(" ▶ " if view.follow else " ‖ PAUSED ", "green" if view.follow else
                     "bold yellow")
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
        self.query_one(".logpane--title", Static).update(title, layout=False)

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
