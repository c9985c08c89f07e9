"""Who is stuck, in the view: the suspect rows marked, the cursor on the suspect's node when a
verdict arrives, and VerdictScreen (``w``): kind, suspects with node, frame and source line,
the evidence; ``w`` there takes a fresh verdict, ``r`` restarts the suspect's node, ``s``
shows its stacks.

The verdict itself is RunState's (``state.verdict``, agent/rules/verdict.py); the controller
takes one when ranks stall, and ``RunController.why()`` on demand. From the stall to a
restarted node: the cursor is already on the suspect's node, so ``r``, ``y`` (or ``w``,
``r``, ``y`` after reading why).
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
from ..judgement.verdict import evidence_lines
from .styles import SUSPECT_STYLE
from .suspects import first_suspect_node

SUSPECT_KINDS = ("stuck-in-python", "mismatch", "unreachable", "straggler")


def verdict_text(verdict: dict | None) -> Text:
    """The verdict as the screen shows it: kind, summary, suspects with their source line,
    then the evidence."""
    text = Text()
    if verdict is None:
        text.append("No verdict yet: asking every node for its ranks' stacks and "
                    "flight recorders...", "dim")
        return text
    kind = verdict["kind"]
    text.append(kind, SUSPECT_STYLE if kind in SUSPECT_KINDS else "bold")
    text.append("\n" + clean(verdict["summary"]) + "\n")
    for s in verdict["suspects"]:
        text.append("\nrank %d on %s" % (s["rank"], clean(s["node"])), SUSPECT_STYLE)
        text.append("  at %s" % clean(s["frame"] or "?"))
        if s.get("source"):
            text.append("\n    > " + clean(s["source"]), "bold")
    text.append("\n\nEvidence\n", "bold underline")
    text.append("\n".join(evidence_lines(verdict)))
    return text


def verdict_arrived(app) -> None:
    """A verdict was just taken: mark the rows, put the cursor on the suspect's node and say
    so, with the keys that act on it."""
    state = app.ctl.state
    app.nodes.refresh_rows()
    node = first_suspect_node(state)
    if node is None or state.verdict is None:
        return
    app.nodes.move_to("n:" + node)
    if not isinstance(app.screen, VerdictScreen):  # it shows the verdict already
        restart = "" if app.read_only else "   r: restart %s" % node  # `rankdeck watch`
        app.notify("%s: %s\nw: why   s: stacks%s"
                   % (state.verdict["kind"], state.verdict["summary"], restart),
                   title="who is stuck", severity="warning", timeout=20)


class VerdictScreen(ModalScreen[str | None]):
    """Dismisses with the action the user chose for the suspect's node ("restart",
    "stacks"), or None."""

    DEFAULT_CSS = """
    VerdictScreen { align: center middle; }
    VerdictScreen > VerticalScroll {
        width: 100; max-width: 95%; height: auto; max-height: 90%; padding: 1 2;
        border: thick $warning; background: $surface;
    }
    VerdictScreen #verdict-keys { margin-top: 1; }
    """
    BINDINGS = [
        Binding("w", "fresh", "Take a fresh verdict now"),
        Binding("r", "act('restart')", "Restart the suspect's node (asks first)"),
        Binding("s", "act('stacks')", "The suspect's node's stacks"),
        Binding("escape", "act('')", "Close"),
        Binding("q", "act('')", "Close"),
    ]

    def __init__(self, ctl, **kwargs):
        """``ctl``: the RunController (its state's verdict is shown; ``why()`` takes one)."""
        super().__init__(**kwargs)
        self.ctl = ctl

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(verdict_text(self.ctl.state.verdict), id="verdict-body")
            restart = "" if self.app.read_only else "r: restart the suspect's node   "
            yield Static(Text("w: ask again   %ss: its stacks   esc: close" % restart,
                              style="dim"), id="verdict-keys")

    def on_mount(self) -> None:
        if self.ctl.state.verdict is None:
            self.action_fresh()

    def show(self, body: Text) -> None:
        self.query_one("#verdict-body", Static).update(body)

    @work(exclusive=True, group="why")
    async def action_fresh(self) -> None:
        """Ask again; the verdict event moves the cursor (:func:`verdict_arrived`)."""
        self.show(Text("asking every node for its ranks' stacks and flight recorders...",
                       "dim"))
        try:
            verdict = await self.ctl.why()
        except Exception as exc:  # a node's error: say it, keep the screen
            self.show(Text("why failed: %s" % clean(str(exc)), "bold red"))
            return
        self.show(verdict_text(verdict))

    def action_act(self, what: str) -> None:
        self.dismiss(what or None)


def open_verdict(app) -> None:
    """``w``: the verdict screen; what the user picks there acts on the suspect's node."""
    app.push_screen(VerdictScreen(app.ctl), lambda what: act_on_suspect(app, what))


def act_on_suspect(app, what: str | None) -> None:
    if what is None:
        return
    node = first_suspect_node(app.ctl.state)
    if node is None:
        app.notify("no suspect named: pick a node in the nodes table", severity="warning")
    elif what == "restart":
        app.ask("restart", node)
    else:
        app.action_stacks(node)

