"""The key footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes (unmounts and mounts a widget per key, then styles them) each
time the screen says its bindings were updated: every focus change, even between two log
panes whose keys are the same. At 200x60 that was 20-45 ms of the event loop, twice (the
new keys' mount says so again), and a key pressed meanwhile waited for it (bench/tui.py;
docs/BENCHMARKS.md, "The view"). Footer says whether it shows keys yet
only in its private ``_bindings_ready`` (internals.py).
"""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class SteadyFooter(Footer):
    _shown: tuple | None = None  # what the last compose showed

    def shown_keys(self) -> tuple:
        """What compose would show now: each shown binding as the footer draws it."""
        return tuple((binding.key, binding.action, binding.description, binding.group,
                      enabled, tooltip, self.app.get_key_display(binding))
                     for _node, binding, enabled, tooltip in self.screen.active_bindings.values()
                     if binding.show)

    def compose(self):
        self._shown = self.shown_keys() if self._bindings_ready else None
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        if (self._bindings_ready and screen is self.screen and self.is_attached
                and self.shown_keys() == self._shown):
            return  # the same keys: nothing to rebuild
        super().bindings_changed(screen)
