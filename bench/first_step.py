"""A launch's time to its first step: the rendezvous store asked for early (its answer once its
port is bound, the nodes started beside its torch import, then ``store_wait``: how rankdeck
launches) next to the store waited for before any node starts (how it launched before).

Each round launches real torchrun with the reference trainer on ``--nodes`` local nodes (the
local transport, no preflight, one rank per node), times from the launch's start to the moment
every rank has printed its first step, then stops the run. The two ways alternate, so the
machine's load falls on both alike; medians of ``--repeat`` rounds each. The baseline is the
same code with the store's ``early`` turned off in the request and ``store_wait`` answered at
once (the store already serves then).

On one machine every "node" shares its cores: the store's import and the nodes' torchrun
imports overlap only as far as there are free cores. On a real cluster the store's host and
every node import torch on their own CPUs (with CUDA, seconds each), so the gain is one whole
torch import per launch.

    .venv/bin/python bench/first_step.py [--nodes 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO]

from console.records.history import History  # noqa: E402
from console.run import link as link_mod  # noqa: E402
from console.run.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from tests.local_nodes import local_inventory  # noqa: E402

TRAINER = os.path.join(REPO, "trainer", "train.py")
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--synthetic-samples", "2048", "--steps", "100000"]
REQUEST = link_mod.NodeLink.request


async def waited_store(self, op, timeout=120.0, **args):
    """The baseline: the store waited for at once, as launches did before."""
    if op == "store_start":
        args.pop("early", None)
        self._waited_store = await REQUEST(self, op, timeout, **args)
        return self._waited_store
    if op == "store_wait":
        return self._waited_store
    return await REQUEST(self, op, timeout, **args)


async def one(nodes: int, early: bool) -> float:
    """Seconds from the launch's start to every rank's first step."""
    link_mod.NodeLink.request = REQUEST if early else waited_store
    with tempfile.TemporaryDirectory(prefix="rdk-first-step-") as tmp:
        os.environ["XDG_STATE_HOME"] = os.path.join(tmp, "state")
        ctl = RunController(local_inventory(os.path.join(tmp, "work"), nodes, python=sys.executable),
                            LocalTransport(), History())
        try:
            start = time.monotonic()
            await ctl.launch(LaunchSpec(script=TRAINER, args=TINY), preflight=False)
            while not (len(ctl.state.ranks) == nodes and
                       all((r.step or 0) >= 1 for r in ctl.state.ranks.values())):
                await asyncio.sleep(0.05)
            return time.monotonic() - start
        finally:
            await ctl.stop()
            await ctl.stop_store()
            await ctl.close()
            link_mod.NodeLink.request = REQUEST


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.repeat):
        for early in (False, True) if i % 2 == 0 else (True, False):
            times[early].append(await one(args.nodes, early))
            print("round %d %-14s %.1f s" % (i + 1, "store early" if early else "store waited",
                                             times[early][-1]), flush=True)
    base, ours = statistics.median(times[False]), statistics.median(times[True])
    print("\n%d nodes, median of %d: store waited %.1f s, store early %.1f s: %.2fx the "
          "baseline's time to the first step (%.1f s sooner)"
          % (args.nodes, args.repeat, base, ours, ours / base, base - ours))


if __name__ == "__main__":
    asyncio.run(main())
