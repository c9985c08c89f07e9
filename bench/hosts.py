"""`rankdeck hosts` for N hosts against one parallel `ssh host true` to all of them.

Builds N real sshd hosts in network namespaces (tests/e2e/sshhosts.py; root only), writes an
inventory of them, and times, alternating, median of ``--repeat`` rounds:

- rankdeck: ``rankdeck hosts -i INVENTORY`` in a new process (the CLI's start, one SSH
  connection per host in parallel, the agent's ``serve`` and its ``hosts`` answer: load, GPU,
  strays, the host's record), the agent already on every host (one untimed round first);
- ssh: ``ssh -F CONFIG nodeK true`` to every host at once (N processes started together,
  waited for all), with the same ssh_config.

All hosts share this machine's CPUs. Everything it creates is removed at exit.

    sudo .venv/bin/python bench/hosts.py [--hosts 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "e2e")]

from sshhosts import create_hosts, missing_requirements  # noqa: E402


def write_inventory(env, path: str) -> str:
    lines = ["transport: ssh", "defaults:", "  python: %s" % env.python,
             "  workdir: ~/bench-hosts", "hosts:"]
    for h in env.hosts:
        lines += ["  - name: %s" % h.name, "    ssh: %s" % h.name, "    addr: %s" % h.addr]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def rankdeck_once(inv: str, home: str) -> float:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "console", "hosts", "-i", inv], cwd=REPO,
                         env=dict(os.environ, HOME=home, PYTHONPATH=REPO),
                         capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError("rankdeck hosts failed (%d): %s %s" % (out.returncode, out.stdout,
                                                                 out.stderr))
    return elapsed


def ssh_once(env) -> float:
    started = time.monotonic()
    procs = [subprocess.Popen(["ssh", "-F", env.ssh_config, name, "true"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for name in env.names]
    codes = [p.wait() for p in procs]
    elapsed = time.monotonic() - started
    if any(codes):
        raise RuntimeError("ssh failed: %s" % [p.stderr.read() for p in procs])
    return elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    reason = missing_requirements()
    if reason:
        print("skipped: %s" % reason)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs
    env = create_hosts(args.hosts)
    home = tempfile.mkdtemp(prefix="bench-hosts-")
    try:
        os.makedirs(os.path.join(home, ".ssh"))
        shutil.copy(env.ssh_config, os.path.join(home, ".ssh", "config"))
        inv = write_inventory(env, os.path.join(home, "hosts.yaml"))
        rankdeck_once(inv, home)  # the agent copied to every host, untimed
        ssh_once(env)
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(rankdeck_once(inv, home))
            theirs.append(ssh_once(env))
        r, s = statistics.median(ours), statistics.median(theirs)
        print("%d hosts, median of %d: rankdeck hosts %.2f s, parallel ssh true %.2f s, "
              "ratio %.2fx; %d CPUs, load average now %.1f"
              % (args.hosts, args.repeat, r, s, r / s, os.cpu_count(), os.getloadavg()[0]))
    finally:
        env.close()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
