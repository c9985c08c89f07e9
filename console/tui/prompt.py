"""PromptBar: the one-line input under the panes for ``/`` (filter) and ``g`` (go to rank).

Filtering applies while typing (an invalid regex is marked and not applied); Enter keeps it
and returns to the panes, Escape clears it. "Go to" takes a rank number, ``r12``, a node name
or ``all``.
"""

from __future__ import annotations

import re

from textual.binding import Binding
from textual.widgets import Input

from .messages import FilterChanged, GotoSubmitted


class PromptBar(Input):
    DEFAULT_CSS = """
    PromptBar { dock: bottom; height: 1; border: none; padding: 0 1; display: none; }
    PromptBar.-shown { display: block; }
    PromptBar.-invalid { color: $error; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.purpose = "filter"

    def open(self, purpose: str, value: str = "") -> None:
        self.purpose = purpose
        self.placeholder = ("regex filter across panes (Enter keeps, Esc clears)"
                            if purpose == "filter" else "rank number, node name or 'all'")
        self.value = value
        self.add_class("-shown")
        self.remove_class("-invalid")
        self.screen.set_focus(self)  # now: keys typed right after "/" are already queued

    def close(self) -> None:
        self.remove_class("-shown")
        self.screen.focus_next()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.purpose != "filter":
            return
        text = event.value
        if not text:
            self.remove_class("-invalid")
            self.post_message(FilterChanged(None))
            return
        try:
            re.compile(text)
        except re.error:
            self.add_class("-invalid")
            return
        self.remove_class("-invalid")
        self.post_message(FilterChanged(text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.purpose == "goto":
            self.post_message(GotoSubmitted(event.value.strip()))
        elif self.has_class("-invalid"):
            self.app.notify("not a valid regular expression: %s" % event.value,
                            severity="error")
            return
        self.close()

    def action_cancel(self) -> None:
        if self.purpose == "filter":
            self.value = ""
            self.post_message(FilterChanged(None))
        self.close()
