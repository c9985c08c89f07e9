"""The key footer, rebuilt only when the keys it shows (or the room for them) change, and
showing whole keys only.

Textual's Footer recomposes (unmounts and mounts a widget per key, then styles them) each
time the screen says its bindings were updated: every focus change, even between two log
panes whose keys are the same. At 200x60 that was 20-45 ms of the event loop, twice (the
new keys' mount says so again), and a key pressed meanwhile waited for it (bench/tui.py;
docs/BENCHMARKS.md, "The view"). Footer says whether it shows keys yet
only in its private ``_bindings_ready`` (internals.py).

Textual's Footer lays its keys in a row that the terminal's edge cuts wherever it falls
(``+ Add pan``, ``s Sta`` at 120 and 160 columns); this one leaves out the keys that do not
fit whole, from the end of the row (the help screen, ``?``, lists them all).
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.screen import Screen
from textual.widgets import Footer

PALETTE_CHROME = 3  # the palette key (``▏^p palette ``): its border, a blank, its padding


def key_width(key) -> int:
    """Cells a key (Textual's FooterKey) takes in the (non-compact) footer: `` k `` then
    ``description ``; 0 for what is not a key (the app has no binding groups)."""
    if not hasattr(key, "key_display"):
        return 0
    return cell_len(key.key_display) + 2 + (cell_len(key.description) + 1
                                            if key.description else 0)


def fitting(widgets: list, width: int) -> list:
    """``widgets`` (a footer's keys, the palette key last) less the keys that would not fit
    whole in ``width`` cells, dropped from the end of the row."""
    palette = [w for w in widgets if w.has_class("-command-palette")]
    room = width - sum(cell_len(w.key_display) + cell_len(w.description) + PALETTE_CHROME
                       for w in palette)
    kept = []
    for widget in widgets:
        if widget in palette:
            continue
        need = key_width(widget)
        # a key's right padding may lie under the palette key's left border: whole still
        if need - (1 if getattr(widget, "description", "") else 0) > room:
            break
        room -= need
        kept.append(widget)
    return kept + palette


class SteadyFooter(Footer):
    _shown: tuple | None = None  # what the last compose showed, and in how many cells

    def shown_keys(self) -> tuple:
        """What compose would show now: each shown binding as the footer draws it."""
        return (self.size.width,) + tuple(
            (binding.key, binding.action, binding.description, binding.group, enabled,
             tooltip, self.app.get_key_display(binding))
            for _node, binding, enabled, tooltip in self.screen.active_bindings.values()
            if binding.show)

    def compose(self):
        self._shown = self.shown_keys() if self._bindings_ready else None
        widgets = list(super().compose())
        yield from fitting(widgets, self.size.width) if self.size.width else widgets

    def on_resize(self, event: events.Resize) -> None:
        if self._bindings_ready and self._shown is not None and \
                self._shown[0] != self.size.width:
            self.call_after_refresh(self.recompose)

    def bindings_changed(self, screen: Screen) -> None:
        if (self._bindings_ready and screen is self.screen and self.is_attached
                and self.shown_keys() == self._shown):
            return  # the same keys: nothing to rebuild
        super().bindings_changed(screen)
