"""`rankdeck report`: one Markdown page about a run, and its loss curve as an SVG beside it.

Built from a RunState the nodes' journals were replayed into (as `export` and `status` do):
the per node table (state, restarts, step, GPU utilisation and memory, network, step time,
tokens/s, CPU: console/model/telemetry.py), the checkpoints (complete or not, the last complete one,
what each node resumed from), the run's goodput (console/records/goodput.py), restarts,
stalls and verdicts (the run's events), and the loss of every rank by step. Everything a host sent is untrusted: it is cleaned and its secrets
masked (console/lines/sanitize.py) and then escaped, so no host text becomes Markdown, HTML or SVG.
The SVG is written by hand (no plotting dependency).
"""

from __future__ import annotations

import os
import time
from xml.sax.saxutils import escape as xml_escape

from ..lines.sanitize import clean
from .goodput import report_section
from ..model.state import RunState
from ..model.telemetry import node_row
from ..lines.text import human_bytes

# event kinds the report lists: what an operator asks about after a run
REPORTED_EVENTS = ("launched", "restarting", "worker failed", "killed", "stopping", "exited",
                   "failed", "stopped", "lost", "gone", "stalled", "recovered", "verdict",
                   "resumed",
                   "checkpoint incomplete", "checkpoint deleted", "world", "unreachable",
                   "stream stopped")
MAX_EVENTS = 200
_MD_SPECIAL = "\\`*_{}[]()#+!|~"
_SVG_W, _SVG_H, _PAD = 640, 320, 48
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


class RunReport:
    """The report of one replayed run; ``write`` puts it into a folder."""

    def __init__(self, state: RunState):
        self.state = state

    def text(self, value, limit: int = 300) -> str:
        """Host text as Markdown that shows it literally: cleaned, secrets masked, escaped."""
        line = clean(str(value), self.state.masker, limit)
        line = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in line)

    def write(self, out_dir: str) -> list[str]:
        """Writes ``<run>-report.md`` and ``<run>-loss.svg`` into ``out_dir``; their paths."""
        os.makedirs(out_dir, exist_ok=True)
        run = self.state.run_id
        svg_name = "%s-loss.svg" % run
        paths = [os.path.join(out_dir, "%s-report.md" % run), os.path.join(out_dir, svg_name)]
        for path, body in zip(paths, (self.markdown(svg_name), loss_svg(self.state))):
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)
        return paths

    def markdown(self, svg_name: str) -> str:
        status = self.state.status()
        head = ["# Run %s" % self.text(status["run_id"]), "",
                "State: **%s**; world size %s; started %s." % (
                    self.text(status["state"]), status.get("world_size") or "?",
                    _when(status.get("started"))), ""]
        return "\n".join(head + self.nodes_section(status) + self.loss_section(svg_name) +
                         self.checkpoints_section(status) +
                         report_section(status["goodput"], self.text) +
                         self.events_section()) + "\n"

    def nodes_section(self, status: dict) -> list[str]:
        rows = []
        for node in status["nodes"]:
            ns = self.state.nodes[node["name"]]
            tele = node_row(ns, self.state.ranks_of(ns.name))
            ranks = node["ranks"]
            rows.append([self.text(node["name"]), self.text(node["state"]),
                         str(node.get("restarts_used") or 0),
                         _num(max((r["step"] for r in ranks if r.get("step") is not None),
                                  default=None), "%d"),
                         _pair(tele.get("gpu_util_min"), tele.get("gpu_util_mean"), "%.0f"),
                         _mem(tele.get("gpu_mem_used"), tele.get("gpu_mem_total")),
                         _pair(tele.get("net_rx_gbps"), tele.get("net_tx_gbps"), "%.2f"),
                         _num(tele.get("step_time"), "%.3f"), _num(tele.get("tok_s"), "%.0f"),
                         _num(tele.get("cpu_pct"), "%.0f")])
        return ["## Nodes", ""] + _table(
            ["node", "state", "restarts", "step", "GPU util % min/mean", "GPU memory",
             "net Gbit/s in/out", "step time s", "tok/s", "CPU %"], rows) + [""]

    def loss_section(self, svg_name: str) -> list[str]:
        if not any(len(rs.points) for rs in self.state.ranks.values()):
            return ["## Loss", "", "No rank reported a loss.", ""]
        return ["## Loss", "", "![loss by step, one line per rank](%s)" % svg_name, ""]

    def checkpoints_section(self, status: dict) -> list[str]:
        rows = []
        for c in status["checkpoints"]:
            state = "complete" if c.get("complete") else "writing" if c.get(
                "complete") is None else "incomplete: lacks " + ", ".join(c.get("missing") or [])
            if not c.get("exists"):
                state += ", deleted"
            rows.append([("**last complete** " if c.get("last_complete") else "") +
                         _num(c.get("step"), "%d"), self.text(c.get("node")),
                         self.text(c.get("path")),
                         human_bytes(c["bytes"]) if c.get("bytes") is not None else "-",
                         _num(c.get("seconds"), "%.1f s"), self.text(state)])
        lines = ["## Checkpoints", ""]
        lines += _table(["step", "node", "path", "size", "took", "state"], rows) if rows else [
            "No checkpoint was saved."]
        for r in status.get("resumed_from") or ():
            lines += ["", "%s resumed from step %s: %s" % (
                self.text(r["node"]), _num(r.get("step"), "%d"), self.text(r.get("path") or "?"))]
        return lines + [""]

    def events_section(self) -> list[str]:
        events = [ev for ev in self.state.events if ev.kind in REPORTED_EVENTS][-MAX_EVENTS:]
        rows = [[_when(ev.ts), self.text(ev.node or "run"),
                 "" if ev.rank is None else str(ev.rank), self.text(ev.kind),
                 self.text(ev.text)] for ev in events]
        lines = ["## Restarts, stalls and verdicts", ""]
        lines += _table(["time", "node", "rank", "what", "detail"], rows) if rows else [
            "Nothing happened to the run beyond training."]
        verdict = self.state.verdict
        if verdict:
            lines += ["", "Verdict: " + self.text(verdict.get("summary") or verdict.get("kind"))]
        return lines + [""]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(row) + " |" for row in rows]


def _when(ts) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt % value


def _pair(a, b, fmt: str) -> str:
    return "-" if a is None and b is None else "%s/%s" % (_num(a, fmt), _num(b, fmt))


def _mem(used, total) -> str:
    return "-" if used is None else "%s of %s" % (human_bytes(used), human_bytes(total))


def loss_svg(state: RunState) -> str:
    """Every rank's loss by step as one SVG polyline each, with the axes' ranges."""
    series = {rank: list(rs.points) for rank, rs in sorted(state.ranks.items()) if len(rs.points)}
    points = [p for pts in series.values() for p in pts]
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
             'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">'
             % (_SVG_W, _SVG_H, _SVG_W, _SVG_H),
             '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="16">loss by step, run %s</text>' % (_PAD, xml_escape(state.run_id))]
    if points:
        x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
        y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
        parts += _axes(x0, x1, y0, y1)
        for i, (rank, pts) in enumerate(series.items()):
            colour = _COLOURS[i % len(_COLOURS)]
            coords = " ".join("%.1f,%.1f" % _xy(s, v, x0, x1, y0, y1) for s, v in pts)
            parts.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s">'
                         '<title>rank %d</title></polyline>' % (colour, coords, rank))
            parts.append('<text x="%d" y="%d" fill="%s">rank %d</text>'
                         % (_SVG_W - _PAD + 4, 32 + 14 * i, colour, rank))
    else:
        parts.append('<text x="%d" y="%d">no loss reported</text>' % (_PAD, _SVG_H // 2))
    return "\n".join(parts + ["</svg>"]) + "\n"


def _xy(step, loss, x0, x1, y0, y1) -> tuple[float, float]:
    width, height = _SVG_W - 2 * _PAD, _SVG_H - 2 * _PAD
    x = _PAD + (step - x0) / ((x1 - x0) or 1) * width
    y = _SVG_H - _PAD - (loss - y0) / ((y1 - y0) or 1) * height
    return x, y


def _axes(x0, x1, y0, y1) -> list[str]:
    left, right, top, bottom = _PAD, _SVG_W - _PAD, _PAD, _SVG_H - _PAD
    return ['<path d="M%d %d V%d H%d" stroke="black" fill="none"/>' % (left, top, bottom, right),
            '<text x="%d" y="%d">%d</text>' % (left, bottom + 16, x0),
            '<text x="%d" y="%d" text-anchor="end">%d</text>' % (right, bottom + 16, x1),
            '<text x="%d" y="%d" text-anchor="end">%.4g</text>' % (left - 4, bottom, y0),
            '<text x="%d" y="%d" text-anchor="end">%.4g</text>' % (left - 4, top + 4, y1),
            '<text x="%d" y="%d" text-anchor="middle">step</text>'
            % ((left + right) // 2, bottom + 30)]
