"""Headless output: every rank's lines as ``[node1 r5] ...`` and a status table at the end.

Same RunController as the TUI (``run_headless`` is what ``run_app`` is to the TUI); the
printer only subscribes to RunState's callbacks and prints. Leaving the run (its store, its
saved status) and the exit code are the controller's (``RunController.leave``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Awaitable, Callable, TextIO

from ..run.run import RunController
from ..lines.sanitize import clean
from ..model.state import RunState
from ..model.nodes import Event, LineBatch
from ..model.summary import detach_hint, status_table
from ..lines.timeorder import TimeOrder
from ..judgement.verdict import verdict_lines

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")


class HeadlessPrinter:
    def __init__(self, state: RunState, out: TextIO | None = None, colour: bool | None = None,
                 secrets: list[str] | None = None, rank: int | None = None,
                 node: str | None = None, events: bool | tuple[str, ...] = True,
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
        # True: every event; a tuple: only those kinds (`logs` prints checkpoints)
        self.event_kinds = events if isinstance(events, tuple) else None
        self.order: TimeOrder | None = None  # a replay being put in time order
        self.ends: dict[str, int] = {}  # journal sizes the replay is done at
        state.line_listeners.append(self.on_lines)
        if events:
            state.event_listeners.append(self.on_event)

    def in_time_order(self, ends: dict[str, int], by_node: bool = False) -> None:
        """Print what the nodes replay up to ``ends`` (their journal sizes now) in time
        order across nodes (``by_node``: node by node) rather than as it arrives."""
        self.order = TimeOrder(list(self.state.nodes), self.write, by_node)
        self.ends = ends
        self.state.change_listeners.append(self.replayed)
        for node in self.state.nodes:
            self.replayed(node)

    def replayed(self, node: str) -> None:
        ns = self.state.nodes[node]
        if self.order is not None and node not in self.order.done and \
                (ns.journal_offset >= self.ends.get(node, 0) or ns.stream_end is not None):
            self.order.finish(node)

    def release(self) -> None:
        """Print whatever the ordering still holds (a node that stopped sending)."""
        if self.order is not None:
            self.order.finish_all()

    def put(self, node: str | None, ts: float | None, text: str) -> None:
        if self.order is not None:
            self.order.add(node, ts, text)
        else:
            self.write(text)

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

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
        self.put(batch.node, batch.ts, "".join("%s %s\n" % (prefix, clean(line, self.secrets))
                                               for line in batch.lines))

    def on_event(self, ev: Event) -> None:
        if self.only_node is not None and ev.node != self.only_node:
            return
        if self.event_kinds is not None and ev.kind not in self.event_kinds:
            return
        if self.only_rank is not None and ev.rank is not None and ev.rank != self.only_rank:
            return
        if ev.node in self.quiet and \
                self.state.nodes[ev.node].journal_offset < self.quiet[ev.node]:
            return
        text = "[rankdeck] %s%s" % ("%s: " % ev.node if ev.node else "", clean(ev.text,
                                                                              self.secrets))
        if ev.kind == "verdict" and self.state.verdict:  # each suspect and its source line
            text += "".join("\n[rankdeck] " + clean(line, self.secrets)
                            for line in verdict_lines(self.state.verdict)[1:])
        if self.colour:
            text = "\x1b[1m%s\x1b[0m" % text
        self.put(ev.node, ev.ts, text + "\n")


async def journal_ends(ctl: RunController) -> dict[str, int]:
    """Every connected node's journal size now: where a replay of it is done."""
    async def one(link):
        st = await link.request("state", run_root=link.run_root, node=link.name)
        return int(st.get("journal_size") or 0)
    got = await ctl.gather_nodes(one, ctl.connected())
    return {n: v for n, v in got.items() if isinstance(v, int)}


class SyncProgressLine:
    """Where ``--sync`` stands, on stderr: one line redrawn with ``\r`` on a terminal (at most
    ``interval`` apart), only the final line otherwise (a log file gets no redraws)."""

    def __init__(self, out: TextIO | None = None, interval: float = 0.1):
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.interval = interval
        self.last = float("-inf")
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


async def release_when_caught_up(ctl: RunController, printer: HeadlessPrinter) -> None:
    if printer.order is None:
        return
    await ctl.caught_up()
    printer.release()


async def run_headless(ctl: RunController, launch: Callable[[], Awaitable] | None = None,
                       resumed: bool = False, by_node: bool = False) -> int:
    """Print ``ctl``'s run until it ends (then its status table) or Ctrl-C detaches; returns
    the exit code (``ctl.exit_code()``; the caller then leaves the run: ``ctl.leave()``).
    ``launch`` is awaited once the printer listens. ``resumed``: the links'
    ``quiet_until`` say up to where an earlier headless console printed (``attach``); what
    the nodes replay prints in time order across nodes (``by_node``: node by node)."""
    quiet = {n: link.quiet_until for n, link in ctl.links.items()} if resumed else {}
    printer = HeadlessPrinter(ctl.state, secrets=ctl.secrets, quiet=quiet)
    if resumed:
        printer.in_time_order(await journal_ends(ctl), by_node)
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
    # a node that stops sending holds the others' lines back no longer than caught_up waits
    releasing = asyncio.ensure_future(release_when_caught_up(ctl, printer))
    done = asyncio.ensure_future(ctl.wait_done())
    waiter = asyncio.ensure_future(detach.wait())
    await asyncio.wait([done, waiter], return_when=asyncio.FIRST_COMPLETED)
    loop.remove_signal_handler(signal.SIGINT)
    waiter.cancel()
    releasing.cancel()
    printer.release()  # the offsets saved say these lines were printed
    if not done.done():
        done.cancel()
        print("\n" + detach_hint(ctl.run_id), file=sys.stderr)
    else:
        print(status_table(ctl.status()), file=printer.out)
    return ctl.exit_code()
