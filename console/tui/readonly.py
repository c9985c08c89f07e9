"""A read-only console's keys: none that changes the run is bound, shown or done.

``rankdeck watch`` (``attach --read-only``) guards in three places, as nvitop's ``--readonly``
does: the keys of :data:`CHANGES_RUN` are taken out of the bindings of the app, of every
widget on its screen and of every dialog it opens (so neither the
footer nor the help lists them, and pressing one does nothing), ``check_action`` refuses
their actions however they are reached (the command palette, a binding added later), and
the agent refuses the requests on this console's connections (agent/serve/server.py). A new key
that changes the run is named here.
"""

from __future__ import annotations

from textual.binding import BindingsMap
from textual.dom import DOMNode

# the actions that change the run: stop/kill, restart, cordon, signals, sync
CHANGES_RUN = frozenset({
    "kill_node", "kill_run", "restart_node", "restart_run", "stop_node", "stop_run",
    "cordon", "cordon_node", "uncordon", "uncordon_node", "signal", "signal_node", "sync",
})
# a dialog's ``act('restart')``: the verb it asks the app to do
CHANGING_VERBS = frozenset({"stop", "kill", "restart", "cordon", "uncordon", "signal", "sync"})


def changes_run(action: str) -> bool:
    """Whether ``action`` (``name``, ``name(args)``, a widget's ``app.name``) changes the
    run."""
    name, _, args = action.partition("(")
    return (name.strip().rsplit(".", 1)[-1] in CHANGES_RUN
            or args.strip("'\") ") in CHANGING_VERBS)


def drop_changing_keys(node: DOMNode) -> None:
    """Unbind from ``node`` (the app, a dialog) every key whose action changes the run."""
    drop_changing(node._bindings)  # noqa: SLF001 (console/tui/internals.py)


def drop_changing(bindings_map: BindingsMap) -> BindingsMap:
    """``bindings_map`` without the keys whose action changes the run (changed in place)."""
    bindings = bindings_map.key_to_bindings
    for key in list(bindings):
        kept = [b for b in bindings[key] if not changes_run(b.action)]
        if kept:
            bindings[key] = kept
        else:
            del bindings[key]
    return bindings_map
