"""Who is stuck: what the flight-recorder hook costs a healthy job, and how long a verdict takes.

Four local nodes (LocalTransport, 127.0.0.2-5), real torchrun, gloo, the reference trainer's
tiny test model.

- cost: the same run (``--steps``) with the hook on and off (``RANKDECK_FLIGHT_RECORDER=0``),
  alternating, ``--reps`` each; per run the median step time over every rank's last 64 steps
  and the wall time from the first step line to the run's end.
- verdict: for each kind (stuck-in-python, mismatch), ``--reps`` runs whose fault fires at
  step 6; the time from the console seeing every rank stalled to the verdict, and from the
  fault line to the verdict (= the stall threshold, ``--stall`` s here, plus the verdict),
  beside the process group's own timeout (``--pg-timeout``), after which gloo would raise.

    .venv/bin/python bench/stuck.py [--reps 3] [--steps 400] [--stall 6]

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

from console.history import History  # noqa: E402
from console.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from spine.helpers import TINY, TRAINER, local_inventory, wait_for, wind_down  # noqa: E402

FAULTS = {"stuck-in-python": ["--hang-at-step", "6", "--hang-rank", "2"],
          "mismatch": ["--mismatch-at-step", "6", "--mismatch-rank", "1"]}


async def one_run(workdir: str, args: list[str], env: dict, stall: float):
    ctl = RunController(local_inventory(workdir), LocalTransport(), History())
    ctl.state.stall_min_s = stall
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0, grace=3, args=TINY + args,
                                env=env), preflight=False)
    return ctl


async def cost(steps: int, hook_on: bool) -> tuple[float, float]:
    env = {} if hook_on else {"RANKDECK_FLIGHT_RECORDER": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        ctl = await one_run(tmp, ["--steps", str(steps), "--ckpt-every", "0"], env, 60.0)
        try:
            ranks = ctl.state.ranks
            await wait_for(lambda: len(ranks) == 4 and all(r.step for r in ranks.values()),
                           300, "first steps")
            first = time.monotonic()
            await ctl.wait_done()
            wall = time.monotonic() - first
            step = statistics.median(t for r in ranks.values() for t in r.step_times)
        finally:
            await wind_down(ctl)
    return step, wall


async def to_verdict(kind: str, stall: float, pg_timeout: float) -> tuple[float, float]:
    args = ["--steps", "100000", "--ckpt-every", "0", "--pg-timeout", str(pg_timeout)]
    with tempfile.TemporaryDirectory() as tmp:
        ctl = await one_run(tmp, args + FAULTS[kind], {}, stall)
        try:
            ranks = ctl.state.ranks
            await wait_for(lambda: len(ranks) == 4 and all((r.step or 0) >= 5 for r in ranks.values()),
                           300, "steps before the fault", poll=0.05)
            fault = time.monotonic()  # the last step before the fault: within a step of it
            await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()), 300,
                           "stall", poll=0.05)
            stalled = time.monotonic()
            await wait_for(lambda: ctl.state.verdict is not None, 120, "verdict", poll=0.05)
            done = time.monotonic()
            got = ctl.state.verdict
            assert got["kind"] == kind, got
        finally:
            await wind_down(ctl)
    return done - stalled, done - fault


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--stall", type=float, default=6.0)
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--only", choices=["cost", "verdict"])
    a = p.parse_args()
    if a.only != "verdict":
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(a.reps):
            for on in (True, False):
                runs[on].append(await cost(a.steps, on))
        for on, got in runs.items():
            print("hook %-3s step median of runs %.4f s (runs: %s); wall %s s"
                  % ("on" if on else "off", statistics.median(s for s, _ in got),
                     ", ".join("%.4f" % s for s, _ in got), ", ".join("%.1f" % w for _, w in got)))
    if a.only != "cost":
        for kind in FAULTS:
            got = [await to_verdict(kind, a.stall, a.pg_timeout) for _ in range(a.reps)]
            print("%-16s stall->verdict median %.1f s (%s); fault->verdict median %.1f s "
                  "(stall threshold %.0f s); gloo would raise after %.0f s"
                  % (kind, statistics.median(s for s, _ in got), ", ".join("%.1f" % s for s, _ in got),
                     statistics.median(f for _, f in got), a.stall, a.pg_timeout))


if __name__ == "__main__":
    asyncio.run(main())
