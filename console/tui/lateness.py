"""LatenessScreen (``L``): how long the other ranks wait for each rank, worst first.

One row a rank: rank, node, slowdown (``1.43x``), the share of the time the others wait for
it (the median of its newest shares, agent/rules/straggler.py ``sustained``) and a strip of its
recent shares, one cell a sample tick, newest at the right, as a coloured sparkline. A rank
flagged as a straggler is drawn like a verdict's suspect. Ranks are ordered by sustained
share, then newest share; only the rows that fit are built (a 512-rank run shows the top
ones and says how many more). Enter shows the rank's log in the active pane.

The numbers are RunState's (``state.stragglers``, fed by the supervisors' ``sample``
records, agent/supervisor/ranksample.py); the screen re-reads them at most once a ``REDRAW_S``, and only
when a tick was reduced or the ranks changed.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..lines.sanitize import clean
from ..model.sources import RANK
from ..model.state import RunState
from agent.rules.straggler import HISTORY, SHARE_MIN
from .messages import SourceChosen
from .rowsview import RowsView
from .styles import SUSPECT_STYLE

REDRAW_S = 1.0
SHARE_TOP = 0.95  # agent/rules/straggler.py caps a share there
SPARKS = "▁▂▃▄▅▆▇█"
NODE_W = 16
MORE = "more"
EMPTY = ("no lateness samples yet: the supervisors sample every 10 s (RANKDECK_SAMPLE_S);",
         "a tick counts once every rank of the world has sent its collectives' entry times")
HEADER = (("rank".rjust(6) + "  " + "node".ljust(NODE_W) + "  slowdown  waits  "
           + "lateness, newest right".ljust(HISTORY), ""),)


def share_of(value) -> float | None:
    """A share as the view may use it: a finite number in [0, 1], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value <= 1 else None  # NaN fails the comparison too


def share_style(share: float) -> str:
    if share >= SHARE_MIN:
        return "bold red"
    return "yellow" if share >= SHARE_MIN / 2 else "green"


def strip_pieces(shares) -> tuple:
    """``(text, style)`` pieces of a rank's strip: ``HISTORY`` cells, one a share, newest at
    the right (blank before its first sample, ``?`` for a value that is not a share)."""
    cells = []
    for value in list(shares)[-HISTORY:]:
        share = share_of(value)
        if share is None:
            cells.append(("?", "dim"))
        else:
            level = min(len(SPARKS) - 1, int(share / SHARE_TOP * len(SPARKS)))
            cells.append((SPARKS[level], share_style(share)))
    pieces = [(" " * (HISTORY - len(cells)), "")] if len(cells) < HISTORY else []
    for char, style in cells:  # one piece a run of one style
        if pieces and pieces[-1][1] == style:
            pieces[-1] = (pieces[-1][0] + char, style)
        else:
            pieces.append((char, style))
    return tuple(pieces)


def worst_first(state: RunState) -> list[tuple[int, float | None, float | None]]:
    """``(rank, sustained share, newest share)`` of every rank with samples or known to the
    run, worst first: by sustained share, then newest share (ranks without one last)."""
    st = state.stragglers
    out = []
    for rank in set(st.history) | set(state.ranks):
        if not isinstance(rank, int):
            continue
        shares = st.history.get(rank) or ()
        try:
            sustained = share_of(st.sustained(rank)) if shares else None
        except (TypeError, ValueError):  # not numbers: a bug upstream, not a crash here
            sustained = None
        out.append((rank, sustained, share_of(shares[-1]) if shares else None))
    out.sort(key=lambda r: (-1.0 if r[1] is None else -r[1], -1.0 if r[2] is None else -r[2],
                            r[0]))
    return out


class LatenessView(RowsView):
    """The ranks' rows, worst first; only as many as fit, then how many more."""

    DEFAULT_CSS = """
    LatenessView { height: 1fr; }
    """

    def __init__(self, state: RunState, **kwargs):
        super().__init__(header=HEADER, **kwargs)
        self.state = state
        self.order: list[tuple] = []
        self._facts: dict[str, tuple] = {}
        self._more = 0
        self._seen = None

    def update_rows(self, force: bool = False) -> None:
        """Re-read the run's shares if a tick was reduced, the ranks or the size changed."""
        st = self.state.stragglers
        fit = max(1, self.scrollable_content_region.height - 1)
        seen = (st.ticks, len(st.history), len(self.state.ranks), frozenset(st.flagged), fit)
        if seen == self._seen and not force:
            return
        self._seen = seen
        if not st.history:
            self.order, self._facts, self._more = [], {}, 0
            keys = ["empty"]
        else:
            self.order = worst_first(self.state)
            shown = self.order if len(self.order) <= fit else self.order[:fit - 1]
            self._more = len(self.order) - len(shown)
            self._facts = {"r:%d" % r: (r, sustained) for r, sustained, _newest in shown}
            keys = list(self._facts) + ([MORE] if self._more else [])
        self.set_shape(keys, [len(EMPTY) if k == "empty" else 1 for k in keys])
        self.invalidate()

    @property
    def ranks_shown(self) -> list[int]:
        return [fact[0] for fact in self._facts.values()]

    def row_lines(self, key: str) -> tuple:
        if key == "empty":
            return tuple(((line, "dim"),) for line in EMPTY)
        if key == MORE:
            more = "+%d more rank%s, less late" % (self._more, "s"[:self._more != 1])
            return (((more, "dim"),),)
        rank, sustained = self._facts[key]
        st, rs = self.state.stragglers, self.state.ranks.get(rank)
        node = clean(str(rs.node)) if rs is not None else "?"
        node = node if len(node) <= NODE_W else node[:NODE_W - 1] + "…"
        flagged = rank in st.flagged
        slowdown = "-" if sustained is None else "%.2fx" % round(  # as Stragglers.slowdown
            1.0 / (1.0 - min(sustained, SHARE_TOP)), 2)
        waits = "-" if sustained is None else "%d%%" % round(sustained * 100)
        name_style = SUSPECT_STYLE if flagged else ""
        line = (("%6d" % rank, name_style), ("  ", ""), (node.ljust(NODE_W), name_style),
                ("  " + slowdown.rjust(8), "bold" if flagged else ""),
                ("  " + waits.rjust(5) + "  ", ""))
        line += strip_pieces(st.history.get(rank) or ())
        if flagged:
            line += (("  ", ""), (" straggler ", SUSPECT_STYLE))
        elif not st.history.get(rank):
            line += (("  no samples", "dim"),)
        return (line,)

    def row_chosen(self, key: str) -> None:
        if key in self._facts:
            self.screen.dismiss(self._facts[key][0])

    def on_resize(self, event: events.Resize) -> None:
        self.update_rows()


class LatenessScreen(ModalScreen[int | None]):
    """Dismisses with the rank chosen (enter) to show in the active log pane, or None."""

    DEFAULT_CSS = """
    LatenessScreen { align: center middle; }
    LatenessScreen > Vertical {
        width: 96; max-width: 95%; height: 90%; padding: 0 1;
        border: thick $accent; background: $surface;
    }
    LatenessScreen #lateness-keys { margin-top: 1; }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close"),
        Binding("L", "close", "Close", key_display="L"),
    ]

    def __init__(self, state: RunState, **kwargs):
        super().__init__(**kwargs)
        self.state = state

    def compose(self) -> ComposeResult:
        self.view = LatenessView(self.state, id="lateness-rows")
        with Vertical() as box:
            box.border_title = "lateness: how long the others wait for each rank, worst first"
            yield self.view
            yield Static("enter: the rank's log   up/down: rows   esc: close",
                         id="lateness-keys", markup=False)

    def on_mount(self) -> None:
        self.view.focus()
        self.view.update_rows(force=True)
        self.set_interval(REDRAW_S, self.view.update_rows)

    def action_close(self) -> None:
        self.dismiss(None)


def open_lateness(app) -> None:
    """``L``: the lateness screen; the rank chosen there goes to the active log pane."""
    def chosen(rank: int | None) -> None:
        if rank is not None:
            app.post_message(SourceChosen((RANK, rank)))
    app.push_screen(LatenessScreen(app.ctl.state), chosen)
