"""Node surgery against doing it by hand: how long from the operator's "yes" until every rank
steps again.

Five local nodes (LocalTransport, 127.0.0.2-6; node4 a spare), real torchrun, gloo, the
reference trainer's tiny model, checkpoints every 4 steps in one shared folder. Rank 2 hangs
before step 6; once every rank is stalled and the step-4 checkpoint is complete:

- cordon: `rankdeck cordon` of the hung rank's node with the spare (console/surgery/cordon.py); the
  time from the call (the `y`) until the world is 4 again, the spare has a rank and every
  rank has stepped past the checkpoint it resumed from;
- by hand: stop the whole run, then launch it again with the hung node out and the spare in
  (the inventory edited: no time counted for the edit), resuming from the same checkpoint
  folder; the time from the stop until every rank of the new run has stepped past step 4.

    .venv/bin/python bench/cordon.py [--reps 1]

Never a test: timings on a shared 2-core machine are noisy. Results go in docs/BENCHMARKS.md.
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
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from console.surgery.cordon import cordon  # noqa: E402
from console.records.history import History  # noqa: E402
from console.run.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from spine.helpers import TINY, TRAINER, local_inventory, wind_down  # noqa: E402
from tests.waits import wait_for  # noqa: E402

TIMEOUT = 600
CKPT_STEP = 4


def spec(ckpt: str) -> LaunchSpec:
    return LaunchSpec(script=TRAINER, max_restarts=5, grace=3, stall_after=6.0,
                      args=TINY + ["--steps", "100000", "--ckpt-every", str(CKPT_STEP),
                                   "--hang-at-step", "6", "--hang-rank", "2",
                                   "--pg-timeout", "600", "--ckpt-dir", ckpt])


def stepping_past(st, step: int, nodes: set[str] | None = None) -> bool:
    ranks = list(st.ranks.values())
    return (st.world_size == 4 and len(ranks) == 4 and all(
        r.state == "running" and (r.step or 0) > step for r in ranks)
        and (nodes is None or {r.node for r in ranks} == nodes))


async def hung_run(work: str) -> tuple[RunController, str]:
    """A run on node0-3 (node4 a spare) whose rank 2 hangs; returns it once every rank is
    stalled and the step-4 checkpoint is complete, with the hung rank's node."""
    inv = local_inventory(work, n=5)
    inv.hosts[4].spare = True
    ctl = RunController(inv, LocalTransport(), History())
    await ctl.launch(spec(os.path.join(work, "ckpt")), preflight=False)
    st = ctl.state
    await wait_for(lambda: len(st.ranks) == 4 and all(r.state == "stalled"
                                                      for r in st.ranks.values())
                   and st.checkpoints.last_complete() is not None, TIMEOUT, "the hang")
    return ctl, st.ranks[2].node


async def by_cordon(work: str) -> float:
    ctl, hung = await hung_run(work)
    try:
        plan = ctl.cordon_plan(hung)
        t0 = time.monotonic()
        entry = await cordon(ctl, plan, who="bench@cordon")
        assert entry["outcome"] == "done", entry
        done = time.monotonic() - t0
        nodes = {"node0", "node1", "node2", "node3", "node4"} - {hung}
        await wait_for(lambda: stepping_past(ctl.state, CKPT_STEP, nodes), TIMEOUT, "stepping")
        warm = any(e.node == "node4" and "put in warm" in e.text for e in ctl.state.events)
        print("  cordon: fenced in %.1f s, spare (%s) started at %.1f s; dead torchrun "
              "expelled: %s" % (entry["fence_s"], "warm" if warm else "cold", done,
                                entry.get("expelled", "(not tried)")), flush=True)
        return time.monotonic() - t0
    finally:
        await wind_down(ctl)


async def by_hand(work: str) -> float:
    ctl, hung = await hung_run(work)
    try:
        t0 = time.monotonic()
        await ctl.stop()
    finally:
        await wind_down(ctl)
    inv = local_inventory(work, n=5)
    inv.hosts = [h for h in inv.hosts if h.name != hung]  # the edit: node out, spare in
    again = RunController(inv, LocalTransport(), History())
    try:
        await again.launch(spec(os.path.join(work, "ckpt")), preflight=False)
        await wait_for(lambda: stepping_past(again.state, CKPT_STEP), TIMEOUT, "stepping")
        return time.monotonic() - t0
    finally:
        await wind_down(again)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--only", choices=("cordon", "hand"), help="one side only")
    args = p.parse_args()
    cut, hand = [], []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="rankdeck-cordon-") as tmp:
            if args.only != "hand":
                cut.append(await by_cordon(os.path.join(tmp, "a")))
            if args.only != "cordon":
                hand.append(await by_hand(os.path.join(tmp, "b")))
        if args.only:
            print("rep %d: %.1f s" % (rep + 1, (cut or hand)[-1]), flush=True)
            continue
        print("rep %d: cordon %.1f s, stop + relaunch %.1f s" % (rep + 1, cut[-1], hand[-1]),
              flush=True)
    if args.only:
        return
    c, h = statistics.median(cut), statistics.median(hand)
    print("median: cordon %.1f s, stop + relaunch by hand %.1f s, ratio %.2f" % (c, h, c / h))


if __name__ == "__main__":
    asyncio.run(main())
