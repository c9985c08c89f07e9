"""HelpScreen: every key of the console, grouped; escape, q or ? closes it.

The table is generated from the bindings themselves (:func:`key_sections`): the app's, the
screen's and those of every widget on the screen that can have the focus, each binding's
description as its help line. A key therefore cannot exist without a help line, and a help
line cannot outlive its key.
"""

from __future__ import annotations

import re

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Static

from .confirm import ConfirmScreen
from .hosts import HostsScreen
from .lateness import LatenessScreen
from .readonly import drop_changing
from .stacks import StacksScreen
from .verdict import VerdictScreen

Section = tuple  # (title, [(keys, description), ...])

MOUSE = ("Mouse", [("wheel", "scroll; in a log pane at the top, fetch older lines"),
                   ("click", "make a pane the active one; choose a row of the nodes table")])


def key_label(binding: Binding) -> str:
    """How the help writes a binding's key."""
    return binding.key_display or binding.key


def binding_rows(bindings: BindingsMap) -> list[tuple[str, str]]:
    """``(keys, description)`` per description, keys doing the same thing joined by " / ".

    System bindings (Textual's own, hidden from every key list) are left out."""
    rows: dict[str, list[str]] = {}
    for key_bindings in bindings.key_to_bindings.values():
        for binding in key_bindings:
            if not binding.system:
                keys = rows.setdefault(binding.description, [])
                if key_label(binding) not in keys:
                    keys.append(key_label(binding))
    return [(" / ".join(keys), description) for description, keys in rows.items()]


def has_keys(widget: Widget) -> bool:
    """Whether ``widget``'s keys can act: it can have the focus, or a widget inside it can
    (Textual offers a key to the focused widget, then to each widget around it)."""
    return widget.can_focus or any(child.can_focus for child in widget.walk_children())


def section_title(widget: DOMNode) -> str:
    """``HELP_TITLE`` of its class, else its border title, else its class name in words."""
    title = getattr(widget, "HELP_TITLE", None) or getattr(widget, "border_title", None)
    if not title:
        title = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(widget).__name__).lower()
    return str(title)[:1].upper() + str(title)[1:]


def key_sections(app, screen: Screen | None = None) -> list[Section]:
    """The help's sections: the app's keys, the screen's, then one per kind of widget on
    ``screen`` (the app's current one) whose keys can act, in screen order; kinds with the
    same keys share a section. Then the dialogs' keys and the mouse. A node's keys, inherited
    ones too, are its private ``_bindings`` (internals.py): Textual has no public list."""
    screen = screen or app.screen
    sections: list[list] = [["Console", binding_rows(app._bindings)],
                            ["Anywhere", binding_rows(screen._bindings)]]
    seen: set[type] = set()
    for widget in screen.walk_children(with_self=False):
        if type(widget) in seen or not has_keys(widget):
            continue
        seen.add(type(widget))
        rows = binding_rows(widget._bindings)
        if not rows:
            continue
        same = next((s for s in sections if s[1] == rows), None)
        if same is not None:
            same[0] += ", " + section_title(widget)
        else:
            sections.append([section_title(widget), rows])
    for title, dialog in (("Who is stuck (w)", VerdictScreen), ("Stacks (s)", StacksScreen),
                          ("Lateness (L)", LatenessScreen), ("Hosts (H)", HostsScreen),
                          ("Confirmations", ConfirmScreen), ("This help", HelpScreen)):
        keys = BindingsMap(dialog.BINDINGS)
        if getattr(app, "read_only", False):  # `rankdeck watch`: as its dialogs have them
            drop_changing(keys)
        sections.append([title, binding_rows(keys)])
    return [(title, rows) for title, rows in sections if rows] + [MOUSE]


def key_table(sections: list[Section]) -> Table:
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
        Binding("question_mark", "dismiss_help", "Close", key_display="?"),
    ]

    def __init__(self, sections: list[Section], **kwargs):
        """``sections``: :func:`key_sections` of the screen the help is about."""
        super().__init__(**kwargs)
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("rankdeck keys", style="bold"))
            yield Static(key_table(self.sections), id="help-keys")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
