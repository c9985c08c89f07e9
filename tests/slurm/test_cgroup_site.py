"""rankdeck on a ``ProctrackType=proctrack/cgroup`` Slurm (most GPU sites), real parts only
(the ``slurm_cgroup`` cluster: Slurm 22.05's cgroup/v1 plugin). There a step's processes die
with it, so the run's supervisors live in the job's ``rankdeck-host`` step (agent/slurm/host_step.py),
not in the console's ``serve`` steps: a ``--detach``ed run goes on once the console's steps
ended (a console killed, a closed laptop, end its steps the same way), and ``stop`` leaves
nothing, no step either; ``--requeue`` is refused (docs/SLURM.md,
"``proctrack/cgroup`` sites")."""

import os
import re

import pytest

from console.slurm.slurm import CGROUP_WARNING
from tests.cli import rankdeck
from tests.slurm.slurmcluster import SlurmCluster
from tests.slurm.test_slurm_run import (PAIR, TIMEOUT, login_inventory, run_left_on_nodes,
                                        status)
from tests.spine.helpers import TINY, node_dir
from tests.waits import wait_for_sync

pytestmark = [pytest.mark.e2e, pytest.mark.root]


def freezer_cgroup(pid: int) -> str:
    """The process's cgroup in the freezer hierarchy (the one proctrack/cgroup kills by)."""
    with open("/proc/%d/cgroup" % pid) as f:
        return next(line.split(":", 2)[2] for line in f.read().splitlines()
                    if line.split(":")[1] == "freezer")


def nothing_left(slurm: SlurmCluster, job: str) -> None:
    wait_for_sync(lambda: not run_left_on_nodes(slurm) and not slurm.steps(job), 60,
                  lambda: "nothing of the run left: %s, steps %s"
                  % (run_left_on_nodes(slurm), slurm.steps(job)))


def steps_now(run_id: str) -> dict:
    """{rank: step} of the run now."""
    return {r["rank"]: r.get("step") or 0 for n in status(run_id).get("nodes") or ()
            for r in n.get("ranks") or ()}


def goes_on(run_id: str) -> None:
    """Every rank steps past where the furthest was when this was called."""
    past = max(steps_now(run_id).values() or [0]) + 3
    wait_for_sync(lambda: len(steps_now(run_id)) == PAIR and min(steps_now(run_id).values())
                  >= past, TIMEOUT, lambda: "every rank past step %d: %s" % (
                      past, status(run_id)))


def test_a_detached_run_lives_in_the_rankdeck_host_step_and_stop_leaves_nothing(
        slurm_cgroup, clean_home, tmp_path, host_workdir, project):
    slurm = slurm_cgroup
    login = login_inventory(slurm, clean_home, tmp_path, host_workdir)
    job = slurm.hold(PAIR)  # the first node (the judge's) and another: each in its step
    try:
        first = slurm.nodes_of(job)[0]
        # detached: the launch says, from the site's real `scontrol show config`, where the
        # run lives; the console's serve steps end as it returns, and the run trains on
        res = rankdeck("launch", "-i", login, "--slurm", job, "--detach", "--skip-preflight",
                       "--sync", str(project), "--max-restarts", "0", "trainer/train.py", *TINY,
                       "--steps", "5000", check=True)
        assert CGROUP_WARNING in res.stderr
        run_id = res.stdout.split()[-1]
        wait_for_sync(lambda: not [s for s in slurm.steps(job) if "rankdeck-agent" in s], 60,
                      lambda: "the console's steps ended: %s" % slurm.steps(job))
        goes_on(run_id)
        assert status(run_id)["state"] == "running"
        # the node's supervisor is in the cgroup of the job's rankdeck-host step, not in a
        # console's serve step's
        state = os.path.join(node_dir(slurm.hosts.local_path(first, host_workdir),
                                      run_id, first), "state.json")
        pid = int(re.search(r'"pid": (\d+)', open(state).read()).group(1))  # the node's pid
        cgroup = freezer_cgroup(slurm.hosts.pid_here(first, pid))
        step = re.fullmatch(r"/slurm_%s/uid_\d+/job_%s/step_(\d+)" % (first, job),
                            cgroup)
        assert step and "%s.%s rankdeck-host" % (job, step.group(1)) in slurm.steps(job), \
            (cgroup, slurm.steps(job))
        # stop: nothing of the run left on any node, no step (the hosts end once idle)
        assert "no step of rankdeck left" in rankdeck("stop", run_id, check=True).stdout
        nothing_left(slurm, job)

        # --requeue: a requeue ends the steps that hold the run, and nothing starts them
        # again yet: refused before any job is submitted
        jobs = slurm.cmd(["squeue", "-h", "-o", "%i"])
        res = rankdeck("submit", "-i", login, "--nodes", "4", "--time", "2", "--signal-before",
                       "60", "--requeue", "trainer/train.py", *TINY)
        assert res.returncode == 2 and "--requeue: this Slurm" in res.stderr, res.stderr
        assert "Nothing was started" in res.stderr
        assert slurm.cmd(["squeue", "-h", "-o", "%i"]) == jobs
    finally:
        slurm.cmd(["scancel", job], check=False)
