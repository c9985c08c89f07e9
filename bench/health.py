"""`rankdeck check --deep`: rounds and time to name a slow node at 4, 8 and 16 hosts, against
testing every pair; and a soak of healthy runs that must name nobody (docs/HEALTH.md).

For each size N: N SSH hosts in network namespaces on this machine (tests/e2e/sshhosts.py,
root only), the last host's link held to 50 Mbit/s both ways (``tc`` token bucket on both
ends of its veth), then one real ``rankdeck check --deep --json``. Printed per size: the
rounds (+ rechecks) against the N(N-1)/2 pairs of testing every pair, who was named, the
check's wall time, the rounds' own time (rank 0's probe, from its first round to its last),
and every pair's estimated time: one pair at a time, each as long as one of this check's
rounds (a round and a lone pair have the same time bound), so ratio = pairs / rounds.
``--simulate 16``: sizes from 16 up only planned (agent/rules/health.py), not measured.

    .venv/bin/python bench/health.py [--sizes 4,8,16] [--simulate 32]
    .venv/bin/python bench/health.py --soak 10        # 10 checks of 6 healthy hosts

Never a test: the machine's load moves the times; who is named is what must hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from agent.rules import health  # noqa: E402
from sshhosts import create_hosts  # noqa: E402

RATE = "50mbit"


def limit(hosts, name, add=True):
    verb = "add" if add else "del"
    shape = ["tbf", "rate", RATE, "burst", "64kb", "latency", "100ms"] if add else []
    hosts.run_in(name, ["tc", "qdisc", verb, "dev", "eth0", "root", *shape], check=True)
    subprocess.run(["tc", "qdisc", verb, "dev", hosts[name].veth, "root", *shape], check=True,
                   capture_output=True)


def check(hosts, folder):
    """One `check --deep --json` of ``hosts``: (wall s, its document)."""
    ssh = os.path.join(folder, ".ssh")
    os.makedirs(ssh, exist_ok=True)
    with open(hosts.ssh_config) as f, open(os.path.join(ssh, "config"), "w") as out:
        out.write(f.read())
    inv = os.path.join(folder, "hosts.yaml")
    with open(inv, "w") as f:
        f.write("transport: ssh\ndefaults:\n  python: %s\n  workdir: ~\nhosts:\n" % hosts.python)
        for h in hosts.hosts:
            f.write("  - name: %s\n    ssh: %s\n    addr: %s\n" % (h.name, h.name, h.addr))
    env = dict(os.environ, HOME=folder, PYTHONPATH=REPO)
    env.pop("SSH_AUTH_SOCK", None)
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "console", "check", "--deep", "--json", "-i",
                          inv], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=900)
    took = time.monotonic() - start
    try:
        return took, json.loads(res.stdout)
    except ValueError:
        raise SystemExit("check failed (%d): %s" % (res.returncode, res.stderr[-2000:]))


def one_size(n):
    hosts = create_hosts(n)
    try:
        slow = hosts.names[-1]
        limit(hosts, slow)
        with tempfile.TemporaryDirectory() as folder:
            took, doc = check(hosts, folder)
        net = doc["network"]
        if net.get("error"):
            print("%2d hosts: the network was not measured: %s %s"
                  % (n, net["error"], [x["problems"] for x in doc["nodes"]]), flush=True)
            return
        done = net["rounds"] + net["recheck_rounds"]
        per_round = (net.get("rounds_s") or 0) / max(done, 1)
        print("%2d hosts: %d rounds (+%d rechecks) vs %3d pairs (ratio %.1f); named %s "
              "(slow: %s); check %.1f s, rounds %.1f s; every pair ~%.0f s"
              % (n, net["rounds"], net["recheck_rounds"], net["every_pair"],
                 net["every_pair"] / max(done, 1), doc["suspects"], slow, took,
                 net.get("rounds_s") or 0, per_round * net["every_pair"]), flush=True)
    finally:
        hosts.close()


def soak(runs, n=6):
    hosts = create_hosts(n)
    named, times = [], []
    try:
        for i in range(runs):
            with tempfile.TemporaryDirectory() as folder:
                took, doc = check(hosts, folder)
            times.append(took)
            named.append(doc["suspects"])
            print("run %d: named %s in %.1f s" % (i + 1, doc["suspects"], took), flush=True)
    finally:
        hosts.close()
    bad = [x for x in named if x]
    print("soak: %d runs on %d healthy hosts, %d named somebody; %.1f-%.1f s a check"
          % (runs, n, len(bad), min(times), max(times)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--simulate", type=int, default=0,
                    help="sizes from this one up are only planned, not measured")
    ap.add_argument("--soak", type=int, default=0)
    args = ap.parse_args()
    if args.soak:
        soak(args.soak)
        return
    for n in [int(x) for x in args.sizes.split(",")]:
        if args.simulate and n >= args.simulate:
            plan = health.rounds(n)
            print("%2d hosts: %d rounds vs %d pairs (ratio %.1f), planned only"
                  % (n, len(plan), health.every_pair(n), health.every_pair(n) / len(plan)))
            continue
        one_size(n)


if __name__ == "__main__":
    main()
