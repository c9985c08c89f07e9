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

Then, in a job that already runs (``salloc --no-shell``, as ``launch --slurm`` is used), two
more figures, alternating the same way:

- RUNNING to the first rank's line in the view: by hand ``srun --jobid J --overlap --label
  ... torchrun ... train.py`` on the login host, until its output shows a rank's ``step=``
  line; rankdeck ``launch -i login.yaml --slurm J --no-tui --sync PROJECT train.py`` until
  the console prints one (``[node0 r0] step=...``);
- stop to nothing left: by hand ``scancel J`` (the job and everything in it), rankdeck
  ``rankdeck stop RUN`` (the job stays: it is the user's); both until no process of the
  login user is left on any node.

    sudo .venv/bin/python bench/slurm.py [--repeat 2] [--steps 100000] [--skip-submit]
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
from tests.slurm.test_slurm_run import run_left_on_nodes  # noqa: E402
from tests.spine.helpers import TINY, rank_log_files  # noqa: E402

STEP = re.compile(rb"^(\d+): step=", re.M)
VIEW_STEP = re.compile(r"^\[\S+ r\d+\] .*step=")  # a rank's line in the --no-tui view
HAND_STEP = re.compile(r"^\d+: step=")  # srun --label's


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


def first_line(proc, pattern, timeout: float = 300.0) -> None:
    """Read ``proc``'s output until a line matches ``pattern`` (RuntimeError if it ends)."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if pattern.search(line):
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError("no line like %s (exit %s)" % (pattern.pattern, proc.poll()))


def nothing_left(slurm) -> float:
    """Seconds until no process of the login user is left on any node."""
    start = time.monotonic()
    wait(lambda: not run_left_on_nodes(slurm), 120, every=0.1)
    return time.monotonic() - start


def hand_live(slurm, steps: int) -> tuple[float, float]:
    """srun of torchrun in a running job: (RUNNING to a rank's first line, scancel to
    nothing left)."""
    job = slurm.hold()
    addr = slurm.hosts[slurm.nodes[0]].addr
    run = ("srun --jobid %s --overlap -N 4 --ntasks-per-node=1 --label --unbuffered "
           "--chdir=$HOME/handproj %s -u -m torch.distributed.run --nnodes 4 --nproc-per-node 1 "
           "--rdzv-backend c10d --rdzv-endpoint %s:29556 --rdzv-id live trainer/train.py %s "
           "--steps %d" % (job, slurm.hosts.python, addr, " ".join(TINY), steps))
    start = time.monotonic()
    proc = subprocess.Popen(slurm.hosts.command_on(slurm.login, ["sh", "-c", run]), cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first_line(proc, HAND_STEP)
        first = time.monotonic() - start
        start = time.monotonic()
        slurm.cmd(["scancel", job])
        return first, time.monotonic() - start + nothing_left(slurm)
    finally:
        slurm.cmd(["scancel", job], check=False)
        proc.kill()
        proc.communicate(timeout=60)


def rankdeck_live(slurm, inventory: str, project: str, env: dict,
                  steps: int) -> tuple[float, float]:
    """``launch --slurm J --no-tui`` in a running job: (RUNNING to the first rank's line in
    the view, ``rankdeck stop`` to nothing left)."""
    job = slurm.hold()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "console", "launch", "-i", inventory,
                             "--slurm", job, "--no-tui", "--sync", project, "--max-restarts",
                             "0", "trainer/train.py", *TINY, "--steps", str(steps)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first_line(proc, VIEW_STEP)
        first = time.monotonic() - start
        runs = slurm.hosts.local_path(slurm.nodes[0], "~/benchproj/.rankdeck/runs")
        run_id = sorted(os.listdir(runs), key=lambda r: os.stat(os.path.join(runs, r)).st_mtime)[-1]
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "console", "stop", run_id], cwd=REPO, env=env,
                       capture_output=True, timeout=300, check=True)
        return first, time.monotonic() - start + nothing_left(slurm)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
        slurm.cmd(["scancel", job], check=False)
        wait(lambda: slurm.job_state(job) in ("", "CANCELLED", "COMPLETED"), 60)
        for node in slurm.nodes:
            shutil.rmtree(slurm.hosts.local_path(node, "~/benchproj/.rankdeck"),
                          ignore_errors=True)


def shq(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--skip-submit", action="store_true", help="only the figures in a running job")
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
            for i in range(0 if args.skip_submit else args.repeat):
                hand.append(by_hand(slurm, args.steps))
                ours.append(with_rankdeck(slurm, inventory, project, env, args.steps))
                print("round %d: by hand %.1f s, rankdeck %.1f s%s" % (
                    i + 1, hand[-1], ours[-1], " (cold: no agent on the nodes)" if i == 0
                    else ""), flush=True)
            if ours:
                warm = ours[1:] or ours
                print("submit to every rank stepping, 4 nodes: by hand %.1f s (best), rankdeck "
                      "%.1f s warm (best), %.1f s cold; ratio %.2f" % (
                          min(hand), min(warm), ours[0], min(warm) / min(hand)))
            hand, ours = [], []
            for i in range(args.repeat):
                hand.append(hand_live(slurm, args.steps))
                ours.append(rankdeck_live(slurm, inventory, project, env, args.steps))
                print("in a running job, round %d: first rank line by hand %.1f s, rankdeck "
                      "%.1f s; stop to nothing left by hand %.1f s, rankdeck %.1f s" % (
                          i + 1, hand[-1][0], ours[-1][0], hand[-1][1], ours[-1][1]),
                      flush=True)
            for what, at in (("RUNNING to the first rank's line", 0),
                             ("stop to nothing left", 1)):
                best_hand = min(h[at] for h in hand)
                best_ours = min(o[at] for o in ours)
                print("%s: by hand %.1f s (best), rankdeck %.1f s (best); ratio %.2f" % (
                    what, best_hand, best_ours, best_ours / best_hand))
        finally:
            slurm.close()
    finally:
        hosts.close()
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
