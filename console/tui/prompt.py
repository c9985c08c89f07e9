"""PromptBar: the one-line input under the panes for ``/`` (filter) and ``g`` (go to rank).

Filtering applies while typing (an invalid regex is marked and not applied); Enter keeps it
and returns to the panes, Escape clears it; Enter on an invalid regex keeps the prompt open and
says what is wrong. "Go to" takes a rank number, ``r12``, a node name or ``all``.

The invalid mark is Input's own ``-invalid`` class, set by a :class:`RegexValidator`: Input
sets and clears that class itself on every validation, so a class of our own would be reset.
"""

from __future__ import annotations

import re

from textual.binding import Binding
from textual.validation import ValidationResult, Validator
from textual.widgets import Input

from .messages import FilterChanged, GotoSubmitted


class RegexValidator(Validator):
    """Valid when the text compiles as a Python regular expression."""

    def validate(self, value: str) -> ValidationResult:
        try:
            re.compile(value)
        except re.error as err:
            return self.failure("not a valid regular expression: %s" % err)
        return self.success()


class PromptBar(Input):
    DEFAULT_CSS = """
    PromptBar { dock: bottom; height: 1; border: none; padding: 0 1; display: none; }
    PromptBar.-shown { display: block; }
    PromptBar.-invalid { color: $error; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, **kwargs):
        super().__init__(valid_empty=True, **kwargs)
        self.purpose = "filter"

    def open(self, purpose: str, value: str = "") -> None:
        self.purpose = purpose
        self.validators = [RegexValidator()] if purpose == "filter" else []
        self.placeholder = ("regex filter across panes (Enter keeps, Esc clears)"
                            if purpose == "filter" else "rank number, node name or 'all'")
        self.value = value
        self.validate(value)
        self.add_class("-shown")
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
            self.post_message(FilterChanged(None))
        elif event.validation_result is None or event.validation_result.is_valid:
            self.post_message(FilterChanged(text))  # an invalid one is marked, not applied

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.purpose == "goto":
            self.post_message(GotoSubmitted(event.value.strip()))
        elif event.validation_result is not None and not event.validation_result.is_valid:
            # stays open, marked, with the reason: the user fixes it or presses Escape
            self.app.notify("; ".join(event.validation_result.failure_descriptions),
                            title="filter %s" % event.value, severity="error", markup=False)
            return
        self.close()

    def action_cancel(self) -> None:
        if self.purpose == "filter":
            self.value = ""
            self.post_message(FilterChanged(None))
        self.close()
