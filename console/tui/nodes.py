"""NodesTable: every host and, under it, its ranks, each with a live state.

A node row shows its launch phase (connecting, preflight, starting, rendezvous, running...),
the step its slowest rank reached, restarts used/left and, once a deep preflight ran
(``launch --preflight deep``), its result in a health column (``ok 9.8G``, ``slow 0.05G``,
``disk``; ``-`` for a node it did not check); when the node has a cause (why it
failed, is unreachable or failed preflight) the cause follows on its own line under the row.
Rank rows show state, step, loss and step time. Enter (or a click on the highlighted row)
shows that rank - or the whole node merged - in the active log pane; kill and restart act on
the highlighted row's node.

At 512 ranks a row per rank is 576 rows: past ``FOLD_ABOVE`` ranks every node starts folded
to its one row (which names its ranks that are not like the node: ``2 stalled: r13 r14``);
``e`` opens or folds the node under the cursor, ``E`` all of them. ``o`` cycles the order
(``O`` backwards; nodeorder.py, the header says which), ``!`` (an app key) goes to the worst
row.
"""

from __future__ import annotations

import math

from textual.binding import Binding

from ..lines.sanitize import clean
from ..model.sources import NODE, RANK
from ..model import health
from ..model.nodes import NodeState
from ..model.state import RunState
from .cells import width_of
from .messages import SourceChosen
from .nodecells import GAP, fit_cells, short_form
from .nodeorder import ORDERS, TELEMETRY, header_label, ordered, worst
from .rowsview import RowsView, line_width
from ..model.summary import node_detail, node_phase, node_step, ranks_by_node
from ..model.telemetry import far_nodes, node_row, row_cells
from ..lines.text import fmt_float
from .styles import state_style
from .suspects import marked_line

STATE_W, STEP_W, RST_W = 11, 5, 4
# the health column, only once a deep preflight ran: `slow 0.05G ` (console/model/health.py
# short), or its word alone (`clock `) where the detail would keep under DETAIL_MIN cells
HEALTH_W, HEALTH_WORD_W, DETAIL_MIN = 11, 6, 8
DIVERGED_STYLE = "bold red"
CAUSE_MAX = 400
FLAG_MARK = " ⚑"  # a host flagged by its record (agent/rules/fleet.py; the hosts screen, H)
FOLD_ABOVE = 16  # ranks in the run: more, and each node starts as one row
ODD_NAMED = 3  # ranks named on a folded node's row, per state
BAD = ("failed", "unreachable", "lost", "gone", "preflight failed")


class NodesTable(RowsView):
    DEFAULT_CSS = """
    NodesTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("e", "fold", "Open or fold the node under the cursor (its rank rows)",
                show=False),
        Binding("E", "fold_all", "Open or fold every node", key_display="E", show=False),
        Binding("o", "order", "Order rows by node / state / step / step time / gpu util / "
                "tok/s / network / cpu", show=False),
        Binding("O", "order(-1)", "Order rows by the order before (o backwards)",
                key_display="O", show=False),
        # on a node row, before the app's `c` (collapse): console/tui/cordon.py
        Binding("c", "app.cordon_node", "Cordon the node: a spare in, or the run shrinks",
                show=False),
    ]

    def __init__(self, state: RunState, **kwargs):
        super().__init__(header=(), cursor=True, **kwargs)
        self.state = state
        self.order = ORDERS[0]
        self.folded: bool | None = None  # every node folded; None: by the rank count
        self._flipped: set[str] = set()  # nodes opened (or folded) against that default
        self._by_node: dict[str, list] = {}
        self._name_w = 9
        self._cells: dict[str, list] = {}  # node -> its telemetry cells (row_cells)
        self._rows: dict[str, dict] = {}  # node -> its telemetry row (node_row)
        self._fitted_width = 0  # the width the rows were fitted to (nodecells.py)
        self._far: dict[str, set] = {}  # node -> columns in which it is far from the others
        self._health = False  # a node has a deep preflight result: the health column shown

    def on_mount(self) -> None:
        self.refresh_rows()

    @property
    def current_node(self) -> str | None:
        """The node of the row under the cursor (a rank row's node)."""
        key = self.cursor_key
        if key is None:
            return None
        if key.startswith("n:"):
            return key[2:]
        rs = self.state.ranks.get(int(key[2:]))
        return rs.node if rs else None

    def refresh_rows(self) -> None:
        """Re-read RunState: the shape now, the rows on screen when painted."""
        state = self.state
        self._by_node = by_node = ranks_by_node(state)
        rows = {ns.name: node_row(ns, by_node.get(ns.name, []))
                for ns in state.nodes.values() if ns.gpu or ns.host}
        self._rows = rows
        self._cells = {name: row_cells(row) for name, row in rows.items()}
        # a node Slurm has drained, down or failing, in Slurm's words: bad news, kept first
        for name, said in ((state.slurm or {}).get("nodes") or {}).items():
            if name in state.nodes:
                self._cells[name] = [("slurm " + said, ("alert",))] + list(
                    self._cells.get(name, ()))
        self._far = far_nodes(rows)
        self._health = any(ns.health for ns in state.nodes.values())
        keys, heights = [], []
        for ns, ranks in ordered(list(state.nodes.values()), by_node, self.order, rows):
            keys.append("n:" + ns.name)
            heights.append(2 if ns.cause else 1)
            if self.is_open(ns.name):
                keys.extend("r:%d" % rs.rank for rs in ranks)
                heights.extend([1] * len(ranks))
        widest = max(state.ranks.values(), key=lambda r: (r.rank, r.local_rank or 0),
                     default=None)
        self._name_w = max([9] + [len(n) + 2 + len(FLAG_MARK) * (n in state.flagged_hosts)
                                  for n in state.nodes] +
                           ([len(self._rank_name(widest))] if widest else []))
        self.header = (self._header_line(),)
        current, node = self.cursor_key, self.current_node
        self.set_shape(keys, heights)
        if current not in keys and "n:%s" % node in keys:  # its rank row folded away
            self.cursor = keys.index("n:%s" % node)
        self.invalidate()

    def _header_line(self) -> tuple:
        """Column names; the one the rows are ordered by ends in ``▼`` (step time: the
        detail column, where ranks show it; a telemetry order: the detail column, where
        nodes show it, named by the order)."""
        names = ["node/rank", "state", "step", "rst", "detail"]
        if self.order in TELEMETRY:
            names[4] = header_label(self.order) + "▼"
        elif self.order != ORDERS[0]:
            column = {"state": 1, "step": 2, "step time": 4}[self.order]
            names[column] = "s/step" if self.order == "step time" else names[column]
            names[column] += "▼"
        return (names[0].ljust(self._name_w) + " " + names[1].ljust(STATE_W) +
                names[2].rjust(STEP_W) + " " + names[3].ljust(RST_W) +
                ("health" if self._health_w >= HEALTH_W else "hlth")[:self._health_w]
                .ljust(self._health_w) + names[4], "")

    @property
    def _health_w(self) -> int:
        """The health column's width: none without a deep preflight, its word alone where
        the whole would leave the detail column under DETAIL_MIN cells."""
        if not self._health:
            return 0
        width = self.scrollable_content_region.width
        fixed = self._name_w + 1 + STATE_W + STEP_W + 1 + RST_W
        return HEALTH_W if width <= 0 or width - fixed >= HEALTH_W + DETAIL_MIN \
            else HEALTH_WORD_W

    # -- folding and ordering --------------------------------------------------------------
    @property
    def all_folded(self) -> bool:
        """Nodes fold by default: as ``E`` left them, else when the run has many ranks."""
        if self.folded is not None:
            return self.folded
        return len(self.state.ranks) > FOLD_ABOVE

    def is_open(self, node: str) -> bool:
        """Whether ``node``'s rank rows are shown."""
        return self.all_folded == (node in self._flipped)

    def set_open(self, node: str, shown: bool) -> None:
        if shown != self.is_open(node):
            self._flipped ^= {node}
            self.refresh_rows()

    def action_fold(self) -> None:
        node = self.current_node
        if node is not None:
            self.set_open(node, not self.is_open(node))
            self.move_to("n:" + node)

    def action_fold_all(self) -> None:
        self.folded = not self.all_folded
        self._flipped.clear()
        self.refresh_rows()
        self._cursor_moved()

    def action_order(self, step: int = 1) -> None:
        """The next order (``step`` -1: the one before)."""
        self.order = ORDERS[(ORDERS.index(self.order) + step) % len(ORDERS)]
        self.refresh_rows()
        self._cursor_moved()

    def go_to_worst(self) -> str | None:
        """Put the cursor on the worst row (nodeorder.worst), opening its node for a rank;
        returns what it is in words (None: no nodes)."""
        culprits = {ev.node: ev.rank for ev in self.state.events
                    if ev.kind in ("failed", "worker failed") and ev.rank is not None}
        found = worst(list(self.state.nodes.values()), self._by_node, culprits)
        if found is None:
            return None
        ns, rs = found
        if rs is None:
            self.move_to("n:" + ns.name)
            return "%s %s" % (ns.name, node_phase(self.state, ns, self._by_node.get(ns.name)))
        self.set_open(ns.name, True)
        self.move_to("r:%d" % rs.rank)
        detail = self._rank_detail(rs)
        return "r%d on %s: %s%s" % (rs.rank, ns.name, rs.state, ", " + detail if detail else "")

    @staticmethod
    def _rank_name(rs) -> str:
        return "  r%d lr%s" % (rs.rank, rs.local_rank)

    def row_values(self, key: str) -> tuple | None:
        """(name, state, step, restarts, detail) of a row as the user reads them."""
        state = self.state
        if key.startswith("n:"):
            ns = state.nodes.get(key[2:])
            if ns is None:
                return None
            ranks = self._by_node.get(ns.name, [])
            step = node_step(state, ns.name, ranks)
            cause = clean(ns.cause)[:CAUSE_MAX] if ns.cause else ""
            mark = ("▾ " if self.is_open(ns.name) else "▸ ") if ranks else "  "
            flag = FLAG_MARK if ns.name in state.flagged_hosts else ""
            return (mark + ns.name + flag, node_phase(state, ns, ranks),
                    "" if step is None else str(step),
                    "%d/%d" % (ns.restarts_used, ns.restarts_left),
                    cause or node_detail(state, ns, ranks) or self._telemetry_text(ns.name))
        rs = state.ranks.get(int(key[2:])) if key.startswith("r:") else None
        if rs is None:
            return None
        return (self._rank_name(rs), rs.state, "" if rs.step is None else str(rs.step), "",
                self._rank_detail(rs))

    def row_lines(self, key: str) -> tuple:
        values = self.row_values(key)
        if values is None:
            return ()
        name, phase, step, restarts, detail = values
        if key.startswith("r:"):
            rs = self.state.ranks[int(key[2:])]
            detail, in_rst = self._fitted_detail(
                rs, width_of(diverged_mark(rs)) + 2 if has_diverged(rs) else 0)
            line = self._line(values[:4] + (detail,), "", state_style(phase), rst=not in_rst)
            if has_diverged(rs):
                line = line[:-1] + ((diverged_mark(rs) + "  ", DIVERGED_STYLE),) + line[-1:]
            return (marked_line(self.state, key, line),)
        ns = self.state.nodes[key[2:]]
        line = marked_line(self.state, key, self._line(
            values if not ns.cause else values[:4] + ("",), "bold", state_style(phase),
            node=ns))
        odd = () if self.is_open(ns.name) else self._odd_ranks(ns.name) + self._diverged(ns.name)
        if not ns.cause and detail and detail == self._telemetry_text(ns.name):
            room = self._room(line_width(line[:-1] + odd))
            return (line[:-1] + odd + self._telemetry_pieces(ns.name, room),)
        if not ns.cause:
            return (line[:-1] + odd + line[-1:],)
        return (line, (("  ↳ " + detail, "red" if ns.state in BAD else "yellow"),))

    def _line(self, values: tuple, name_style: str, phase_style: str,
              rst: bool = True, node: NodeState | None = None) -> tuple:
        """``rst`` False: no restarts nor health column, the detail starts there (a rank
        row's). ``node``: a node row's, its health in the health column (when shown)."""
        name, phase, step, restarts, detail = values
        return ((name.ljust(self._name_w), name_style), (" ", ""),
                (phase[:STATE_W].ljust(STATE_W), phase_style), (step.rjust(STEP_W), ""),
                (" ", ""), (restarts.ljust(RST_W) if rst else "", ""),
                self._health_cell(node) if rst else ("", ""), (detail, "dim"))

    def _health_cell(self, node: NodeState | None) -> tuple:
        """The health column's piece: its deep preflight in short (``ok 9.8G``, ``disk``)."""
        if not self._health_w:
            return ("", "")
        entry = node.health if node is not None else None
        text = health.short(entry) if node is not None else ""
        if self._health_w < HEALTH_W:
            text = text.split(" ", 1)[0]
        style = "dim" if not entry else "green" if entry["ok"] else "bold red"
        return (text[:self._health_w - 1].ljust(self._health_w), style)

    def _odd_ranks(self, node: str) -> tuple:
        """A folded node's ranks whose state is not the most common one among them, by state:
        ``2 stalled: r13 r14  `` (at most ``ODD_NAMED`` named, then ``+N``)."""
        ranks = self._by_node.get(node, [])
        counts: dict[str, list] = {}
        for rs in ranks:
            counts.setdefault(rs.state, []).append(rs.rank)
        if len(counts) < 2:
            return ()
        common = max(counts, key=lambda st: len(counts[st]))
        pieces = []
        for st, numbers in counts.items():
            if st != common:
                named = " ".join("r%d" % r for r in numbers[:ODD_NAMED])
                more = " +%d" % (len(numbers) - ODD_NAMED) if len(numbers) > ODD_NAMED else ""
                pieces.append(("%d %s: %s%s  " % (len(numbers), st, named, more),
                               state_style(st)))
        return tuple(pieces)

    def _diverged(self, node: str) -> tuple:
        """A folded node's ranks whose loss went inf or NaN: ``NaN@12 r3  ``."""
        bad = [rs for rs in self._by_node.get(node, []) if has_diverged(rs)]
        if not bad:
            return ()
        named = " ".join("%s r%d" % (diverged_mark(rs), rs.rank) for rs in bad[:ODD_NAMED])
        more = " +%d" % (len(bad) - ODD_NAMED) if len(bad) > ODD_NAMED else ""
        return ((named + more + "  ", DIVERGED_STYLE),)

    def _telemetry_text(self, node: str) -> str:
        return clean("  ".join(text for text, _cols in self._cells.get(node, ())))

    def _telemetry_pieces(self, node: str, room: int | None = None) -> tuple:
        """The node's telemetry cells fitted into ``room`` (nodecells.py; None: all whole);
        a value far from the other nodes' in bold red. Bad news (an alert) and the cell of
        the order the rows follow are kept first, then the cells in their order."""
        far = self._far.get(node, set())
        cells = self._cells.get(node, ())
        ordered_by = set(TELEMETRY[self.order][0]) if self.order in TELEMETRY else set()
        row = self._rows.get(node, {})
        fitted = fit_cells([(clean(text), clean(short_form(text, row)),
                             0 if "alert" in cols else 1 if ordered_by.intersection(cols) else 2)
                            for text, cols in cells], room)
        return tuple(((GAP if n else "") + text,
                      "bold red" if "alert" in cells[i][1] or far.intersection(cells[i][1])
                      else "dim")
                     for n, (i, text) in enumerate(fitted))

    def _room(self, used: int) -> int | None:
        """The cells left on a row after ``used`` (None before the table has a size)."""
        width = self.scrollable_content_region.width
        return max(0, width - used) if width > 0 else None

    def _fitted_detail(self, rs, marked: int = 0) -> tuple[str, bool]:
        """A rank row's detail fitted to its room, its pieces whole or left out (nodecells),
        and whether it starts in the restarts column: a rank row has none, so its detail
        takes that room when its first piece would not fit whole without it. ``marked``: the
        cells a divergence mark takes before it."""
        detail = self._rank_detail(rs)
        room = self._room(self._name_w + 1 + STATE_W + STEP_W + 1 + RST_W + self._health_w +
                          marked)
        if room is None or width_of(detail) <= room:
            return detail, False
        pieces = detail.split(GAP)
        in_rst = width_of(pieces[0]) > room
        fitted = fit_cells([(p, p, i) for i, p in enumerate(pieces)],
                           room + RST_W + self._health_w if in_rst else room)
        return GAP.join(text for _i, text in fitted), in_rst

    def on_resize(self, event) -> None:
        """Rows are fitted to the table's width: built again when it changes."""
        if self.scrollable_content_region.width != self._fitted_width:
            self._fitted_width = self.scrollable_content_region.width
            self.header = (self._header_line(),)
            self.invalidate()

    @staticmethod
    def _rank_detail(rs) -> str:
        if not rs.reports and rs.state in ("running", "stalled"):
            # it prints no steps (a Hugging Face Trainer logs on rank 0): its state is the run's
            return "silent: %s with the run" % ("waits" if rs.state == "stalled" else "steps")
        if rs.state == "stalled":
            return "no step after %s" % rs.step
        parts = []
        if rs.loss is not None:
            parts.append("loss %s" % fmt_float(rs.loss, 3))
        if rs.step_time is not None:
            parts.append("%.2fs/step" % rs.step_time)
        return "  ".join(parts)

    def row_chosen(self, key: str) -> None:
        if key.startswith("n:"):
            self.post_message(SourceChosen((NODE, key[2:])))
        elif key.startswith("r:"):
            self.post_message(SourceChosen((RANK, int(key[2:]))))


def has_diverged(rs) -> bool:
    """Its loss went inf or NaN (at a step it may not have said)."""
    return rs.diverged is not None or (rs.loss is not None and not math.isfinite(rs.loss))


def diverged_mark(rs) -> str:
    """``NaN@12``: the step of a rank's first loss that was inf or NaN."""
    return "NaN@%s" % ("?" if rs.diverged is None else rs.diverged)
