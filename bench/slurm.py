"""Slurm: from submit to every rank stepping, rankdeck against plain sbatch + srun by hand.

Builds the 4-node Slurm of tests/slurm (network-namespace hosts, one slurmd each, a login
host; root only) and times, ``--repeat`` times each, alternating:

- by hand: ``sbatch --wrap 'srun --label python -m torch.distributed.run ... train.py'`` on
  the login host, the trainer already on every node (copied beforehand, not timed: a shared
  filesystem's job);
- rankdeck: ``rankdeck submit -i login.yaml --nodes 4 --time 5 --sync PROJECT train.py`` from
  the laptop (the CLI, following with ``--no-tui``): the batch job, the agent and the project
  sent to every node through srun, preflight, supervisors, torchrun.

Both end when every rank's own output has a ``step=`` line (the hand run's srun output file,
rankdeck's rank logs on each node), read the same way; then the job is cancelled. The first
rankdeck round is cold (no agent on the nodes), the rest warm. The 2-core machine runs every
node: the absolute seconds are this machine's, the ratio is the number to keep.

    sudo .venv/bin/python bench/slurm.py [--repeat 2] [--steps 100000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "e2e")]

from sshhosts import create_hosts, missing_requirements  # noqa: E402
from tests.slurm.slurmcluster import create_cluster, missing_slurm  # noqa: E402
from tests.spine.helpers import TINY, rank_log_files  # noqa: E402

STEP = re.compile(rb"^(\d+): step=", re.M)


def wait(cond, timeout=300.0, every=0.2):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("nothing after %.0f s" % timeout)
        time.sleep(every)


def by_hand(slurm, steps: int) -> float:
    """sbatch + srun of torchrun on 4 nodes: seconds to every rank's first step."""
    addr = slurm.hosts[slurm.nodes[0]].addr
    run = ("srun --label --chdir=$HOME/handproj %s -m torch.distributed.run --nnodes 4 "
           "--nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint %s:29555 --rdzv-id hand "
           "trainer/train.py %s --steps %d" % (slurm.hosts.python, addr, " ".join(TINY), steps))
    start = time.monotonic()
    job = slurm.as_user("sbatch --parsable -N 4 --ntasks-per-node=1 -t 5 -J hand "
                        "-o '%%x-%%j.out' --chdir=$HOME --wrap %s" % shq(run)).strip()
    out = slurm.hosts.local_path(slurm.nodes[0], "~/hand-%s.out" % job)

    def stepping():
        try:
            with open(out, "rb") as f:
                return len(set(STEP.findall(f.read()))) == 4
        except OSError:
            return False
    try:
        wait(stepping)
        return time.monotonic() - start
    finally:
        slurm.cmd(["scancel", job], check=False)
        wait(lambda: slurm.job_state(job) in ("", "CANCELLED", "COMPLETED"), 60)


def with_rankdeck(slurm, inventory: str, project: str, env: dict, steps: int) -> float:
    """rankdeck submit (following, --no-tui): seconds to every rank's first step."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "console", "submit", "-i", inventory,
                             "--nodes", "4", "--time", "5", "--no-tui", "--sync", project,
                             "--max-restarts", "0", "trainer/train.py", *TINY, "--steps",
                             str(steps)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    job = None
    while job is None:  # (its first lines: warnings, if any, then the job)
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("rankdeck submit ended before it submitted (exit %s)"
                               % proc.wait())
        found = re.search(r"submitted Slurm job (\d+)", line)
        job = found.group(1) if found else None

    def stepping():
        found = 0
        for node in slurm.nodes:
            runs = slurm.hosts.local_path(node, "~/benchproj/.rankdeck/runs")
            for run_id in os.listdir(runs) if os.path.isdir(runs) else ():
                for path in rank_log_files(slurm.hosts.local_path(node, "~/benchproj"),
                                           run_id, node):
                    with open(path, "rb") as f:
                        found += b"\nstep=" in b"\n" + f.read()
        return found == 4
    try:
        wait(stepping)
        return time.monotonic() - start
    finally:
        slurm.cmd(["scancel", job], check=False)
        proc.terminate()
        proc.communicate(timeout=120)
        for node in slurm.nodes:  # the next round starts from no run folder
            shutil.rmtree(slurm.hosts.local_path(node, "~/benchproj/.rankdeck"),
                          ignore_errors=True)


def shq(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--steps", type=int, default=100000)
    args = p.parse_args()
    reason = missing_requirements() or missing_slurm()
    if reason:
        print("bench/slurm.py: %s" % reason, file=sys.stderr)
        return 2
    hosts = create_hosts(5)
    home = tempfile.mkdtemp(prefix="rankdeck-bench-home-")
    try:
        slurm = create_cluster(hosts, hosts.names[:4])
        try:
            for node in slurm.nodes:  # the hand run's trainer, where a shared disk would have it
                hosts.put_tree(node, os.path.join(REPO, "trainer"), "~/handproj/trainer")
            os.makedirs(os.path.join(home, ".ssh"))
            shutil.copy(hosts.ssh_config, os.path.join(home, ".ssh", "config"))
            project = os.path.join(home, "project")
            shutil.copytree(os.path.join(REPO, "trainer"), os.path.join(project, "trainer"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            inventory = os.path.join(home, "login.yaml")
            with open(inventory, "w") as f:
                f.write("transport: ssh\nhosts:\n  - name: login\n    ssh: %s\n    addr: %s\n"
                        "    python: %s\n    workdir: ~/benchproj\n" % (
                            slurm.login, hosts[slurm.login].addr, hosts.python))
            env = dict(os.environ, HOME=home, PYTHONPATH=REPO)
            env.pop("SSH_AUTH_SOCK", None)
            hand, ours = [], []
            for i in range(args.repeat):
                hand.append(by_hand(slurm, args.steps))
                ours.append(with_rankdeck(slurm, inventory, project, env, args.steps))
                print("round %d: by hand %.1f s, rankdeck %.1f s%s" % (
                    i + 1, hand[-1], ours[-1], " (cold: no agent on the nodes)" if i == 0
                    else ""), flush=True)
            warm = ours[1:] or ours
            print("submit to every rank stepping, 4 nodes: by hand %.1f s (best), rankdeck "
                  "%.1f s warm (best), %.1f s cold; ratio %.2f" % (
                      min(hand), min(warm), ours[0], min(warm) / min(hand)))
        finally:
            slurm.close()
    finally:
        hosts.close()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
