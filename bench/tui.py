"""Benchmark: the TUI under a firehose - 256 ranks (32 nodes x 8) writing 50k lines/s.

The app runs headless in this process, fed through the scripted transport (so the console's
JSON decode, NodeLink and RunState are on the same event loop as Textual, as in real use).
Every 200 ms a key switches the active pane to the next rank (which refills it from
RunState's 5000 kept lines); the latency is from the key event to the screen update that
shows the new rank, including turning that update into terminal output (which headless mode
would skip). Each frame's cost (the changed widgets rendered, composed and turned into output)
is timed too. Both are given in wall time and in the event loop thread's CPU time ("on-CPU"):
on a shared host the wall time includes time the process waited for a CPU, which the table
shows too (/proc/self/schedstat). RSS is sampled every 10 s. The baseline runs the same
feed into RunController + RunState without the app, in its own process.

    .venv/bin/python bench/tui.py [--seconds 60] [--rate 50000] [--nodes 32] [--nproc 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from agent.wire import protocol  # noqa: E402
from console.model.buffers import BUDGET_MB  # noqa: E402
from tests.console.scripted import RunScript, controller, gpu_snapshot  # noqa: E402

LINES_PER_TICK = 10  # per rank and push
VARIANTS = 32  # distinct pre-encoded data messages per node, cycled
LINE_BUDGET_MB = [BUDGET_MB]  # set from --line-budget
WARMUP_S = 10  # also reported: latency after the first seconds (imports, first paints)
WINDOW_S = 30  # keys and collections are also reported by window of the run


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def run_delay_s() -> float:
    """Seconds this process spent runnable but waiting for a CPU (other load on the host)."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def data_messages(node: str, nproc: int, node_index: int) -> list[bytes]:
    """Pre-encoded journal messages: LINES_PER_TICK lines for each rank of the node."""
    out = []
    for v in range(VARIANTS):
        recs = []
        for lr in range(nproc):
            rank = node_index * nproc + lr
            text = "".join(
                "[rank%d]: iter %05d/%d | loss %.4f | grad_norm %.3f | lr 3.0e-04 | "
                "tokens/s %d | mem %.1fG\n" % (rank, v * LINES_PER_TICK + i, 100000,
                                             2.5 - 0.001 * i, 0.8 + 0.01 * v,
                                             31000 + 17 * i, 40.5)
                for i in range(LINES_PER_TICK))
            recs.append([{"k": "data", "f": lr, "o": 0, "ts": 0.0}, text])
        out.append(protocol.encode({"t": "journal", "sub": node, "end": v + 1, "recs": recs}))
    return out


async def firehose(transport, hosts, nproc, rate, seconds, stats) -> None:
    ranks = len(hosts) * nproc
    tick = LINES_PER_TICK * ranks / rate
    messages = {h: data_messages(h, nproc, i) for i, h in enumerate(hosts)}
    start = time.perf_counter()
    k = 0
    step = 0
    while True:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        due = start + k * tick
        if due > now:
            await asyncio.sleep(due - now)
        ts = time.time()
        metric = k % 4 == 0
        if metric:
            step += 1
        for i, h in enumerate(hosts):
            node = transport.node(h)
            if node.stream is None:
                continue
            node.stream.send_raw(messages[h][k % VARIANTS])
            if metric:
                node.stream.send({"t": "journal", "sub": h, "end": 10 ** 9 + k, "recs": [
                    [{"k": "metric", "f": lr, "step": step, "loss": 2.5 / (1 + 0.01 * step) +
                      0.001 * lr, "lr": 3e-4, "step_time": 4 * tick, "tok_s": 31000.0,
                      "ts": ts}] for lr in range(nproc)]})
            if k % max(1, int(1 / tick)) == 0:
                node.stream.send({"t": "gpu", "snap": gpu_snapshot(nproc, util=50 + k % 40)})
        stats["pushed"] += LINES_PER_TICK * ranks
        k += 1


async def loop_lag(samples: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.05)
        samples.append(time.perf_counter() - t - 0.05)


async def rss_sampler(samples: list, stop: asyncio.Event, state) -> None:
    start = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(10)
        samples.append((round(time.perf_counter() - start), round(rss_mb(), 1),
                        state.total_lines, len(gc.get_objects())))


def setup(work: str, hosts_n: int, nproc: int):
    hosts = ["node%d" % (i + 1) for i in range(hosts_n)]
    script = RunScript(hosts, nproc, t0=time.time()).launched()
    transport = script.transport(gpus={h: gpu_snapshot(nproc) for h in hosts})
    ctl, launch = controller(work, transport, hosts_n, nproc, steps=100000)
    ctl.state.stall_min_s = 3600
    ctl.state.budget.limit = LINE_BUDGET_MB[0] << 20
    return hosts, transport, ctl, launch


async def bench_app(args) -> dict:
    from textual import events

    from console.tui.app import RankdeckApp
    from console.tui.logs import LogPanes

    hosts, transport, ctl, launch = setup(args.work, args.nodes, args.nproc)
    app = RankdeckApp(ctl, launch, gc_tuning=args.gc == "tuned")  # run_app: tuned
    result: dict = {"latency_ms": [], "latency_cpu_ms": [], "key_at_s": [], "lag": [],
                    "rss": [], "frame_cpu_ms": []}
    stats = {"pushed": 0}
    async with app.run_test(size=(200, 60)) as pilot:
        while app.launching:
            await pilot.pause(0.05)
        logs = app.query_one(LogPanes)
        logs.focus_pane(0)
        waiting: dict = {}
        original = app._display

        def display(screen, renderable):
            original(screen, renderable)
            if renderable is not None and hasattr(renderable, "render_segments"):
                renderable.render_segments(app.console)  # what a real terminal would cost
            want = waiting.get("source")
            if want is not None and logs.active_pane.source == want:
                result["key_at_s"].append(waiting["t0"] - t_start)
                result["latency_ms"].append((time.perf_counter() - waiting["t0"]) * 1000)
                result["latency_cpu_ms"].append((time.thread_time() - waiting["c0"]) * 1000)
                waiting.clear()

        app._display = display
        screen = app.screen
        compositor_refresh = screen._compositor_refresh

        def timed_refresh():  # one frame: the changed widgets rendered, composed, output
            c0 = time.thread_time()
            compositor_refresh()
            result["frame_cpu_ms"].append((time.thread_time() - c0) * 1000)

        screen._compositor_refresh = timed_refresh
        t_start = time.perf_counter()
        collections = result["gc"] = []  # (at s, generation, on-CPU ms) of each collection
        started = {}

        def on_gc(phase, info):
            if phase == "start":
                started["c"] = time.thread_time()
            elif "c" in started:
                collections.append((time.perf_counter() - t_start, info["generation"],
                                    (time.thread_time() - started.pop("c")) * 1000))

        gc.callbacks.append(on_gc)
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(loop_lag(result["lag"], stop)),
                 asyncio.ensure_future(rss_sampler(result["rss"], stop, ctl.state))]
        feeder = asyncio.ensure_future(firehose(transport, hosts, args.nproc, args.rate,
                                                args.seconds, stats))
        cpu0, wait0 = time.process_time(), run_delay_s()
        ranks = sorted(ctl.state.ranks)
        while not feeder.done():
            await asyncio.sleep(0.2)
            current = logs.active_pane.source
            nxt = ranks[(ranks.index(current[1]) + 1) % len(ranks)]
            waiting.update(source=("rank", nxt), t0=time.perf_counter(), c0=time.thread_time())
            key = events.Key("right_square_bracket", "]")
            key.set_sender(app)
            app._driver.send_message(key)
            deadline = time.perf_counter() + 2.0
            while "source" in waiting and time.perf_counter() < deadline:
                await asyncio.sleep(0.001)
            if "source" in waiting:
                result["key_at_s"].append(waiting["t0"] - t_start)
                result["latency_ms"].append(2000.0)
                result["latency_cpu_ms"].append((time.thread_time() - waiting["c0"]) * 1000)
                waiting.clear()
        elapsed = time.perf_counter() - t_start
        gc.callbacks.remove(on_gc)
        result["cpu_s"] = time.process_time() - cpu0
        result["wait_s"] = run_delay_s() - wait0
        await pilot.pause(1.0)  # let the last key be handled before the app closes
        stop.set()
        for t in tasks:
            t.cancel()
        result["lines"] = ctl.state.total_lines
        result["elapsed"] = elapsed
        result["pushed"] = stats["pushed"]
        result["panes"] = [list(p.source) for p in logs.panes]
        result["pane_lines"] = [p.view.entry_count() for p in logs.panes]
    result["peak_rss"] = peak_rss_mb()
    return result


async def bench_baseline(args) -> dict:
    hosts, transport, ctl, launch = setup(args.work, args.nodes, args.nproc)
    result: dict = {"latency_ms": [], "lag": [], "rss": []}
    stats = {"pushed": 0}
    await launch()
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(loop_lag(result["lag"], stop)),
             asyncio.ensure_future(rss_sampler(result["rss"], stop, ctl.state))]
    cpu0, wait0 = time.process_time(), run_delay_s()
    t_start = time.perf_counter()
    await firehose(transport, hosts, args.nproc, args.rate, args.seconds, stats)
    result["elapsed"] = time.perf_counter() - t_start
    result["cpu_s"] = time.process_time() - cpu0
    result["wait_s"] = run_delay_s() - wait0
    await asyncio.sleep(0.2)
    stop.set()
    for t in tasks:
        t.cancel()
    result["lines"] = ctl.state.total_lines
    result["pushed"] = stats["pushed"]
    await ctl.close()
    result["peak_rss"] = peak_rss_mb()
    return result


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def table(app: dict, base: dict, args) -> str:
    rows = [("", "app (TUI)", "baseline (RunState only)")]

    def both(name, fn, fmt):
        rows.append((name, fmt % fn(app) if app else "-", fmt % fn(base) if base else "-"))

    both("lines/s received", lambda r: r["lines"] / r["elapsed"], "%.0f")
    both("CPU s per wall s", lambda r: r["cpu_s"] / r["elapsed"], "%.2f")
    both("waiting for a CPU, s per s", lambda r: r["wait_s"] / r["elapsed"], "%.2f")
    for name, key in (("key->screen", "latency_ms"), ("  same, on-CPU", "latency_cpu_ms"),
                      ("frame on-CPU", "frame_cpu_ms")):
        values = app[key]
        rows.append(("%s p50/p90/p99/max ms" % name, "%.1f / %.1f / %.1f / %.1f" % (
            pct(values, 50), pct(values, 90), pct(values, 99), max(values or [0])), "n/a"))
    rows.append(("frames", "%d" % len(app["frame_cpu_ms"]), "n/a"))
    warm = [i for i, t in enumerate(app["key_at_s"]) if t >= WARMUP_S]
    rows.append(("key->screen p99 ms after %d s" % WARMUP_S,
                 "%.1f" % pct([app["latency_ms"][i] for i in warm], 99), "n/a"))
    rows.append(("  same, on-CPU", "%.1f" % pct([app["latency_cpu_ms"][i] for i in warm], 99),
                 "n/a"))
    rows.append(("key presses", "%d" % len(app["latency_ms"]), "n/a"))
    span = WINDOW_S if args.seconds > 2 * WINDOW_S else max(1.0, args.seconds / 3)
    for start in range(0, int(args.seconds), int(span)):  # what grows with the run's age
        keys = [app["latency_cpu_ms"][i] for i, t in enumerate(app["key_at_s"])
                if start <= t < start + span]
        full = [ms for t, gen, ms in app.get("gc", ()) if gen == 2 and start <= t < start + span]
        young = [ms for t, gen, ms in app.get("gc", ()) if gen < 2 and start <= t < start + span]
        rows.append(("%3d-%3d s: keys on-CPU p50/p99, gc" % (start, start + span),
                     "%.1f / %.1f; full %d (max %.0f ms), young %d (max %.0f ms)" % (
                         pct(keys, 50), pct(keys, 99), len(full), max(full or [0]),
                         len(young), max(young or [0])), "n/a"))
    both("loop lag p99 ms", lambda r: pct(r["lag"], 99) * 1000, "%.1f")
    both("peak RSS MB", lambda r: r["peak_rss"], "%.0f")
    base = base or {"rss": []}
    for i in range(max(len(app["rss"]), len(base["rss"]))):
        a = app["rss"][i] if i < len(app["rss"]) else None
        b = base["rss"][i] if i < len(base["rss"]) else None
        t = (a or b)[0]
        rows.append(("RSS MB (objects the collector tracks) at %3d s" % t,
                     "%.0f (%d)" % (a[1], a[3]) if a else "-",
                     "%.0f (%d)" % (b[1], b[3]) if b else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    head = "rankdeck TUI bench: %d nodes x %d ranks, %d lines/s offered, %d s, gc %s" % (
        args.nodes, args.nproc, args.rate, args.seconds, args.gc)
    lines = [head] + ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(2, "-" * len(lines[1]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=int, default=50000)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--line-budget", type=int, default=BUDGET_MB, metavar="MB",
                    help="the console's line budget (rankdeck --line-budget)")
    ap.add_argument("--mode", choices=("both", "app", "baseline"), default="both")
    ap.add_argument("--app-only", action="store_true",
                    help="no baseline run beside the app (the long runs: the baseline's figures "
                    "do not grow with the run's age)")
    ap.add_argument("--gc", choices=("tuned", "default"), default="tuned",
                    help="the app's garbage collector settings: run_app's, or CPython's")
    args = ap.parse_args()
    LINE_BUDGET_MB[0] = args.line_budget
    if args.mode != "both":
        fn = bench_app if args.mode == "app" else bench_baseline
        with tempfile.TemporaryDirectory(prefix="rankdeck-bench-") as work:
            args.work = work
            print(json.dumps(asyncio.run(fn(args))))
        return 0
    results = {"baseline": None}
    for mode in ("app",) if args.app_only else ("app", "baseline"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--gc", args.gc,
                              "--seconds", str(args.seconds), "--rate", str(args.rate),
                              "--nodes", str(args.nodes), "--nproc", str(args.nproc),
                              "--line-budget", str(args.line_budget)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print("the %s run failed (exit %s): %s" % (mode, out.returncode,
                                                      out.stderr[-4000:]), file=sys.stderr)
            return 1
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(table(results["app"], results["baseline"], args))
    app = results["app"]
    ok = pct(app["latency_ms"], 99) <= 100 and app["peak_rss"] <= 400
    if app["wait_s"] / app["elapsed"] > 0.2:
        print("note: the app waited for a CPU %.0f%% of the time; wall latencies include that"
              % (100 * app["wait_s"] / app["elapsed"]))
    print("targets (p99 <= 100 ms, RSS <= 400 MB): %s" % ("met" if ok else "NOT met"))
    keys = pct(app["latency_cpu_ms"], 99) <= 50 and pct(app["frame_cpu_ms"], 99) <= 33
    print("the targets (on-CPU p99: key <= 50 ms, frame <= 33 ms): %s"
          % ("met" if keys else "NOT met"))
    print("median pane lines kept: %s" % statistics.median(app["pane_lines"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
