"""StacksScreen (``s``): the selected node's ranks' Python stacks, the odd one marked.

Every node is asked (RunController.stacks), because "odd" means unlike the majority of the
whole run (console/judgement/stacks.py ``group``); the selected node's ranks are shown frame by frame
with line numbers, and the run's odd ranks elsewhere are named at the end. ``r`` restarts
the node (asks first), ``s`` asks again.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..lines.sanitize import clean
from ..judgement.stacks import answered, group, main_thread_locations
from .styles import SUSPECT_STYLE

FRAMES_SHOWN = 16


def stacks_text(node: str, results: dict) -> Text:
    """``node``'s ranks frame by frame, the odd ones marked; then the run's other odd ranks."""
    ranks, problems = answered(results)
    ranks, odd = group(ranks)
    text = Text()
    for r in (r for r in ranks if r["node"] == node):
        text.append("r%s  pid %s  %s" % (r.get("rank"), r.get("pid"), clean(str(r.get("method")
                                                                             or "no stack"))),
                    "bold")
        if r.get("differs"):
            text.append("   <-- differs from the majority", SUSPECT_STYLE)
        text.append("\n")
        if r.get("error"):
            text.append("    %s\n" % clean(str(r["error"])), "red")
        for fn, path, line in main_thread_locations(r.get("stack") or "")[:FRAMES_SHOWN]:
            text.append("    %s (%s:%d)\n" % (clean(fn), clean(path), line))
    elsewhere = ["r%d on %s" % (r["rank"], clean(r["node"])) for r in ranks
                 if r["rank"] in odd and r["node"] != node]
    if elsewhere:
        text.append("\nodd rank(s) out on other nodes: %s\n" % ", ".join(elsewhere), "yellow")
    for line in problems:
        text.append("\n" + clean(line), "red")
    return text if text else Text("no ranks on %s" % node, "dim")


class StacksScreen(ModalScreen[str | None]):
    """Dismisses with "restart" (for its node) or None."""

    DEFAULT_CSS = """
    StacksScreen { align: center middle; }
    StacksScreen > VerticalScroll {
        width: 110; max-width: 95%; height: 90%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    """
    BINDINGS = [
        Binding("s", "fresh", "Take the stacks again"),
        Binding("r", "act('restart')", "Restart this node (asks first)"),
        Binding("escape", "act('')", "Close"),
        Binding("q", "act('')", "Close"),
    ]

    def __init__(self, ctl, node: str, **kwargs):
        super().__init__(**kwargs)
        self.ctl = ctl
        self.node = node
        self.results: dict | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("Stacks of %s (main thread, innermost frame first)"
                              % clean(self.node), style="bold"))
            yield Static(id="stacks-body")
            restart = "" if self.app.read_only else "r: restart %s   " % clean(self.node)
            yield Static(Text("s: again   %sesc: close" % restart, style="dim"))

    def on_mount(self) -> None:
        self.action_fresh()

    @work(exclusive=True, group="stacks")
    async def action_fresh(self) -> None:
        body = self.query_one("#stacks-body", Static)
        body.update(Text("asking every node for its ranks' stacks...", "dim"))
        try:
            self.results = await self.ctl.stacks()
        except Exception as exc:  # a node's error: say it, keep the screen
            body.update(Text("stacks failed: %s" % clean(str(exc)), "bold red"))
            return
        body.update(stacks_text(self.node, self.results))

    def action_act(self, what: str) -> None:
        self.dismiss(what or None)


def open_stacks(app, node: str | None) -> None:
    """``s``: ``node``'s stacks; ``r`` there restarts it (asks first)."""
    if node is None:
        app.notify("no node selected: pick one in the nodes table", severity="warning")
        return
    app.push_screen(StacksScreen(app.ctl, node),
                    lambda what: app.ask("restart", node) if what == "restart" else None)
