"""Messages of the rankdeck app: one class per kind of event, flowing up to the app.

A log source is a tuple: ``("rank", 5)``, ``("node", "node1")`` (a whole node merged) or
``("all", None)`` (every rank merged). Log lines travel as console/lines/lines.py ``Entry`` with
``text`` already cleaned by console/lines/sanitize.py (plain text, never markup).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from ..model.nodes import Event


@dataclass
class LogLines(Message):
    """New cleaned lines of the watched sources since the last flush (never coalesced).

    ``lines``: source -> list of ``Entry``, oldest first."""

    lines: dict


@dataclass
class RunChanged(Message):
    """Node or rank state, metrics or GPU snapshots changed; views re-read RunState."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunChanged)


@dataclass
class RunEventAdded(Message):
    """A run event (checkpoint, restart, exit, stall...) was recorded."""

    event: Event


@dataclass
class SourceChosen(Message):
    """The user picked a rank or node (nodes table) to follow in the active log pane."""

    source: tuple


@dataclass
class FilterChanged(Message):
    """The log filter regex changed (``None`` clears it)."""

    pattern: str | None


@dataclass
class GotoSubmitted(Message):
    """The user typed a rank or node to show in the active pane."""

    text: str


@dataclass
class FollowChanged(Message):
    """A log view started or stopped following its newest line."""

    follow: bool
    view: object = None  # the LogView


@dataclass
class OlderWanted(Message):
    """The user scrolled up at the top of a log view: fetch older lines from the nodes.

    ``to_start``: show the oldest fetched line (Home) rather than keep the lines in place."""

    to_start: bool = False


@dataclass
class PausedScroll(Message):
    """A paused log view scrolled: side-by-side panes follow it, aligned by step (align.py)."""

    view: object

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PausedScroll) and message.view is self.view
