"""ConfirmScreen: a yes/no modal in front of every control that destroys work."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (y / the action button) or False (n / escape / Cancel)."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 72; height: auto; padding: 1 2;
        border: thick $error; background: $surface;
    }
    ConfirmScreen .confirm--title { text-style: bold; margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, title: str, body: str, action: str = "Yes", **kwargs):
        super().__init__(**kwargs)
        self.title_text = title
        self.body = body
        self.action = action

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), classes="confirm--title")
            yield Static(Text(self.body))
            yield Static(Text("y: %s   n / esc: cancel" % self.action.lower(), style="dim"))
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button(self.action, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def control_confirm(verb: str, node: str | None, run_id: str, nodes: int,
                    static_world: str | None = None) -> ConfirmScreen:
    """The question before a stop ("kill") or restart of one node or of the whole run.
    ``static_world``: what a restart of this run's static world says (RunController's)."""
    if verb == "restart" and static_world:
        return ConfirmScreen("Restart %s?" % ("node %s" % node if node else "the whole run %s"
                                               % run_id),
                             "%s. Kills the launcher on all %d nodes and starts every one "
                             "again on a fresh master port; every rank resumes from the latest "
                             "checkpoint." % (static_world, nodes), "Restart every node")
    if verb == "stop" and node:
        return ConfirmScreen("Kill node %s?" % node,
                             "Stops torchrun on %s: SIGTERM, then SIGKILL after the grace "
                             "period. The other nodes lose a peer; progress since the last "
                             "checkpoint is lost." % node, "Kill node")
    if verb == "stop":
        return ConfirmScreen("Kill the whole run %s?" % run_id,
                             "Stops torchrun on all %d nodes and the rendezvous store. "
                             "Progress since the last checkpoint is lost." % nodes, "Kill run")
    if node:
        return ConfirmScreen("Restart node %s?" % node,
                             "Kills %s's torchrun and starts it again into the same "
                             "rendezvous; every node restarts its workers, which resume from "
                             "the latest checkpoint." % node, "Restart node")
    return ConfirmScreen("Restart the whole run %s?" % run_id,
                         "Kills torchrun on every node and starts it again; the trainers "
                         "resume from the latest checkpoint.", "Restart run")
