"""Headless output: every rank's lines as ``[node1 r5] ...`` and a status table at the end.

Same RunController as the TUI (``run_headless`` is what ``run_app`` is to the TUI); the
printer only subscribes to RunState's callbacks and prints.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Awaitable, Callable, TextIO

from .errors import EXIT_FAILED, EXIT_OK
from .run import RunController
from .sanitize import clean
from .state import Event, LineBatch, RunState
from .summary import detach_hint, status_table

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


class SyncProgressLine:
    """Where ``--sync`` stands, on stderr: one line redrawn with ``\r`` on a terminal (at most
    ``interval`` apart), only the final line otherwise (a log file gets no redraws)."""

    def __init__(self, out: TextIO | None = None, interval: float = 0.1):
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.interval = interval
        self.last = 0.0
        self.width = 0

    def __call__(self, line: str, final: bool) -> None:
        now = time.monotonic()
        if not final and (not self.tty or now - self.last < self.interval):
            return
        self.last = now
        if self.tty:  # pad over a longer line drawn before
            self.out.write("\r" + line.ljust(self.width) + ("\n" if final else ""))
            self.width = len(line)
        else:
            self.out.write("[rankdeck] " + line + "\n")
        self.out.flush()


async def run_headless(ctl: RunController, launch: Callable[[], Awaitable] | None = None,
                       resumed: bool = False) -> int:
    """Print ``ctl``'s run until it ends (then its status table) or Ctrl-C detaches; returns
    the exit code. ``launch`` is awaited once the printer listens. ``resumed``: the links'
    ``quiet_until`` say up to where an earlier headless console printed (``attach``)."""
    quiet = {n: link.quiet_until for n, link in ctl.links.items()} if resumed else {}
    printer = HeadlessPrinter(ctl.state, secrets=ctl.secrets, quiet=quiet)
    saved: dict[str, int] = dict(quiet)

    def keep_offsets(node: str) -> None:
        # after the lines are printed: a later `attach --no-tui` goes on from here
        offset = ctl.state.nodes[node].journal_offset
        if offset > saved.get(node, 0):
            saved[node] = offset
            ctl.history.save_offsets(ctl.run_id, saved)
    ctl.state.change_listeners.append(keep_offsets)
    detach = asyncio.Event()
    loop = asyncio.get_running_loop()
    if resumed:  # attach: lines print while it subscribes, so Ctrl-C may come that early
        loop.add_signal_handler(signal.SIGINT, detach.set)
    if launch is not None:
        ctl.sync_listeners.append(SyncProgressLine())
        await launch()
        if not resumed:
            print("[rankdeck] run %s started on %d nodes; Ctrl-C detaches, `rankdeck attach %s` "
                  "comes back" % (ctl.run_id, len(ctl.links), ctl.run_id), file=printer.out,
                  flush=True)
    if not resumed:  # a new run: Ctrl-C during the launch itself still interrupts it
        loop.add_signal_handler(signal.SIGINT, detach.set)
    done = asyncio.ensure_future(ctl.wait_done())
    waiter = asyncio.ensure_future(detach.wait())
    await asyncio.wait([done, waiter], return_when=asyncio.FIRST_COMPLETED)
    loop.remove_signal_handler(signal.SIGINT)
    waiter.cancel()
    if not done.done():
        done.cancel()
        ctl.save_status()
        print("\n" + detach_hint(ctl.run_id), file=sys.stderr)
        return EXIT_OK
    final = done.result()
    await ctl.stop_store()
    ctl.save_status()
    print(status_table(ctl.status()), file=printer.out)
    return EXIT_OK if final == "succeeded" else EXIT_FAILED
