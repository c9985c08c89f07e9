"""HostsScreen (``H``): the run's hosts as `rankdeck hosts` shows them: reachable, load, GPU
memory, strays (training processes of no live rankdeck run), last runs, incidents and FLAGGED
(incidents in 2 of the last 5 runs). The hosts are asked through the run's own links
(console/run/fleet.py ``ask_links``); ``h`` asks again. Read only: stopping strays is
`rankdeck hosts --kill-strays`, which asks first.
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
from ..run import fleet
from .styles import SUSPECT_STYLE


def hosts_text(rows: list[dict]) -> Text:
    """The table, a flagged host's line in the suspect's style."""
    text = Text()
    for r, line in ((r, line) for r in rows for line in fleet.lines([r])):
        flagged = r["flagged"] and not line.startswith(" ")
        text.append(clean(line) + "\n", SUSPECT_STYLE if flagged else "")
    return text if text else Text("no hosts", "dim")


class HostsScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HostsScreen { align: center middle; }
    HostsScreen > VerticalScroll {
        width: 120; max-width: 95%; height: 90%; padding: 1 2;
        border: thick $accent; background: $surface;
    }
    """
    BINDINGS = [
        Binding("h", "fresh", "Ask the hosts again"),
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close"),
    ]

    def __init__(self, ctl, **kwargs):
        super().__init__(**kwargs)
        self.ctl = ctl
        self.rows: list[dict] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("Hosts: load, GPU memory, strays, last runs, incidents",
                              style="bold"))
            yield Static(id="hosts-body")
            yield Static(Text("h: again   esc: close   (stop strays: rankdeck hosts "
                              "--kill-strays)", style="dim"))

    def on_mount(self) -> None:
        self.action_fresh()

    @work(exclusive=True, group="hosts")
    async def action_fresh(self) -> None:
        body = self.query_one("#hosts-body", Static)
        body.update(Text("asking every host...", "dim"))
        try:
            self.rows = await fleet.ask_links(self.ctl)
        except Exception as exc:  # a host's error: say it, keep the screen
            body.update(Text("hosts failed: %s" % clean(str(exc)), "bold red"))
            return
        body.update(hosts_text(self.rows))
        # the nodes table marks what the hosts said now
        self.ctl.state.flagged_hosts = {r["name"] for r in self.rows if r["flagged"]}

    def action_close(self) -> None:
        self.dismiss(None)
