"""Launch fan-out: rankdeck (SSH connect + agent hello + one request) next to pdsh `true`.

Builds N real sshd hosts in network namespaces (tests/e2e/sshhosts.py; root only), then for
4, 16 and 64 hosts times, median of ``--repeat`` runs:

- rankdeck cold: a new SshTransport; open_all (connect, copy the agent — each host's cache was
  emptied first — start ``serve``, check its hello), one ``ping`` on every host, close;
- rankdeck warm: the same with the agent already on every host (the usual case);
- pdsh: ``pdsh -R ssh -f N -w node0,...`` running ``true`` with the system ssh and the same
  ssh_config (fanout = N, so pdsh is fully parallel too).

All "hosts" share this machine's CPUs: the remote side (sshd, and for rankdeck a Python
interpreter starting the agent on every host) runs on the same cores as the console, which a
real cluster spreads over N machines. The console-CPU column is rankdeck's own share.
Everything it creates is removed at exit (Ctrl-C and SIGTERM included).

    sudo .venv/bin/python bench/launch.py [--sizes 4,16,64] [--repeat 3] [--python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "e2e")]

from agent.wire import protocol  # noqa: E402
from console.transport.base import HostUnreachable  # noqa: E402
from console.transport.ssh import SshTransport, open_all  # noqa: E402
from sshhosts import create_hosts, missing_requirements  # noqa: E402


def clear_caches(env, count: int) -> None:
    for h in env.hosts[:count]:
        for name in os.listdir(h.cache_dir):
            shutil.rmtree(os.path.join(h.cache_dir, name))


async def ping(stream) -> None:
    hello = protocol.decode(await stream.readline())
    assert hello["t"] == "hello", hello
    stream.write(protocol.encode({"t": "req", "id": 1, "op": "ping", "args": {}}))
    await stream.drain()
    while True:
        msg = protocol.decode(await stream.readline())
        if msg["t"] == "res":
            assert msg["ok"], msg
            return


async def rankdeck_once(env, hosts) -> tuple[float, float]:
    """Wall seconds and console CPU seconds for one launch round on ``hosts``."""
    cpu, started = time.process_time(), time.monotonic()
    transport = SshTransport(ssh_config=env.ssh_config, known_hosts=env.known_hosts,
                             client_keys=[env.client_key], remote_cache=env.remote_cache)
    try:
        streams = await open_all(transport, hosts)
        failed = {n: s for n, s in streams.items() if isinstance(s, HostUnreachable)}
        if failed:
            raise RuntimeError("hosts failed: %s" % failed)
        await asyncio.gather(*(ping(s) for s in streams.values()))
        await asyncio.gather(*(s.close() for s in streams.values()))
    finally:
        await transport.close()
    return time.monotonic() - started, time.process_time() - cpu


def pdsh_once(env, names) -> float:
    cmd = ["pdsh", "-R", "ssh", "-l", env.user, "-f", str(len(names)), "-w", ",".join(names),
           "true"]
    penv = dict(os.environ, PDSH_SSH_ARGS="-F %s -a -x -l%%u %%h" % env.ssh_config)
    started = time.monotonic()
    result = subprocess.run(cmd, env=penv, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0 or result.stdout.strip() or result.stderr.strip():
        raise RuntimeError("pdsh failed (%d): %s %s" % (result.returncode, result.stdout,
                                                        result.stderr))
    return elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=None,
                    help="the hosts' interpreter (default: the test hosts' own venv)")
    args = ap.parse_args(argv)
    reason = missing_requirements()
    if reason or shutil.which("pdsh") is None:
        print("skipped: %s" % (reason or "needs pdsh (apt-get install pdsh)"))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs

    setup = time.monotonic()
    env = create_hosts(max(sizes))
    args.python = args.python or env.python
    print("%d sshd hosts up in %.1f s; hosts' python: %s; %d CPUs; load average %.1f"
          % (len(env.hosts), time.monotonic() - setup, args.python, os.cpu_count(),
             os.getloadavg()[0]))
    try:
        hosts = env.inventory(python=args.python)
        asyncio.run(rankdeck_once(env, hosts[:4]))  # warm the page cache, untimed
        pdsh_once(env, env.names[:4])
        rows = []
        for n in sizes:
            cold, warm, warm_cpu, pdsh = [], [], [], []
            for _ in range(args.repeat):
                clear_caches(env, n)
                cold.append(asyncio.run(rankdeck_once(env, hosts[:n]))[0])
                wall, cpu = asyncio.run(rankdeck_once(env, hosts[:n]))
                warm.append(wall)
                warm_cpu.append(cpu)
                pdsh.append(pdsh_once(env, env.names[:n]))
            rows.append((n, statistics.median(cold), statistics.median(warm),
                         statistics.median(warm_cpu), statistics.median(pdsh)))
        print()
        print("%5s  %14s  %14s  %17s  %7s  %10s  %10s" % (
            "hosts", "rankdeck cold", "rankdeck warm", "console CPU warm", "pdsh", "cold/pdsh",
            "warm/pdsh"))
        for n, cold, warm, cpu, pdsh in rows:
            print("%5d  %13.2fs  %13.2fs  %16.2fs  %6.2fs  %9.2fx  %9.2fx"
                  % (n, cold, warm, cpu, pdsh, cold / pdsh, warm / pdsh))
        print("\nmedian of %d; rankdeck = connect + agent hello + one ping on every host + "
              "close; pdsh = `pdsh -R ssh -f N ... true`; load average now %.1f"
              % (args.repeat, os.getloadavg()[0]))
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
