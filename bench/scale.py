"""Scale: what one console costs per connected host, at 4, 16 and 64 real SSH hosts.

Builds N real sshd hosts in network namespaces (tests/e2e/sshhosts.py, the setup
bench/launch.py uses; root only) and gives every host the journal of a finished run (8
ranks, ``--steps`` steps each: one log line and one loss metric a step, then a clean exit).
Then, for each size, a fresh console process (so its memory starts clean) measures, through
the real RunController, NodeLink and SshTransport:

- resident memory (RSS) after imports, after connecting (SSH + agent hello), after
  subscribing and replaying the journals, and after the idle window;
- file descriptors, sockets and asyncssh connections;
- at idle, ``--idle`` seconds connected and subscribed: the console's CPU seconds per second,
  the messages and bytes per second it receives (every agent sends host and GPU telemetry
  once a second), and the CPU of everything in the hosts' namespaces (sshd + the agent);
- fan-out: the time for one request to all N and back (``state``, and ``stacks``, which on a
  finished run is one round trip without py-spy), median and worst of ``--rounds``.

It then fits a straight line through each figure against N and prints the per-host slope
(docs/SCALE.md extrapolates from it). Separately (``--rank-cost``, no hosts needed) it
measures RunState's fixed memory per rank: a full loss series and the lines an unseen rank
keeps (the budget's floor).

All "hosts" share this machine's CPUs with the console: the hosts' CPU is reported apart,
and the load average is printed beside every run. Everything it starts is removed at exit
(Ctrl-C and SIGTERM included): the hosts by SshHosts.close(), each console child by its PID.

    sudo .venv/bin/python bench/scale.py [--sizes 4,16,64] [--repeat 1] [--idle 20]
    .venv/bin/python bench/scale.py --rank-cost 64,256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "e2e")]

RUN_ID = "scalebench"
NPROC = 8
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fds() -> tuple[int, int]:
    """Open file descriptors of this process, and how many of them are sockets."""
    total = sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        total += 1
        try:
            sockets += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
        except OSError:
            pass
    return total, sockets


def cpu_of(pid: str) -> float:
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except OSError:
        return 0.0


def hosts_cpu(namespaces: list[str]) -> float:
    """CPU seconds so far of every process in the hosts' network namespaces (sshd, agent)."""
    total = 0.0
    for ns in namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        total += sum(cpu_of(p) for p in pids)
    return total


# -- the journals the hosts replay ----------------------------------------------------------
def write_journal(folder: str, node: int, steps: int) -> None:
    """A finished run's journal for one node: NPROC ranks, a line and a loss a step each."""
    from agent.host.journal import JournalWriter

    os.makedirs(folder)
    journal = JournalWriter(os.path.join(folder, "journal"))
    now = time.time() - steps
    recs = []
    for lr in range(NPROC):
        rank = node * NPROC + lr
        recs.append(({"k": "file", "f": lr, "rank": rank, "local_rank": lr, "attempt": 0,
                      "instance": "bench", "stream": "stdout", "world_size": 0,
                      "path": "attempt_0/%d/stdout.log" % lr, "ts": now}, b""))
    offsets = [0] * NPROC
    for step in range(steps):
        for lr in range(NPROC):
            line = ("[rank%d] step %d loss %.4f step_time 0.250 tokens/s 41000 lr 3e-4\n"
                    % (node * NPROC + lr, step, 2.0 / (1 + step / 50))).encode()
            recs.append(({"k": "data", "f": lr, "o": offsets[lr], "ts": now + step}, line))
            recs.append(({"k": "metric", "f": lr, "step": step, "loss": 2.0 / (1 + step / 50),
                          "step_time": 0.25, "ts": now + step}, b""))
            offsets[lr] += len(line)
    # ended cleanly: no stall checks, verdicts or stops at idle, only the telemetry
    recs.append(({"k": "event", "what": "ended", "state": "exited", "exit_code": 0,
                  "ts": now + steps, "node": "node%d" % node}, b""))
    journal.append_many(recs)
    journal.close()
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"state": "exited", "run_id": RUN_ID, "node": "node%d" % node,
                   "launches": 1, "exit_code": 0, "ended": now + steps}, f)


# -- one console, in its own process ----------------------------------------------------------
class Meter:
    """Messages and bytes read from the agents, by message kind."""

    def __init__(self):
        self.msgs: dict[str, int] = {}
        self.bytes = 0

    def wrap(self, stream) -> None:
        read = stream.readline

        async def readline():
            line = await read()
            self.bytes += len(line)
            start = line.find(b'"t":"') + 5
            kind = line[start:line.find(b'"', start)].decode("ascii", "replace") if start > 4 \
                else "?"
            self.msgs[kind] = self.msgs.get(kind, 0) + 1
            return line
        stream.readline = readline  # NodeLink looks the method up on every read

    def reset(self) -> None:
        self.msgs, self.bytes = {}, 0


async def console(cfg: dict) -> dict:
    from console.records.history import History
    from console.run.run import RunController
    from console.transport.ssh import SshTransport
    from inventory.model import Host, Inventory

    out = {"n": len(cfg["hosts"]), "rss_imported": rss_mb(), "fds_imported": fds()[0]}
    hosts = [Host(name=name, addr=addr, ssh=name, python=cfg["python"])
             for name, addr in cfg["hosts"]]
    transport = SshTransport(ssh_config=cfg["ssh_config"], known_hosts=cfg["known_hosts"],
                             client_keys=[cfg["client_key"]], remote_cache=cfg["remote_cache"])
    with tempfile.TemporaryDirectory(prefix="rdk-scale-") as work:
        ctl = RunController(Inventory("<bench>", hosts, "ssh"), transport,
                            History(os.path.join(work, "history")), run_id=RUN_ID)
        try:
            cpu, t0 = own_cpu(), time.monotonic()
            failed = await ctl.connect_all(reconnect=False)
            if failed:
                raise RuntimeError("hosts failed: %s" % {n: str(e) for n, e in failed.items()})
            out.update(connect_s=time.monotonic() - t0, connect_cpu=own_cpu() - cpu,
                       rss_connected=rss_mb())
            out["fds_connected"], out["sockets"] = fds()
            # the transport's cache of SSH connections (one per host, shared by every channel)
            out["ssh_connections"] = sum(1 for f in transport._links.values()
                                         if f.done() and not f.exception())
            meter = Meter()
            for link in ctl.links.values():
                meter.wrap(link.stream)
            cpu, t0 = own_cpu(), time.monotonic()
            await ctl.subscribe_all()
            await ctl.caught_up()
            out.update(subscribe_s=time.monotonic() - t0, subscribe_cpu=own_cpu() - cpu,
                       rss_subscribed=rss_mb(), ranks=len(ctl.state.ranks),
                       replay_bytes=meter.bytes)
            await asyncio.sleep(2)  # let the replay's garbage settle before the idle window
            meter.reset()
            load0, hcpu0 = os.getloadavg()[0], hosts_cpu(cfg["namespaces"])
            cpu, t0 = own_cpu(), time.monotonic()
            await asyncio.sleep(cfg["idle"])
            wall = time.monotonic() - t0
            out.update(idle_cpu_per_s=(own_cpu() - cpu) / wall,
                       hosts_cpu_per_s=(hosts_cpu(cfg["namespaces"]) - hcpu0) / wall,
                       msgs_per_s=sum(meter.msgs.values()) / wall,
                       bytes_per_s=meter.bytes / wall,
                       kinds={k: round(v / wall, 2) for k, v in meter.msgs.items()},
                       rss_idle=rss_mb(), load=(load0, os.getloadavg()[0]))
            for op in ("state", "stacks"):
                times, cpu = [], own_cpu()
                for _ in range(cfg["rounds"]):
                    t0 = time.monotonic()
                    if op == "stacks":
                        res = await ctl.stacks()
                    else:
                        res = await ctl.gather_nodes(lambda link: link.request(
                            "state", run_root=link.run_root, node=link.name))
                    times.append(time.monotonic() - t0)
                    bad = [n for n, r in res.items() if isinstance(r, BaseException)]
                    if bad:
                        raise RuntimeError("%s failed on %s: %s" % (op, bad, res[bad[0]]))
                out[op + "_s"] = statistics.median(times)
                out[op + "_max_s"] = max(times)
                out[op + "_cpu"] = (own_cpu() - cpu) / cfg["rounds"]
        finally:
            await ctl.close()
    return out


def run_console(env, n: int, args) -> dict:
    cfg = {"hosts": [(h.name, h.addr) for h in env.hosts[:n]],
           "namespaces": [h.ns for h in env.hosts[:n]], "python": args.python or env.python,
           "ssh_config": env.ssh_config, "known_hosts": env.known_hosts,
           "client_key": env.client_key, "remote_cache": env.remote_cache,
           "idle": args.idle, "rounds": args.rounds}
    child = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(cfg)],
                             stdout=subprocess.PIPE, text=True)
    try:
        text, _ = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError("console child for %d hosts exited %d" % (n, child.returncode))
    return json.loads(text.strip().splitlines()[-1])


# -- the per-rank fixed cost (no hosts) -------------------------------------------------------
def rank_cost(ranks: int, points: int, lines: int) -> dict:
    """RSS of a RunState holding ``ranks`` ranks with ``points`` loss points and ``lines``
    kept lines each (measured in a fresh process by the caller)."""
    from console.model.state import RunState

    nodes = [("node%d" % i, "10.0.%d.%d" % (i // 250, i % 250)) for i in range(ranks // NPROC)]
    state = RunState(RUN_ID, nodes)
    before = rss_mb()
    line = "[rank0] step 1000 loss 1.2345 step_time 0.250 tokens/s 41000 lr 3e-4 " \
           "grad_norm 0.93 mem 61.2G\n"
    for i, (node, _addr) in enumerate(nodes):  # in small batches: no big transient lists
        state.apply_records(node, [[{"k": "file", "f": lr, "rank": i * NPROC + lr,
                                     "local_rank": lr, "attempt": 0, "instance": "x",
                                     "stream": "stdout", "path": "p"}]
                                   for lr in range(NPROC)], 0)
        for lr in range(NPROC):
            for s0 in range(0, points, 256):
                state.apply_records(node, [[{"k": "metric", "f": lr, "step": s,
                                             "loss": 1.0 / (s + 1), "step_time": 0.25,
                                             "ts": 1.0}]
                                           for s in range(s0, min(points, s0 + 256))], 0)
            state.apply_records(node, [[{"k": "data", "f": lr, "o": 0, "ts": 1.0}, line * 50]
                                       for _ in range(lines // 50)], 0)
    return {"ranks": ranks, "mb": rss_mb() - before, "kept_lines": sum(
        len(rs.lines) for rs in state.ranks.values()), "points": sum(
        len(rs.points) for rs in state.ranks.values())}


def child_main(which: str, arg: str) -> int:
    if which == "--child":
        print(json.dumps(asyncio.run(console(json.loads(arg)))))
    else:
        ranks, points, lines = (int(x) for x in arg.split(","))
        print(json.dumps(rank_cost(ranks, points, lines)))
    return 0


def in_child(argv: list[str]) -> dict:
    res = subprocess.run([sys.executable, __file__] + argv, capture_output=True, text=True,
                         timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x: (b, a)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return b, my - b * mx


COLUMNS = [  # (key, header, format)
    ("rss_connected", "RSS conn MB", "%.1f"), ("rss_subscribed", "RSS subs MB", "%.1f"),
    ("rss_idle", "RSS idle MB", "%.1f"), ("fds_connected", "fds", "%d"),
    ("ssh_connections", "ssh conns", "%d"), ("connect_s", "connect s", "%.2f"),
    ("connect_cpu", "conn CPU s", "%.2f"), ("idle_cpu_per_s", "idle CPU s/s", "%.4f"),
    ("msgs_per_s", "msgs/s", "%.1f"), ("bytes_per_s", "bytes/s", "%.0f"),
    ("hosts_cpu_per_s", "hosts CPU s/s", "%.3f"), ("state_s", "state fan s", "%.3f"),
    ("stacks_s", "stacks fan s", "%.3f"), ("state_cpu", "fan CPU s", "%.3f"),
]


def print_table(rows: list[dict]) -> None:
    heads = ["hosts", "ranks", "load"] + [h for _k, h, _f in COLUMNS]
    print(" | ".join(heads))
    for r in rows:
        cells = ["%d" % r["n"], "%d" % r["ranks"], "%.1f-%.1f" % tuple(r["load"])]
        cells += [f % r[k] for k, _h, f in COLUMNS]
        print(" | ".join(cells))
    xs = [r["n"] for r in rows]
    if len(set(xs)) > 1:
        cells = ["per host", "", ""]
        intercepts = ["at 0", "", ""]
        for k, _h, _f in COLUMNS:
            b, a = slope(xs, [float(r[k]) for r in rows])
            cells.append("%.4g" % b)
            intercepts.append("%.4g" % a)
        print(" | ".join(cells))
        print(" | ".join(intercepts))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--child", "--rank-child"):
        return child_main(argv[0], argv[1])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of the idle window")
    ap.add_argument("--rounds", type=int, default=5, help="fan-out requests per op")
    ap.add_argument("--steps", type=int, default=300, help="steps in each host's journal")
    ap.add_argument("--python", default=None, help="the hosts' interpreter for the agent")
    ap.add_argument("--rank-cost", default=None, metavar="R1,R2",
                    help="only measure RunState's memory per rank (no hosts)")
    args = ap.parse_args(argv)

    if args.rank_cost:
        rows = [in_child(["--rank-child", "%d,%d,%d" % (r, 4095, 200)])
                for r in (int(x) for x in args.rank_cost.split(","))]
        for r in rows:
            print("%5d ranks: %.1f MB (%d loss points, %d kept lines) = %.1f KiB a rank"
                  % (r["ranks"], r["mb"], r["points"], r["kept_lines"],
                     r["mb"] * 1024 / r["ranks"]))
        if len(rows) > 1:
            b, a = slope([r["ranks"] for r in rows], [r["mb"] for r in rows])
            print("slope %.1f KiB a rank (intercept %.1f MB)" % (b * 1024, a))
        return 0

    from sshhosts import create_hosts, missing_requirements

    reason = missing_requirements()
    if reason:
        print("skipped: %s" % reason)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs
    started = time.monotonic()
    env = create_hosts(max(sizes))
    try:
        with tempfile.TemporaryDirectory(prefix="rdk-scale-") as tmp:
            for k, h in enumerate(env.hosts):
                folder = os.path.join(tmp, h.name)
                write_journal(os.path.join(folder, h.name), k, args.steps)
                env.put_tree(h.name, folder, "~/.rankdeck/runs/" + RUN_ID)
        print("%d sshd hosts up with journals in %.1f s; %d CPUs; load average %.1f"
              % (len(env.hosts), time.monotonic() - started, os.cpu_count(),
                 os.getloadavg()[0]), flush=True)
        rows = []
        for _ in range(args.repeat):
            for n in sizes:
                row = run_console(env, n, args)
                rows.append(row)
                print("  %d hosts: %s" % (n, json.dumps(row, sort_keys=True)), flush=True)
        print()
        print_table(rows)
        print("\nidle window %g s, fan-out median of %d; load = 1-min load average at the "
              "start and end of the idle window" % (args.idle, args.rounds))
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
