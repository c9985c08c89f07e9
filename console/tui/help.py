"""HelpScreen: every key of the console, grouped; escape, q or ? closes it."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


EXTRA_KEYS = [
    ("Log panes", [("up/down, pgup/pgdn", "scroll back (pauses following)"),
                   ("up/pgup/wheel at the top", "fetch older lines from the hosts"),
                   ("home", "the start of the log (fetches from the hosts)"),
                   ("end", "jump to the newest line and follow again"),
                   ("mouse wheel / click", "scroll / make a pane the active one")]),
    ("Nodes table", [("up/down", "move"),
                     ("enter / click", "show that rank (or the node merged) in the active "
                                       "pane; kill/restart act on this row's node")]),
    ("Dialogs", [("y / n / esc", "confirm / cancel"), ("esc", "close help or the prompt")]),
    ("Anywhere", [("tab / shift+tab", "next / previous area"),
                  ("ctrl+p", "command palette (rankdeck commands included)"),
                  ("ctrl+q", "detach, like q")]),
]


def key_table(sections: list[tuple[str, list[tuple[str, str]]]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right", style="bold cyan", no_wrap=True)
    table.add_column()
    for i, (title, keys) in enumerate(sections):
        if i:
            table.add_row("", "")
        table.add_row("", Text(title, style="bold underline"))
        for key, description in keys:
            table.add_row(Text(key), Text(description))
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 84; height: 90%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    """
    BINDINGS = [
        Binding("escape", "dismiss_help", "Close"),
        Binding("q", "dismiss_help", "Close"),
        Binding("question_mark", "dismiss_help", "Close"),
    ]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]], **kwargs):
        super().__init__(**kwargs)
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("rankdeck keys", style="bold"))
            yield Static(key_table(self.sections), id="help-keys")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)

    def keys(self) -> list[str]:
        return [key for _title, keys in self.sections for key, _d in keys]
