"""Headless output: every rank's lines as ``[node1 r5] ...`` and a summary table at the end.

Same RunController as the TUI; this only subscribes to RunState's callbacks and prints.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .sanitize import clean
from .state import Event, LineBatch, RunState

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")


class HeadlessPrinter:
    def __init__(self, state: RunState, out: TextIO | None = None, colour: bool | None = None,
                 secrets: list[str] | None = None, rank: int | None = None,
                 node: str | None = None, events: bool = True,
                 quiet: dict[str, int] | None = None):
        self.state = state
        self.out = out or sys.stdout
        self.colour = self.out.isatty() if colour is None else colour
        self.secrets = tuple(secrets or ())
        self.only_rank = rank
        self.only_node = node
        # resuming after another console: its events were printed already (per node, up to
        # the journal offset it had printed)
        self.quiet = quiet or {}
        self.node_colour = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(state.nodes)}
        state.line_listeners.append(self.on_lines)
        if events:
            state.event_listeners.append(self.on_event)

    def prefix(self, node: str, batch: LineBatch) -> str:
        if batch.rank is not None:
            who = "r%d" % batch.rank
        elif batch.stream == "torchrun":
            who = "torchrun"
        else:
            who = "lr%s" % batch.local_rank
        text = "[%s %s]" % (node, who)
        if self.colour:
            return "\x1b[%sm%s\x1b[0m" % (self.node_colour.get(node, "0"), text)
        return text

    def on_lines(self, batch: LineBatch) -> None:
        if self.only_rank is not None and batch.rank != self.only_rank:
            return
        if self.only_node is not None and batch.node != self.only_node:
            return
        if not batch.lines:
            return
        prefix = self.prefix(batch.node, batch)
        self.out.write("".join("%s %s\n" % (prefix, clean(line, self.secrets))
                               for line in batch.lines))
        self.out.flush()

    def on_event(self, ev: Event) -> None:
        if self.only_node is not None and ev.node != self.only_node:
            return
        if ev.node in self.quiet and \
                self.state.nodes[ev.node].journal_offset < self.quiet[ev.node]:
            return
        text = "[rankdeck] %s%s" % ("%s: " % ev.node if ev.node else "", clean(ev.text,
                                                                              self.secrets))
        if self.colour:
            text = "\x1b[1m%s\x1b[0m" % text
        self.out.write(text + "\n")
        self.out.flush()


def summary_table(status: dict) -> str:
    """The run's end state, one row per rank, plain text."""
    rows = [("node", "state", "restarts", "exit", "rank", "rank state", "step", "loss")]
    for node in status["nodes"]:
        used, left = node["restarts_used"], node["restarts_left"]
        base = (node["name"], node["state"], "%d used, %d left" % (used, left),
                "" if node["exit_code"] is None else str(node["exit_code"]))
        if not node["ranks"]:
            rows.append(base + ("-", "-", "-", "-"))
        for r in node["ranks"]:
            loss = "" if r["loss"] is None else "%.4f" % r["loss"]
            rows.append(base + (str(r["rank"]), r["state"], str(r["step"] or ""), loss))
            base = ("", "", "", "")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = "run %s: %s (%.0f s)" % (status["run_id"], status["state"],
                                    time.time() - status.get("started", time.time()))
    causes = ["  %s: %s" % (n["name"], n["cause"]) for n in status["nodes"] if n.get("cause")]
    return "\n".join([head] + lines + (["causes:"] + causes if causes else []))
