"""Restart recovery: rankdeck's restart request to every rank stepping again, vs torchrun's own.

Four local nodes (LocalTransport, 127.0.0.2-5), real torchrun, the reference trainer with the
tiny test model. For each restart it measures, in the same run:

- total: from the console's restart request (``ctl.restart("node2")`` for a node restart,
  ``ctl.restart()`` for a whole-run restart) to the console having seen a step line from a
  new worker on every node (every rank stepping again);
- torchrun's own recovery: from the moment the (last) new torchrun process started (the
  supervisor's ``launched`` journal event, stamped at fork) to every rank's first step line
  on its node (stamped when the node's supervisor read it) - what torchrun itself needs to
  bring the job back after its start, whoever starts it;
- rankdeck's overhead = total - torchrun's own, split into kill (request to the old run
  verified gone: the workers' and the old torchrun's own exit), relaunch (to the new
  torchrun's start) and delivery (node read to console arrival of the last step line).

The other nodes' torchruns restart their workers too (the ranks agree to stop when one node's
are told to): the table shows when each node's torchrun logged it restarts its worker group.

    .venv/bin/python bench/restart.py [--reps 2] [--grace 10]

Never a test: timings on a shared 2-core machine are noisy. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from console.records.history import History  # noqa: E402
from console.run.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from spine.helpers import TINY, TRAINER, local_inventory, processes_of  # noqa: E402

START = re.compile(r"^rank=(\d+) local_rank=\d+ world_size=\d+ .*pid=(\d+)")
STEP = re.compile(r"^step=(\d+) ")
# torchrun's own log lines when it restarts a worker group: at its default log level it says
# so only through the failure it restarts for, or the death signal when it is told to stop.
TORCHRUN_RESTART = re.compile(r"restart|rendezvous|failed \(exitcode|death signal",
                              re.IGNORECASE)
TIMEOUT = 300


class Watch:
    """Follows the console's line batches and events; one measurement at a time."""

    def __init__(self, ctl: RunController):
        self.ctl = ctl
        self.known_pids: set[int] = set()
        self.reset(0.0)
        ctl.state.line_listeners.append(self.on_lines)
        ctl.state.event_listeners.append(self.on_event)

    def reset(self, since: float) -> None:
        self.since = since
        self.new_worker: dict[str, int] = {}  # node -> pid of its new worker
        self.stepped: dict[str, tuple[float, float]] = {}  # node -> (node ts, console ts)
        self.launched: dict[str, float] = {}  # node -> new torchrun's start (supervisor ts)
        self.killed: dict[str, float] = {}  # node -> old run verified gone (supervisor ts)
        self.torchrun_lines: dict[str, tuple[float, str]] = {}  # node -> first restart line

    def on_event(self, ev) -> None:
        if ev.kind == "launched" and ev.ts >= self.since and ev.node:
            self.launched[ev.node] = ev.ts
        if ev.kind == "killed" and ev.ts >= self.since and ev.node:
            self.killed[ev.node] = ev.ts

    def on_lines(self, b) -> None:
        now = time.time()
        if b.stream == "torchrun":
            if self.since and b.node not in self.torchrun_lines and b.ts >= self.since:
                for line in b.lines:
                    if TORCHRUN_RESTART.search(line):
                        # the message, without torchrun's "W1121 20:05:16.959 pid file:line]"
                        self.torchrun_lines[b.node] = (b.ts, line.split("] ", 1)[-1][:90])
                        break
            return
        if b.rank is None:
            return
        for line in b.lines:
            m = START.match(line)
            if m:
                pid = int(m.group(2))
                if pid not in self.known_pids:
                    self.known_pids.add(pid)
                    if self.since:
                        self.new_worker[b.node] = pid
                        self.stepped.pop(b.node, None)
                continue
            if STEP.match(line) and b.node in self.new_worker and b.node not in self.stepped:
                self.stepped[b.node] = (b.ts, now)

    def recovered(self) -> bool:
        return len(self.stepped) == len(self.ctl.state.nodes)


async def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for %s" % what)
        await asyncio.sleep(0.05)


async def measure(ctl: RunController, watch: Watch, node: str | None) -> dict:
    # settle: every rank stepping for a while on its current worker
    await wait_until(lambda: len(ctl.state.ranks) == 4 and all(
        r.state == "running" and (r.last_progress or 0) > time.time() - 1
        for r in ctl.state.ranks.values()), TIMEOUT, "every rank stepping")
    await asyncio.sleep(3)
    t_req = time.time()
    watch.reset(t_req)
    res = await ctl.restart(node)
    t_ack = time.time()
    bad = {n: r for n, r in res.items() if isinstance(r, BaseException)}
    if bad:
        raise SystemExit("restart failed: %s" % bad)
    await wait_until(watch.recovered, TIMEOUT, "every rank stepping again")
    restarted = [node] if node else list(ctl.state.nodes)
    await wait_until(lambda: all(n in watch.launched for n in restarted), 30,
                     "the launched events")
    t_start = max(watch.launched[n] for n in restarted)
    t_killed = max(watch.killed.get(n, watch.launched[n]) for n in restarted)
    first_start = min(watch.launched[n] for n in restarted)
    t_steps_node = max(ts for ts, _c in watch.stepped.values())
    t_steps_console = max(c for _ts, c in watch.stepped.values())
    total = t_steps_console - t_req
    own = t_steps_node - t_start
    # the other reading of "torchrun's own": from the first worker-group restart another
    # node's torchrun logged (it saw its workers exit) - node restarts only
    others = [ts for n, (ts, line) in watch.torchrun_lines.items()
              if n not in restarted and "failed (exitcode" in line]
    own_alt = t_steps_node - min(others) if others else None
    return {
        "kind": "node restart (%s)" % node if node else "whole-run restart",
        "total": total, "torchrun": own, "overhead": total - own, "torchrun_alt": own_alt,
        "ack": t_ack - t_req, "kill_relaunch": t_start - t_req, "kill": t_killed - t_req,
        "relaunch": t_start - t_killed,
        "stagger": t_start - first_start, "delivery": t_steps_console - t_steps_node,
        "torchrun_lines": {n: (ts - t_req, line) for n, (ts, line) in
                           sorted(watch.torchrun_lines.items())},
    }


def table(rows: list[dict]) -> str:
    head = ("restart", "total s", "torchrun s", "overhead s", "kill", "relaunch", "delivery",
            "target")
    lines = [head]
    for r in rows:
        lines.append((r["kind"], "%.2f" % r["total"], "%.2f" % r["torchrun"],
                      "%+.2f" % r["overhead"], "%.2f" % r["kill"], "%.2f" % r["relaunch"],
                      "%.2f" % r["delivery"],
                      "ok" if r["overhead"] <= 2.0 else "MISSED (> 2 s)"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="measurements of each kind")
    ap.add_argument("--grace", type=float, default=10.0, help="the run's kill grace (s)")
    ap.add_argument("--node", default="node2")
    ap.add_argument("--keep", action="store_true", help="keep the run's folders (journals)")
    args = ap.parse_args()
    own_state = None
    if "XDG_STATE_HOME" not in os.environ:  # keep the bench's run out of the real history
        own_state = os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="rdk-bench-state-")
    work = tempfile.mkdtemp(prefix="rdk-bench-restart-")
    ctl = RunController(local_inventory(work), LocalTransport(), History())
    watch = Watch(ctl)
    rows = []
    try:
        t0 = time.time()
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=100, grace=args.grace,
                                    args=TINY + ["--steps", "1000000", "--ckpt-every", "50"]),
                         preflight=False)
        await wait_until(lambda: len(ctl.state.ranks) == 4 and all(
            r.state == "running" for r in ctl.state.ranks.values()), TIMEOUT, "first steps")
        print("launch to every rank stepping: %.1f s" % (time.time() - t0), flush=True)
        for i in range(args.reps):
            for node in (args.node, None):
                row = await measure(ctl, watch, node)
                rows.append(row)
                print("%-28s total %.2f s, torchrun's own %.2f s, overhead %+.2f s (kill %.2f, "
                      "relaunch %.2f, stagger %.2f, delivery %.2f; request answered after "
                      "%.2f)" % (row["kind"], row["total"], row["torchrun"], row["overhead"],
                                 row["kill"], row["relaunch"], row["stagger"],
                                 row["delivery"], row["ack"]), flush=True)
                if row["torchrun_alt"] is not None:
                    print("    torchrun's own from the first worker-group restart on another "
                          "node: %.2f s (overhead %+.2f s)" % (
                              row["torchrun_alt"], row["total"] - row["torchrun_alt"]))
                for n, (dt, line) in row["torchrun_lines"].items():
                    print("    %s torchrun +%.2f s: %s" % (n, dt, line), flush=True)
    finally:
        await ctl.stop()
        await ctl.close()
        left = processes_of(ctl.run_id)
        if left:
            print("WARNING: processes left: %s" % left, file=sys.stderr)
        elif args.keep:
            print("kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
        if own_state:
            shutil.rmtree(own_state, ignore_errors=True)
    print()
    print(table(rows))
    for kind in sorted({r["kind"] for r in rows}):
        sel = [r for r in rows if r["kind"] == kind]
        if len(sel) > 1:
            print("%s: median total %.2f s, torchrun %.2f s, overhead %+.2f s" % (
                kind, statistics.median(r["total"] for r in sel),
                statistics.median(r["torchrun"] for r in sel),
                statistics.median(r["overhead"] for r in sel)))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
