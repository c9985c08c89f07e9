"""Every private Textual name the console relies on, why, and which file uses it.

Textual has no public way to do these things (checked on 8.2.8, which pyproject pins). A
private name can go or change meaning in any release, so they are all listed here and
tests/console/test_textual_internals.py checks each still exists on the installed Textual:
an upgrade fails that one test, with the whole list of what went. The same test fails when a
file in console/tui/ uses a private name of Textual's (on another object than ``self``, or
on ``self`` where rankdeck did not define it, or defined over a Textual class's own) that is
not listed here. Where Textual has a public handler, use it instead (``on_focus``, not an
override of ``_on_focus``).

Nothing imports this module at run time; it is the list the test reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.dom import DOMNode
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Footer, RichLog


@dataclass(frozen=True)
class Internal:
    """One private name of Textual's that a console/tui file uses."""

    owner: type  # the Textual class that has it (on the class or on each instance)
    name: str
    used_in: str  # the file in console/tui/ that uses it
    why: str
    args: int | None = None  # a method: how many arguments the file passes it


TEXTUAL_INTERNALS = (
    Internal(Widget, "_repaint_required", "frames.py",
             "which widgets asked to be drawn; paint_now draws them now and clears it, so the "
             "update timer does not draw them again"),
    Internal(Screen, "_dirty_widgets", "frames.py",
             "the widgets the screen's next update redraws; paint_now adds the ones it draws"),
    Internal(Screen, "_on_timer_update", "frames.py",
             "the screen's update, what its timer calls; paint_now calls it for a key's frame",
             args=0),
    Internal(Footer, "_bindings_ready", "footer.py",
             "whether Footer.compose shows keys yet; SteadyFooter compares them only then"),
    Internal(Widget, "_scroll_update", "scrolling.py",
             "shows or hides the scrollbars for a new virtual size without a layout of the "
             "screen", args=1),
    Internal(DOMNode, "_bindings", "help.py",
             "a node's own keys with those it inherits, as Textual dispatches them; the help "
             "screen lists them"),
    Internal(DOMNode, "_bindings", "readonly.py",
             "the same map: a read-only console takes the keys that change the run out of it, "
             "so no footer, help or key press finds them (Textual cannot unbind a key)"),
    Internal(RichLog, "_line_cache", "events.py",
             "the lines RichLog drew; EventsLog takes its last lines off (RichLog.lines is "
             "public) to write a changed checkpoint line again, and empties it with them"),
    Internal(Strip, "_divide_cache", "lru.py",
             "where Strip.divide caches a strip inside itself; the patched divide empties it "
             "to leave no reference cycle"),
)
