"""The deep check's network probe (``rankdeck check --deep``, docs/HEALTH.md): one process a
host, started by serve with the run's own interpreter (it needs torch; the agent does not),
as the trainer is, that measures the bandwidth between the nodes with the run's stack: torch
point-to-point over gloo on CPU, NCCL where the host has GPUs (untested: no GPU here).

The processes meet through a TCPStore on the first host (the run's store, agent/store/
tcpstore.py, started for the check) and measure in the rounds agent/rules/health.py plans:
every pair of a round at once, each pair a two-way exchange the lower rank paces, for about
``seconds`` or ``max_mb`` MB a pair, whichever comes first, so a slow link never takes
minutes. Then rank 0 reads every pair's figure from the store, plans the rechecks (a slow
link's ends against a third node) and every rank runs them. Rank 0 prints the figures as one
JSON line; the others print their own.
"""

import json
import os
import signal
import subprocess
import sys
import time

from ..rules import health
from ..host.paths import host_python
from ..node.folder import agent_env

PROBE_SCRIPT = ("import sys; from agent.serve.netprobe import probe_main; "
                "sys.exit(probe_main(sys.argv[1:]))")
CHUNK_MIN = 1 << 16
CHUNK_MAX = 32 << 20
OUT_MAX = 1 << 20  # bytes of a probe's output read back


def exchange(dist, torch, partner, lead, seconds, max_bytes, device):
    """Gbit/s of the two-way exchange with ``partner`` (the lead's figure; None when
    nothing was timed). The lead says each chunk's size first (0: done)."""
    ctrl = torch.zeros(1, dtype=torch.int64, device=device)
    out = torch.ones(CHUNK_MAX, dtype=torch.uint8, device=device)
    inp = torch.empty(CHUNK_MAX, dtype=torch.uint8, device=device)
    size, moved, busy, elapsed, first = CHUNK_MIN, 0, 0.0, 0.0, True
    while True:
        if lead:
            ctrl[0] = size
            dist.send(ctrl, partner)
        else:
            dist.recv(ctrl, partner)
            size = int(ctrl[0])
        if size <= 0:
            break
        t0 = time.perf_counter()
        reqs = [dist.isend(out[:size], partner), dist.irecv(inp[:size], partner)]
        for req in reqs:
            req.wait()
        if device != "cpu":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        elapsed += dt
        if not first:  # the first chunk sets the pair up: not timed
            moved += size
            busy += dt
        first = False
        if lead:
            if elapsed >= seconds or moved >= max_bytes:
                size = 0
            else:
                rate = size / max(dt, 1e-6)
                size = int(min(2 * size, max(rate * (seconds - elapsed), CHUNK_MIN),
                               CHUNK_MAX, max(max_bytes - moved, CHUNK_MIN)))
    if not busy:
        return None
    return round(moved * 8 / busy / 1e9, 4)


def gpu_figures(torch, size=8192, reps=10, copy_bytes=1 << 30):
    """Per GPU of this host: a bf16 dense matmul's TFLOP/s and a device-to-device copy's
    GB/s (read + write), timed with CUDA events after a warm-up. Untested on a real GPU."""
    out = []
    for index in range(torch.cuda.device_count()):
        entry = {"index": index}
        try:
            with torch.cuda.device(index):
                a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
                src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
                dst = torch.empty_like(src)
                for _ in range(2):
                    torch.matmul(a, b)
                    dst.copy_(src)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                for _ in range(reps):
                    torch.matmul(a, b)
                end.record()
                torch.cuda.synchronize()
                entry["tflops"] = round(2 * size ** 3 * reps / (start.elapsed_time(end) / 1e3)
                                        / 1e12, 1)
                start.record()
                for _ in range(reps):
                    dst.copy_(src)
                end.record()
                torch.cuda.synchronize()
                entry["copy_gbps"] = round(2 * copy_bytes * reps /
                                           (start.elapsed_time(end) / 1e3) / 1e9, 1)
                del a, b, src, dst
                torch.cuda.empty_cache()
        except Exception as exc:  # an out-of-memory GPU, a wedged one: said, not raised
            entry["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
        out.append(entry)
    return out


def run_round(dist, torch, rank, pairs, seconds, max_bytes, device):
    """This rank's part of one round: ``[(a, b, gbps)]`` of its pair when it leads it."""
    dist.barrier()
    for a, b in pairs:
        if rank in (a, b):
            partner = b if rank == a else a
            gbps = exchange(dist, torch, partner, rank == a, seconds, max_bytes, device)
            return [(a, b, gbps)] if rank == a else []
    return []


def gather(store, key, world):
    """Every rank's list under ``key/<rank>``, joined."""
    out = []
    for r in range(world):
        out += [tuple(p) for p in json.loads(store.get("%s/%d" % (key, r)).decode())]
    return out


def probe_main(argv):
    """``CONFIG_JSON``: addr, port, rank, world, seconds, max_mb, timeout."""
    cfg = json.loads(argv[0])
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world = int(cfg["rank"]), int(cfg["world"])
    timeout = timedelta(seconds=float(cfg.get("timeout", 120)))
    store = dist.TCPStore(cfg["addr"], int(cfg["port"]), is_master=False, timeout=timeout)
    store = dist.PrefixStore("rankdeck-check/%s/" % cfg.get("check", "0"), store)
    cuda = torch.cuda.is_available()
    device = "cpu"
    if cuda:
        torch.cuda.set_device(0)
        device = "cuda"
    started = time.monotonic()
    gpus = gpu_figures(torch) if cuda else []
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                            world_size=world, timeout=timeout)
    seconds, max_bytes = float(cfg.get("seconds", 1.0)), int(float(cfg.get("max_mb", 256))
                                                              * (1 << 20))
    mine = []
    plan = health.rounds(world)
    rounds_from = time.monotonic()
    for pairs in plan:
        mine += run_round(dist, torch, rank, pairs, seconds, max_bytes, device)
    store.set("pairs/%d" % rank, json.dumps(mine))
    if rank == 0:
        store.set("recheck", json.dumps(health.recheck_rounds(world, gather(store, "pairs",
                                                                          world))))
    rechecks = [[tuple(p) for p in r] for r in json.loads(store.get("recheck").decode())]
    again = []
    for pairs in rechecks:
        again += run_round(dist, torch, rank, pairs, seconds, max_bytes, device)
    store.set("again/%d" % rank, json.dumps(again))
    result = {"rank": rank, "backend": "nccl" if cuda else "gloo",
              "rounds": len(plan), "recheck_rounds": len(rechecks), "gpus": gpus}
    if rank == 0:
        result.update(pairs=gather(store, "pairs", world), again=gather(store, "again", world))
    dist.barrier()  # every rank read what it needs before rank 0's store keys may go
    result["seconds"] = round(time.monotonic() - started, 2)
    result["rounds_s"] = round(time.monotonic() - rounds_from, 2)  # the rounds alone
    dist.destroy_process_group()
    print(json.dumps(result), flush=True)
    return 0


def run_probe(args):
    """serve's ``netcheck``: run the probe with the run's interpreter and wait for it (at most
    ``limit_s`` seconds and a minute for torch's import); its JSON answer, or ``{"error"}`` with its last lines."""
    cfg = {k: args[k] for k in ("addr", "port", "rank", "world", "seconds", "max_mb", "check")
           if k in args}
    cfg["timeout"] = float(args.get("limit_s", 120))  # torch's timeout for the store and pg
    limit = cfg["timeout"] + 60  # torch's import, then the rounds' bound
    python = host_python(args.get("python")) or sys.executable
    try:
        proc = subprocess.Popen([python, "-c", PROBE_SCRIPT, json.dumps(cfg)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=agent_env(), cwd="/",
                                start_new_session=True)
    except OSError as exc:
        return {"error": "cannot start %s: %s" % (python, exc)}
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return {"error": "the network probe did not finish within %d s" % limit}
    lines = out[-OUT_MAX:].decode("utf-8", "replace").strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    tail = err[-OUT_MAX:].decode("utf-8", "replace").strip().splitlines()[-3:]
    return {"error": "the network probe exited %s: %s" % (proc.returncode,
                                                           " | ".join(tail)[-600:])}
