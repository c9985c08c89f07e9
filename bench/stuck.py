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
- verdict, straggler: rank 1 sleeps ``--slow-s`` a step from step ``--slow-at-step`` on (the
  trainer's ``--slow-at-step``: the steps before are the clean pace), per sample period in
  ``--sample-s`` (RANKDECK_SAMPLE_S); the time from its last clean step to the console's
  ``straggler`` event naming rank 1 and nobody else in ``status``, the sample ticks every
  rank had before the fault, and the other ranks' step time before and after (what the
  slowness costs the whole job). Nothing in torch ever raises for a straggler.
- verdict, net-cut (root: real sshd hosts in network namespaces, tests/e2e/sshhosts.py, the
  helpers of tests/e2e/test_stuck_net.py): node2's link goes down after its first steps; the
  time from the cut to the verdict ``unreachable`` naming node2's ranks, beside gloo's
  ``--pg-timeout`` (torch's default is 30 min). The link comes back before the run is
  stopped; the hosts are removed at exit (Ctrl-C and SIGTERM included).

    .venv/bin/python bench/stuck.py [--reps 3] [--steps 400] [--stall 6]
    .venv/bin/python bench/stuck.py --only verdict --kinds straggler,net-cut [--sample-s 10,2]

Never a test: timings on a shared 2-core machine are noisy. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from console.records.history import History  # noqa: E402
from console.run.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from spine.helpers import TINY, TRAINER, local_inventory, wind_down  # noqa: E402
from tests.waits import wait_for  # noqa: E402

FAULTS = {"stuck-in-python": ["--hang-at-step", "6", "--hang-rank", "2"],
          "mismatch": ["--mismatch-at-step", "6", "--mismatch-rank", "1"]}
KINDS = list(FAULTS) + ["straggler", "net-cut"]
SLOW_RANK = 1
CUT = "node2"  # as tests/e2e/test_stuck_net.py
TORCH_PG_TIMEOUT_S = 1800  # torch's default for gloo (datetime.timedelta(minutes=30))


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
                           300, "steps before the fault", every=0.05)
            fault = time.monotonic()  # the last step before the fault: within a step of it
            await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()), 300,
                           "stall", every=0.05)
            stalled = time.monotonic()
            # the first look may name nobody (ranks still entering collectives on a loaded
            # machine); the console looks again while the stall lasts (agent/rules/judge.py verdict_again_due)
            await wait_for(lambda: (ctl.state.verdict or {}).get("kind") == kind, 300, "verdict",
                           every=0.05)
            done = time.monotonic()
            looks = sum(1 for e in ctl.state.events if e.kind == "verdict")
            if looks > 1:
                print("  (%s: %d verdicts before the right one)" % (kind, looks - 1))
        finally:
            await wind_down(ctl)
    return done - stalled, done - fault


def others_step(ranks, skip: int, newest: int | None = None) -> float:
    """The median step time of every rank but ``skip`` (its newest ``newest`` steps)."""
    times = [t for r in ranks.values() if r.rank != skip
             for t in list(r.step_times)[-(newest or len(r.step_times)):]]
    return statistics.median(times)


async def straggler(sample_s: float, slow_s: float, at_step: int, pg_timeout: float) -> dict:
    """One straggler run: fault -> flag, ticks before the fault, the others' step before/after."""
    args = ["--steps", "100000", "--ckpt-every", "0", "--pg-timeout", str(pg_timeout),
            "--slow-rank", str(SLOW_RANK), "--slow-s", str(slow_s),
            "--slow-at-step", str(at_step)]
    with tempfile.TemporaryDirectory() as tmp:
        ctl = await one_run(tmp, args, {"RANKDECK_SAMPLE_S": "%g" % sample_s}, 60.0)
        try:
            st = ctl.state
            ranks = st.ranks
            await wait_for(lambda: len(ranks) == 4 and all((r.step or 0) >= at_step - 1
                                                           for r in ranks.values()),
                           600, "the clean steps", every=0.05)
            fault = time.monotonic()  # rank 1's last clean step: within a step of the fault
            clean = others_step(ranks, SLOW_RANK)
            ticks = st.stragglers.ticks  # every rank sampled: the clean history behind it
            steps = {r.rank: r.step for r in ranks.values()}
            await wait_for(lambda: any(e.kind == "straggler" for e in st.events),
                           30 * sample_s + 120, "a straggler event", every=0.05)
            done = time.monotonic()
            named = [(e.rank, e.node) for e in st.events if e.kind.startswith("straggler")]
            flagged = [r["rank"] for n in ctl.status()["nodes"] for r in n["ranks"]
                       if r["straggler"]]
            assert [r for r, _ in named] == [SLOW_RANK] and flagged == [SLOW_RANK], \
                (named, flagged)
            since = min(r.step - steps[r.rank] for r in ranks.values() if r.rank != SLOW_RANK)
            slow = others_step(ranks, SLOW_RANK, max(1, since))
            slowdown = st.stragglers.slowdown(SLOW_RANK)
        finally:
            await wind_down(ctl)
    return {"flag": done - fault, "ticks": ticks, "clean": clean, "slow": slow,
            "detector": slowdown}


class NetHosts:
    """Four sshd hosts in network namespaces for the net-cut kind, with the user's HOME in a
    temp folder (as tests/e2e/conftest.py's clean_home) and the secret test_ssh_run's
    inventory asks for: built once, closed at exit."""

    def __enter__(self):
        from sshhosts import create_hosts

        self.hosts = create_hosts(4)  # removes what it built when it fails
        self.home = tempfile.mkdtemp(prefix="rdk-stuck-home-")
        self.saved = {k: os.environ.get(k) for k in ("HOME", "SSH_AUTH_SOCK", "RDK_TEST_SECRET")}
        os.environ["HOME"] = self.home
        os.environ["RDK_TEST_SECRET"] = "tok-" + secrets.token_hex(12)  # the inventory's env
        os.environ.pop("SSH_AUTH_SOCK", None)
        os.makedirs(os.path.join(self.home, ".ssh"))
        shutil.copy(self.hosts.ssh_config, os.path.join(self.home, ".ssh", "config"))
        return self.hosts

    def __exit__(self, *exc):
        try:
            self.hosts.close()
        finally:
            for k, v in self.saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(self.home, ignore_errors=True)


async def net_cut(hosts, stall: float, pg_timeout: float) -> float:
    """One run on the SSH hosts: node2's link cut after the first steps; cut -> verdict."""
    from console.run.run import LaunchSpec
    from test_ssh_run import SCRIPT, ssh_controller

    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        shutil.copytree(os.path.join(REPO, "trainer"), str(project / "trainer"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        ctl, _got = ssh_controller(hosts, Path(tmp), "~/proj-bench-%s" % secrets.token_hex(3))
        st = ctl.state
        st.stall_min_s = stall
        try:
            await ctl.launch(LaunchSpec(script=SCRIPT, sync=str(project), max_restarts=0,
                                        grace=3, args=TINY + ["--steps", "100000",
                                                              "--ckpt-every", "0",
                                                              "--pg-timeout", str(pg_timeout)]),
                             preflight=False)
            await wait_for(lambda: len(st.ranks) == 4 and all((r.step or 0) >= 3
                                                              for r in st.ranks.values()),
                           600, "first steps")
            cut_ranks = sorted(r.rank for r in st.ranks.values() if r.node == CUT)
            hosts.link_down(CUT)
            cut = time.monotonic()
            try:
                await wait_for(lambda: (st.verdict or {}).get("kind") == "unreachable", 300,
                               "a verdict naming the cut host", every=0.05)
                done = time.monotonic()
                verdict = st.verdict
            finally:
                hosts.link_up(CUT)
                # back before the run is stopped: a stop must reach node2's processes too
                await wait_for(lambda: ctl.links[CUT].connected.is_set() and
                               st.nodes[CUT].state != "unreachable", 120, "node2 reconnected")
            got = [(s["rank"], s["node"]) for s in verdict["suspects"]]
            assert got == [(r, CUT) for r in cut_ranks], verdict
        finally:
            await wind_down(ctl)
    return done - cut


def load() -> str:
    return "load average %.1f" % os.getloadavg()[0]


async def verdicts(a) -> None:
    for kind in [k for k in a.kinds if k in FAULTS]:
        got = [await to_verdict(kind, a.stall, a.pg_timeout) for _ in range(a.reps)]
        print("%-16s stall->verdict median %.1f s (%s); fault->verdict median %.1f s "
              "(stall threshold %.0f s); gloo would raise after %.0f s; %s"
              % (kind, statistics.median(s for s, _ in got), ", ".join("%.1f" % s for s, _ in got),
                 statistics.median(f for _, f in got), a.stall, a.pg_timeout, load()), flush=True)
    if "straggler" in a.kinds:
        for sample_s in a.sample_s:
            got = [await straggler(sample_s, a.slow_s, a.slow_at_step, a.pg_timeout)
                   for _ in range(a.reps)]
            print("straggler        sample %g s: fault->flag median %.1f s (%s); ticks before "
                  "the fault %s; others' step %.3f s -> %.3f s (median %.1fx; runs %s); "
                  "detector's slowdown %s; torch never raises; %s"
                  % (sample_s, statistics.median(g["flag"] for g in got),
                     ", ".join("%.1f" % g["flag"] for g in got),
                     ", ".join(str(g["ticks"]) for g in got),
                     statistics.median(g["clean"] for g in got),
                     statistics.median(g["slow"] for g in got),
                     statistics.median(g["slow"] / g["clean"] for g in got),
                     ", ".join("%.1fx" % (g["slow"] / g["clean"]) for g in got),
                     ", ".join(str(g["detector"]) for g in got), load()), flush=True)
    if "net-cut" in a.kinds:
        sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
        from sshhosts import missing_requirements

        reason = missing_requirements()
        if reason:
            print("net-cut          skipped: %s" % reason)
            return
        with NetHosts() as hosts:
            got = [await net_cut(hosts, a.stall, a.pg_timeout) for _ in range(a.reps)]
        print("net-cut          cut->verdict median %.1f s (%s) (stall threshold %.0f s); gloo "
              "would raise after --pg-timeout %.0f s (torch's default %d s); %s"
              % (statistics.median(got), ", ".join("%.1f" % g for g in got), a.stall,
                 a.pg_timeout, TORCH_PG_TIMEOUT_S, load()), flush=True)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--stall", type=float, default=6.0)
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--only", choices=["cost", "verdict"])
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="verdict kinds, comma-separated: %s" % ", ".join(KINDS))
    p.add_argument("--sample-s", default="10,2",
                   help="straggler: the sample periods (RANKDECK_SAMPLE_S), comma-separated")
    p.add_argument("--slow-s", type=float, default=1.0, help="straggler: rank 1's sleep a step")
    p.add_argument("--slow-at-step", type=int, default=300,
                   help="straggler: the first slow step (the steps before are the clean pace)")
    a = p.parse_args()
    a.kinds = [k for k in a.kinds.split(",") if k]
    unknown = sorted(set(a.kinds) - set(KINDS))
    if unknown:
        p.error("unknown kinds: %s (known: %s)" % (", ".join(unknown), ", ".join(KINDS)))
    a.sample_s = [float(x) for x in a.sample_s.split(",") if x]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the hosts' finally runs
    print("%d CPUs; %s" % (os.cpu_count(), load()), flush=True)
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
        await verdicts(a)


if __name__ == "__main__":
    asyncio.run(main())
