"""rankdeck's commands in Textual's command palette (ctrl+p), next to the system ones.

Generated each time the palette opens, so every node and rank of the run is listed.
"""

from __future__ import annotations

from typing import Iterable

from textual.app import SystemCommand

from ..model.sources import ALL, NODE, RANK


def rankdeck_commands(app) -> Iterable[SystemCommand]:
    state, logs = app.ctl.state, app.logs
    drive = not app.read_only  # a read-only console is offered nothing that changes the run
    if drive:
        yield SystemCommand("Kill run", "stop every node (asks first)", lambda: app.ask("stop"))
        yield SystemCommand("Restart run", "restart every node (asks first)",
                            lambda: app.ask("restart"))
    for node in state.nodes:
        if drive:
            yield SystemCommand("Kill node %s" % node, "stop torchrun on %s (asks first)"
                                % node, lambda n=node: app.ask("stop", n))
            yield SystemCommand("Restart node %s" % node, "restart torchrun on %s (asks "
                                "first)" % node, lambda n=node: app.ask("restart", n))
        yield SystemCommand("Show node %s merged" % node, "in the active log pane",
                            lambda n=node: logs.show((NODE, n)))
    for rank in sorted(state.ranks):
        yield SystemCommand("Show rank %d" % rank, "in the active log pane (on %s)"
                            % state.ranks[rank].node, lambda r=rank: logs.show((RANK, r)))
    yield SystemCommand("Show all ranks merged", "in the active log pane",
                        lambda: logs.show((ALL, None)))
    for option in ("wrap", "timestamps", "collapse"):
        yield SystemCommand("Toggle %s" % option, "in every log pane",
                            lambda o=option: app.action_toggle(o))
    yield SystemCommand("Loss chart: rank 0 / all ranks", "switch", app.action_loss_mode)
    yield SystemCommand("Add log pane", "up to 4 side by side", app.action_add_pane)
    yield SystemCommand("Remove log pane", "the active one", app.action_remove_pane)
    yield SystemCommand("Filter logs", "regex across panes", app.action_filter)
    yield SystemCommand("Keys", "every key of rankdeck", app.action_help)
