"""NodesTable: every host and, under it, its ranks, each with a live state.

A node row shows its launch phase (connecting, preflight, starting, rendezvous, running...),
the step its slowest rank reached and restarts used/left; when the node has a cause (why it
failed, is unreachable or failed preflight) the cause follows on its own line under the row.
Rank rows show state, step, loss and step time. Enter (or a click on the highlighted row)
shows that rank - or the whole node merged - in the active log pane; kill and restart act on
the highlighted row's node.
"""

from __future__ import annotations

from ..sanitize import clean
from ..state import RunState
from .feed import NODE, RANK
from .messages import SourceChosen
from .rowsview import RowsView
from ..summary import node_detail, node_phase, node_step, ranks_by_node
from ..telemetry import far_nodes, node_telemetry, row_cells
from ..text import fmt_float
from .styles import state_style

STATE_W, STEP_W, RST_W = 13, 6, 5
CAUSE_MAX = 400
BAD = ("failed", "unreachable", "lost", "preflight failed")


class NodesTable(RowsView):
    DEFAULT_CSS = """
    NodesTable { height: 1fr; }
    """

    def __init__(self, state: RunState, **kwargs):
        super().__init__(header=(), cursor=True, **kwargs)
        self.state = state
        self._by_node: dict[str, list] = {}
        self._name_w = 9
        self._cells: dict[str, list] = {}  # node -> its telemetry cells (row_cells)
        self._far: dict[str, set] = {}  # node -> columns in which it is far from the others

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
        rows = {ns.name: node_telemetry(ns.gpu, ns.host, by_node.get(ns.name, []))
                for ns in state.nodes.values() if ns.gpu or ns.host}
        self._cells = {name: row_cells(row) for name, row in rows.items()}
        self._far = far_nodes(rows)
        keys, heights = [], []
        for ns in state.nodes.values():
            keys.append("n:" + ns.name)
            heights.append(2 if ns.cause else 1)
            for rs in by_node.get(ns.name, []):
                keys.append("r:%d" % rs.rank)
                heights.append(1)
        widest = max(state.ranks.values(), key=lambda r: (r.rank, r.local_rank or 0),
                     default=None)
        self._name_w = max([9] + [len(n) for n in state.nodes] +
                           ([len(self._rank_name(widest))] if widest else []))
        self.header = (("node/rank".ljust(self._name_w) + "  " + "state".ljust(STATE_W) +
                        "step".rjust(STEP_W) + "  " + "rst".ljust(RST_W) + "detail", ""),)
        self.set_shape(keys, heights)
        self.invalidate()

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
            return (ns.name, node_phase(state, ns, ranks), "" if step is None else str(step),
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
            return (self._line(values, "", state_style(phase)),)
        ns = self.state.nodes[key[2:]]
        line = self._line(values if not ns.cause else values[:4] + ("",), "bold",
                          state_style(phase))
        if not ns.cause and detail and detail == self._telemetry_text(ns.name):
            return (line[:-1] + self._telemetry_pieces(ns.name),)
        if not ns.cause:
            return (line,)
        return (line, (("  ↳ " + detail, "red" if ns.state in BAD else "yellow"),))

    def _line(self, values: tuple, name_style: str, phase_style: str) -> tuple:
        name, phase, step, restarts, detail = values
        return ((name.ljust(self._name_w), name_style), ("  ", ""),
                (phase[:STATE_W].ljust(STATE_W), phase_style), (step.rjust(STEP_W), ""),
                ("  ", ""), (restarts.ljust(RST_W), ""), (detail, "dim"))

    def _telemetry_text(self, node: str) -> str:
        return clean("  ".join(text for text, _cols in self._cells.get(node, ())))

    def _telemetry_pieces(self, node: str) -> tuple:
        """The node's telemetry cells; a value far from the other nodes' in bold red."""
        far = self._far.get(node, set())
        return tuple((("  " if i else "") + clean(text),
                      "bold red" if "alert" in cols or far.intersection(cols) else "dim")
                     for i, (text, cols) in enumerate(self._cells.get(node, ())))

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
