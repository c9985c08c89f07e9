"""CPU of the whole agent on one node: serve + supervisor, telemetry on, 8 ranks x 10 lines/s.

A real run on one local node (127.0.0.2): real torchrun starts NPROC ranks of this file (each
prints RATE lines a second, every other one a step line with loss, lr, step time and tok/s),
the node's real supervisor tails their log files into the journal (and samples the ranks'
CPU and the host's telemetry every 10 s), and the real ``agent serve`` streams the journal to
a RunController in this process subscribed to the node, with a GPU snapshot and host sample
once a second. Over a window of SECONDS it reads utime+stime from /proc/<pid>/stat of the
serve and the supervisor (every thread of each; plus the children they waited for, such as
nvidia-smi where there is no NVML) and prints them as % of one core beside, over the same
window and the same files:

- ``tail -q -F`` of the ranks' 8 log files (the least a reader of them can spend),
- torchrun's own elastic agent (the process every run has anyway), and the ranks themselves;

then runs the same with silent ranks (one line each, then nothing): what the agent spends
with no lines at all (its polling and telemetry), so the rest is the lines' cost.

    .venv/bin/python bench/agent_cpu.py [--seconds 60] [--nproc 8] [--rate 10] [--no-idle]

``measure(..., judge=False)``: the same run without the run's judge (bench/judge_cpu.py runs
both in pairs; with it, the judge process is measured too).

Target: agent <= 1 % of a core. CPU seconds, not wall time, are the figure: the
shared machine's load moves wall time, not how much work a process does. Never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK = os.sysconf("SC_CLK_TCK")
WARMUP = 3.0  # seconds after every rank's first line before the window opens
MARGIN = 60.0  # the ranks print this much longer than the window (torchrun's start-up); the
# run is stopped when the window closes


# -- a rank ----------------------------------------------------------------------------------
def rank_main(rate: float, seconds: float) -> int:
    """What each rank runs: ``rate`` lines a second for ``seconds``, like a chatty trainer
    (``rate`` 0: one line, then silence)."""
    rank = int(os.environ.get("RANK", "0"))
    rnd = random.Random(rank)
    start = time.time()
    if not rate:
        print("[rank%d] silent from now on" % rank, flush=True)
        time.sleep(seconds)
        return 0
    n = step = 0
    while time.time() - start < seconds:
        if n % 2:
            step += 1
            print("step %d loss=%.4f lr=%.2e step_time=%.3fs tok/s=%d"
                  % (step, 4.0 / (1 + 0.01 * step), 3e-4, 0.2 + rnd.random() * 0.01,
                     32768 + rnd.randint(0, 512)), flush=True)
        else:
            print("[rank%d] data: shard %d batch %d prefetched in %.1f ms"
                  % (rank, n % 17, n, rnd.random() * 3), flush=True)
        n += 1
        time.sleep(max(0.0, start + n / rate - time.time()))
    return 0


# -- measuring -------------------------------------------------------------------------------
def cpu_of(pid: int, children: bool = False) -> float:
    """utime+stime (and with ``children``, cutime+cstime) of a process, all its threads, in
    seconds; 0.0 once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK


def wakes_of(pid: int) -> int:
    """Voluntary context switches of a process, all its threads: about how often it slept
    and was woken (a turn of its loop is one, a blocking read another)."""
    total = 0
    for path in glob.glob("/proc/%d/task/*/status" % pid):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def children_of(pid: int) -> list[int]:
    out = []
    for path in glob.glob("/proc/%d/task/*/children" % pid):
        try:
            with open(path) as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def supervisor_of(run_id: str) -> int | None:
    """The node's supervisor: ``python -m agent supervisor <node dir of run_id>``."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            cmd = cmdline(int(name))
            if " agent supervisor " in cmd and run_id in cmd:
                return int(name)
    return None


class Tail:
    """``tail -q -F`` of the rank files, read to the end by a thread (so tail does write)."""

    def __init__(self, files: list[str]):
        self.proc = subprocess.Popen(["tail", "-q", "-n", "0", "-F"] + files,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self.lines = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            data = self.proc.stdout.read(65536)
            if not data:
                return
            self.lines += data.count(b"\n")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.thread.join(2)


async def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for %s" % what)
        await asyncio.sleep(0.1)


def judge_of(work: str, run_id: str) -> int | None:
    """The run's judge (agent/judge/judge.py): the pid its state.json gives, while it runs."""
    from agent.judge.control import running_judge
    info = running_judge(os.path.join(work, ".rankdeck", "runs", run_id))
    return info["pid"] if info else None


async def measure(seconds: float, nproc: int, rate: float, work: str,
                  sample_s: str | None = None, judge: bool = True) -> dict:
    """One window of the run; ``judge`` False: the run has no judge (its node spec carries
    none, as from a console older than the judge), so the supervisor runs no judge link."""
    from console.records.history import History
    from console.run.run import LaunchSpec, RunController
    from console.transport.local import LocalTransport
    from inventory.model import Host, Inventory

    class NoJudge(RunController):
        async def start_judge(self, rdzv, hosts, spec) -> None:
            return None

    host = Host(name="node1", addr="127.0.0.2", python="", workdir=work)
    ctl = (RunController if judge else NoJudge)(Inventory("<bench>", [host], "local"), LocalTransport(),
                        History(os.path.join(work, "history")))
    arrived = {"lines": 0, "ranks": set()}

    def count(batch) -> None:
        arrived["lines"] += len(batch.lines)
        if batch.rank is not None:
            arrived["ranks"].add(batch.rank)
    ctl.state.line_listeners.append(count)
    spec = LaunchSpec(script=os.path.abspath(__file__),
                      args=["--rank", str(rate), str(seconds + MARGIN)],
                      nproc_per_node=nproc, max_restarts=0, grace=2.0,
                      env={} if sample_s is None else {"RANKDECK_SAMPLE_S": sample_s})
    await ctl.launch(spec)
    try:
        await until(lambda: len(arrived["ranks"]) == nproc, 120, "a line from every rank")
        await asyncio.sleep(WARMUP)
        serve = ctl.links["node1"].stream.proc.pid
        supervisor = supervisor_of(ctl.run_id)
        torchrun = [p for p in children_of(supervisor or -1) if "torch" in cmdline(p)]
        ranks = [r for t in torchrun for r in children_of(t)]
        files = sorted(glob.glob(os.path.join(work, ".rankdeck", "runs", ctl.run_id, "node1",
                                              "torchrun", "*", "attempt_0", "*", "stdout.log")))
        if supervisor is None or len(ranks) != nproc or len(files) != nproc:
            raise SystemExit("found supervisor %s, ranks %s, files %s" % (supervisor, ranks,
                                                                          files))
        judge_pid = judge_of(work, ctl.run_id)
        if judge != (judge_pid is not None):
            raise SystemExit("a judge %s, found %s" % ("wanted" if judge else "not wanted",
                                                       judge_pid))
        tail = Tail(files)
        await asyncio.sleep(1.0)  # tail's start (reading and watching 8 files) is not the loop
        groups = {"serve": [serve], "supervisor": [supervisor], "tail": [tail.proc.pid],
                  "torchrun": torchrun, "ranks": ranks}
        waited = ("serve", "supervisor")  # children they wait for are theirs (helpers)
        if judge_pid is not None:
            groups["judge"] = [judge_pid]
            waited += ("judge",)

        def cpu() -> dict:
            return {g: sum(cpu_of(p, children=g in waited) for p in pids)
                    for g, pids in groups.items()}
        def wakes() -> dict:
            return {g: sum(wakes_of(p) for p in groups[g]) for g in waited}
        cpu0, lines0, tail0, wall0 = cpu(), arrived["lines"], tail.lines, time.monotonic()
        wakes0 = wakes()
        await asyncio.sleep(seconds)  # the console keeps reading meanwhile
        cpu1, lines1, tail1, wall1 = cpu(), arrived["lines"], tail.lines, time.monotonic()
        wakes1 = wakes()
        gone = [g for g, pids in groups.items() if not all(os.path.exists("/proc/%d" % p)
                                                            for p in pids)]
        tail.close()
        if gone:
            raise SystemExit("%s ended inside the window: raise MARGIN" % ", ".join(gone))
        await ctl.stop()  # the ranks would print on for MARGIN
    finally:
        await ctl.stop_store()
        await ctl.close()
    return {"wall": wall1 - wall0, "lines": lines1 - lines0, "tail_lines": tail1 - tail0,
            "cpu": {g: cpu1[g] - cpu0[g] for g in cpu0}, "files": len(files),
            "wakes": {g: wakes1[g] - wakes0[g] for g in wakes0}, "judge": judge,
            "gpu": (ctl.state.nodes["node1"].gpu or {}).get("source"),
            "host": sorted((ctl.state.nodes["node1"].host or {}).keys())}


def pct(cpu: float, wall: float) -> float:
    return 100.0 * cpu / wall if wall else float("nan")


def report(r: dict, nproc: int, rate: float, idle: dict | None) -> None:
    wall, cpu = r["wall"], r["cpu"]
    agent = cpu["serve"] + cpu["supervisor"]
    print("window %.1f s, %d ranks x %g lines/s: %d lines reached the console (%.1f/s), "
          "%d through tail -F; telemetry: gpu source %s, host sample %s"
          % (wall, nproc, rate, r["lines"], r["lines"] / wall, r["tail_lines"], r["gpu"],
             "with " + ",".join(r["host"]) if r["host"] else "none"))
    rows = (("agent serve (streams to the console, telemetry 1/s)", cpu["serve"]),
            ("agent supervisor (tails %d files, journal, samples)" % r["files"],
             cpu["supervisor"]),
            ("agent, both (target <= 1 %)", agent),
            ("tail -q -F of the same files", cpu["tail"]),
            ("torchrun's own elastic agent", cpu["torchrun"]),
            ("the %d ranks themselves" % nproc, cpu["ranks"]))
    for name, seconds in rows:
        print("  %-54s %7.3f s CPU = %6.3f %% of a core" % (name, seconds, pct(seconds, wall)))
    print("wake-ups a second (voluntary context switches): serve %.1f, supervisor %.1f"
          % (r["wakes"]["serve"] / wall, r["wakes"]["supervisor"] / wall))
    print("ratios: agent / tail -F %.1fx, agent / torchrun's agent %.2fx; agent CPU per "
          "line %.0f us" % (agent / max(cpu["tail"], 1.0 / CLK),
                            agent / max(cpu["torchrun"], 1.0 / CLK),
                            1e6 * agent / max(1, r["lines"])))
    if idle is None:
        return
    idle_agent = idle["cpu"]["serve"] + idle["cpu"]["supervisor"]
    print("the same with silent ranks (%.1f s, %d lines): serve %.3f %%, supervisor %.3f %%, "
          "agent %.3f %% of a core (wake-ups a second: serve %.1f, supervisor %.1f); agent "
          "with lines / silent %.2fx; the lines' own cost %.3f %% of a core" % (
              idle["wall"], idle["lines"], pct(idle["cpu"]["serve"], idle["wall"]),
              pct(idle["cpu"]["supervisor"], idle["wall"]), pct(idle_agent, idle["wall"]),
              idle["wakes"]["serve"] / idle["wall"], idle["wakes"]["supervisor"] / idle["wall"],
              pct(agent, wall) / max(pct(idle_agent, idle["wall"]), 1e-9),
              pct(agent, wall) - pct(idle_agent, idle["wall"])))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_main(float(sys.argv[2]), float(sys.argv[3]))
    sys.path.insert(0, REPO)
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0, help="lines a second, per rank")
    ap.add_argument("--no-idle", action="store_true", help="skip the silent-ranks run")
    ap.add_argument("--sample-s", help="RANKDECK_SAMPLE_S for the run (0: no rank samples, "
                    "agent/supervisor/ranksample.py); the supervisor's default (10 s) when not given")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdk-agentcpu-") as work:
        result = asyncio.run(measure(args.seconds, args.nproc, args.rate, work, args.sample_s))
    idle = None
    if not args.no_idle:
        with tempfile.TemporaryDirectory(prefix="rdk-agentcpu-") as work:
            idle = asyncio.run(measure(args.seconds, args.nproc, 0.0, work, args.sample_s))
    report(result, args.nproc, args.rate, idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
