"""Ingest benchmark: synthetic ranks on 4 local nodes at rising rates, rankdeck vs `tail -F`.

For each total rate it runs bench/writer.py as the "launcher" on 4 local nodes x 2 ranks
through the real path (supervisor -> journal -> serve -> pipe -> RunController -> RunState),
then the same writers read by `tail -q -F` through a pipe (the baseline), and prints:
delivered lines/s, p50/p99 latency from write to arrival, and CPU seconds per million lines
(agent side: supervisors + serves; console side: this process; baseline: tail + reader).

CPU per line is given twice: over the whole run (start-up and end included: at 10 s the
agent's 8 processes starting are a large share of it) and in the steady state, from
``WARM_UP`` seconds after the first line to ``COOL_DOWN`` seconds before the writers stop
(what a run of hours spends a line; both sides sampled the same way, every 0.25 s).

    .venv/bin/python bench/ingest.py [--seconds 10] [--rates 10000,50000,100000,200000]

Never a test: timings on a shared 2-core machine are noisy. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from agent.host import procs  # noqa: E402
from console.records.history import History  # noqa: E402
from console.run.run import LaunchSpec, RunController  # noqa: E402
from console.transport.local import LocalTransport  # noqa: E402
from inventory.model import Host, Inventory  # noqa: E402

WRITER = os.path.join(REPO, "bench", "writer.py")
NODES, NPROC = 4, 2
T_RE = re.compile(rb"t=(\d+\.\d+)")
T_STR = re.compile(r"t=(\d+\.\d+)")
CLK = os.sysconf("SC_CLK_TCK")
WARM_UP, COOL_DOWN = 2.0, 1.0  # seconds of a run left out of its steady state


def cpu_of(pid: int) -> float:
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except OSError:
        return 0.0


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Meter:
    """Counts lines and samples latency (every 50th line) from the ``t=`` stamps."""

    def __init__(self):
        self.lines = 0
        self.lat = []
        self.first = self.last = None

    def feed(self, data: bytes, now: float) -> None:
        """The baseline's reader: ``data`` as read from tail's pipe."""
        if self._crosses(data.count(b"\n"), now):
            self._sample(T_RE.search(data, data.rfind(b"\n", 0, len(data) - 1) + 1), now)

    def feed_lines(self, lines: list, now: float) -> None:
        """rankdeck's: a batch's whole lines as the console cut them. The meter once encoded
        each batch's text again to count its line ends: the bench's CPU, ~0.02 s/M, booked
        as the console's."""
        if self._crosses(len(lines), now):
            self._sample(T_STR.search(lines[-1]), now)

    def _crosses(self, n: int, now: float) -> bool:
        """Count ``n`` lines; whether they cross a 50th line (the last one is sampled)."""
        if not n:
            return False
        if self.first is None:
            self.first = now
        self.last = now
        start = self.lines
        self.lines += n
        return start // 50 != self.lines // 50

    def _sample(self, m, now: float) -> None:
        if m:
            self.lat.append(now - float(m.group(1)))

    def rate(self) -> float:
        span = (self.last or 0) - (self.first or 0)
        return self.lines / span if span > 0 else 0.0

    def pct(self, q: float) -> float:
        if not self.lat:
            return float("nan")
        s = sorted(self.lat)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def run_rankdeck(rate: int, seconds: float, work: str) -> dict:
    hosts = [Host(name="node%d" % i, addr="127.0.0.%d" % (i + 2), python="", workdir=work)
             for i in range(NODES)]
    ctl = RunController(Inventory("<bench>", hosts, "local"), LocalTransport(),
                        History(os.path.join(work, "history")))
    meter = Meter()
    ctl.state.line_listeners.append(lambda b: meter.feed_lines(b.lines, time.time()))
    per_rank = rate / (NODES * NPROC)
    spec = LaunchSpec(script=WRITER, args=[str(NPROC), str(per_rank), str(seconds)],
                      launcher=[sys.executable], max_restarts=0)
    cpu0 = own_cpu()
    await ctl.launch(spec)
    serves = [l.stream.proc.pid for l in ctl.links.values()]
    sampler = Sampler(ctl.run_id, serves, meter)
    sampler.start()
    await ctl.wait_done()
    await asyncio.sleep(0.5)
    sampler.stop()
    # the sampler's reads of /proc are the bench's, not the console's: its thread's CPU out
    console_cpu = own_cpu() - cpu0 - sampler.cpu
    await ctl.stop_store()
    await ctl.close()
    watched = sampler.watched
    # the launcher (bench/writer.py standing in for torchrun) is the workload, as the writers
    # are in the baseline: shown apart, not counted as the agent's
    agent_cpu = sum(cpu for pid, cpu in watched.items() if sampler.kinds.get(pid) != "launcher")
    kinds = {}
    for pid, cpu in watched.items():
        kind = sampler.kinds.get(pid, "?")
        kinds[kind] = kinds.get(kind, 0.0) + cpu
    return {"lines": meter.lines, "rate": meter.rate(), "p50": meter.pct(0.5),
            "p99": meter.pct(0.99), "agent_cpu": agent_cpu, "console_cpu": console_cpu,
            "kinds": kinds, "startup": sampler.at_first or 0.0,
            "steady": steady(sampler.marks, meter.first, seconds)}


def steady(marks, first, seconds):
    """(lines, agent CPU, console CPU) between the samples from WARM_UP s after the first
    line to COOL_DOWN s before the writers stop; None when the run was too short for it."""
    if first is None:
        return None
    inside = [m for m in marks if first + WARM_UP <= m[0] <= first + seconds - COOL_DOWN]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return b[1] - a[1], b[2] - a[2], b[3] - a[3]


class Sampler(threading.Thread):
    """Samples the CPU of the run's agent processes every 0.25 s (supervisors exit at the end:
    sample while alive) on its own thread, whose CPU time (``cpu``) is the bench's, not the
    console's. ``kinds``: pid -> serve / supervisor / launcher."""

    def __init__(self, run_id, serves, meter):
        super().__init__(daemon=True)
        self.meter = meter
        self.at_first = None  # the agent's CPU when the first line arrived (its start-up)
        self.run_id = run_id
        self.watched = {}  # pid -> last cpu seen
        self.kinds = {pid: "serve" for pid in serves}
        self.cpu = 0.0
        self.marks = []  # (time, lines, agent cpu, console cpu) at every sample
        self.done = threading.Event()

    def run(self):
        known = set()
        while not self.done.is_set():
            if len(known) < 2 * NODES:  # each node's supervisor and launcher, found once
                for pid, kind in procs_of_run(self.run_id):
                    known.add(pid)
                    self.kinds[pid] = kind
            for pid in list(known) + [p for p, k in self.kinds.items() if k == "serve"]:
                c = cpu_of(pid)
                if c:
                    self.watched[pid] = c
            agent = sum(c for pid, c in self.watched.items() if self.kinds.get(pid) != "launcher")
            if self.at_first is None and self.meter.first is not None:
                self.at_first = agent
            # the console's CPU so far, this thread's own left out
            self.marks.append((time.time(), self.meter.lines, agent,
                               own_cpu() - time.thread_time()))
            self.done.wait(0.25)
        for pid, kind in self.kinds.items():
            if kind == "serve":
                self.watched[pid] = cpu_of(pid) or self.watched.get(pid, 0.0)
        self.cpu = time.thread_time()

    def stop(self):
        self.done.set()
        self.join()


def procs_of_run(run_id: str):
    for pid in procs.all_pids():
        env = procs.environ(pid)
        if env.get(procs.MARKER, "").startswith(run_id + "/") and "BENCH_WORKER" not in env:
            yield pid, "launcher"
    # supervisors are not marked: find them by their state.json-declared command line
    for pid in procs.all_pids():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"supervisor" in cmd and run_id.encode() in cmd:
            yield pid, "supervisor"


def run_baseline(rate: int, seconds: float, work: str) -> dict:
    per_rank = rate / (NODES * NPROC)
    files = []
    for n in range(NODES):
        for lr in range(NPROC):
            d = os.path.join(work, "node%d" % n, "bench_x", "attempt_0", str(lr))
            os.makedirs(d, exist_ok=True)
            files.append(os.path.join(d, "stdout.log"))
            open(files[-1], "ab").close()
    tail = subprocess.Popen(["tail", "-q", "-n", "+1", "-F"] + files, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0)
    meter = Meter()
    cpu0 = own_cpu()

    def reader():
        while True:
            data = tail.stdout.read(65536)
            if not data:
                return
            meter.feed(data, time.time())
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    marks, done, sampled = [], threading.Event(), []

    def sample():  # as the rankdeck side's Sampler: tail's CPU and this process's, every 0.25 s
        while not done.is_set():
            marks.append((time.time(), meter.lines, cpu_of(tail.pid),
                          own_cpu() - time.thread_time()))
            done.wait(0.25)
        sampled.append(time.thread_time())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    writers = [subprocess.Popen([sys.executable, WRITER, str(NPROC), str(per_rank),
                                 str(seconds)],
                                env=dict(os.environ, RANKDECK_LOG_DIR=os.path.join(
                                    work, "node%d" % n), RANKDECK_NODE="node%d" % n),
                                stdout=subprocess.DEVNULL)
               for n in range(NODES)]
    for w in writers:
        w.wait()
    time.sleep(1.0)
    done.set()
    sampler.join()
    tail_cpu = cpu_of(tail.pid)
    tail.terminate()
    tail.wait()
    t.join(2)
    # the sampler's reads of /proc are the bench's (as on the rankdeck side)
    reader_cpu = own_cpu() - cpu0 - sampled[0]
    return {"lines": meter.lines, "rate": meter.rate(), "p50": meter.pct(0.5),
            "p99": meter.pct(0.99), "agent_cpu": tail_cpu, "console_cpu": reader_cpu,
            "steady": steady(marks, meter.first, seconds)}


def per_m(cpu: float, lines: int) -> float:
    return cpu / lines * 1e6 if lines else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rates", default="10000,50000,100000,200000")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    # A host's agent keeps its bytecode (__pycache__) from its first start on; this machine's
    # environment may say not to write it, which would make every agent process compile its
    # modules again (~0.1 s of CPU each): compile them once, as a host's first start does.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(REPO, "agent")],
                   check=True)
    print("%d nodes x %d ranks, %.0f s per rate; latency = write to arrival in RunState "
          "(rankdeck) or to the reader (tail -F)" % (NODES, NPROC, args.seconds))
    head = ("target/s", "who", "lines", "delivered/s", "p50 ms", "p99 ms", "agent s/M",
            "console s/M")
    print("%-9s %-9s %9s %12s %8s %8s %10s %11s" % head)
    rows = []
    for rate in rates:
        with tempfile.TemporaryDirectory(prefix="rdk-bench-") as work:
            rd = asyncio.run(run_rankdeck(rate, args.seconds, work))
        with tempfile.TemporaryDirectory(prefix="rdk-bench-") as work:
            base = run_baseline(rate, args.seconds, work)
        for who, r in (("rankdeck", rd), ("tail -F", base)):
            print("%-9d %-9s %9d %12.0f %8.1f %8.1f %10.2f %11.2f" % (
                rate, who, r["lines"], r["rate"], r["p50"], r["p99"],
                per_m(r["agent_cpu"], r["lines"]), per_m(r["console_cpu"], r["lines"])))
        print("          agent CPU s/M by process: %s; agent CPU before the first line "
              "%.2f s (%.2f s/M)" % (", ".join(
                  "%s %.2f" % (kind, per_m(cpu, rd["lines"]))
                  for kind, cpu in sorted(rd["kinds"].items())),
                  rd["startup"], per_m(rd["startup"], rd["lines"])))
        for who, r in (("rankdeck", rd), ("tail -F", base)):
            if r["steady"]:
                lines, agent, console = r["steady"]
                print("          steady state, %s: %d lines, agent %.2f s/M, console %.2f s/M"
                      % (who, lines, per_m(agent, lines), per_m(console, lines)))
        rows.append((rate, rd, base))
        sys.stdout.flush()
    print("\nratios rankdeck / tail -F:")
    for rate, rd, base in rows:
        print("  %6d/s: delivered %.2fx, p99 %.2fx, total CPU per line %.2fx" % (
            rate, rd["rate"] / base["rate"] if base["rate"] else float("nan"),
            rd["p99"] / base["p99"] if base["p99"] else float("nan"),
            (rd["agent_cpu"] + rd["console_cpu"]) / max(1e-9, base["agent_cpu"] +
                                                         base["console_cpu"])
            * base["lines"] / max(1, rd["lines"])), end="")
        if rd["steady"] and base["steady"]:
            print(", in the steady state %.2fx" % (per_line(rd["steady"]) /
                                                    max(1e-12, per_line(base["steady"]))))
        else:
            print(" (the run is too short for a steady state)")
    return 0


def per_line(window):
    """Agent and console CPU a line in a steady-state window (lines, agent, console)."""
    lines, agent, console = window
    return (agent + console) / max(1, lines)


if __name__ == "__main__":
    sys.exit(main())
