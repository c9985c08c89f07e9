"""rankdeck on a ``ProctrackType=proctrack/cgroup`` Slurm (most GPU sites), real parts only
(the ``slurm_cgroup`` cluster: Slurm 22.05's cgroup/v1 plugin): the launch warns, a run lives
while its console is attached, because its supervisors sit in the cgroup of the console's
``serve`` step; a console that goes away takes the run with it, and ``status`` then says the
run failed, its supervisors lost; a ``--detach``ed launch, which would die the same way, is
refused with nothing started (docs/SLURM.md, "``proctrack/cgroup`` sites"). When a long-lived
step holds the supervisors (the plan there), the refusal is the part of this test to change."""

import os
import re
import subprocess
import sys

import pytest

from console.slurm import CGROUP_WARNING
from tests.slurm.slurmcluster import SlurmCluster
from tests.slurm.test_slurm_run import (REPO, TIMEOUT, login_inventory, rankdeck,
                                        run_left_on_nodes, status, stepping)
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


def test_a_run_lives_while_attached_a_detached_one_is_refused_and_nothing_is_left(
        slurm_cgroup, clean_home, tmp_path, host_workdir, project):
    slurm = slurm_cgroup
    login = login_inventory(slurm, clean_home, tmp_path, host_workdir)
    job = slurm.hold()
    out_path = tmp_path / "attached.out"
    attached = None
    try:
        # attached: the launch warns, from the site's real `scontrol show config`, and trains
        with open(out_path, "w") as out:
            attached = subprocess.Popen(
                [sys.executable, "-m", "console", "launch", "-i", login, "--slurm", job,
                 "--no-tui", "--sync", str(project), "--max-restarts", "0", "trainer/train.py",
                 *TINY, "--steps", "5000"], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        started = wait_for_sync(lambda: re.search(r"\[rankdeck\] run (\S+) started",
                                                  out_path.read_text()), TIMEOUT,
                                lambda: "the launch: %s" % out_path.read_text()[-2000:])
        run_id = started.group(1)
        runs_dir = os.path.join(slurm.hosts.local_path(slurm.nodes[0], host_workdir),
                                ".rankdeck", "runs")
        assert CGROUP_WARNING in out_path.read_text()
        wait_for_sync(lambda: stepping(status(run_id)) == 4, TIMEOUT,
                      lambda: "every rank stepping: %s" % status(run_id))
        # why it lives only so long: the node's supervisor is in the console's serve step's
        # cgroup (it left the step's process tree, not its cgroup)
        state = os.path.join(node_dir(slurm.hosts.local_path(slurm.nodes[0], host_workdir),
                                      run_id, slurm.nodes[0]), "state.json")
        cgroup = freezer_cgroup(int(re.search(r'"pid": (\d+)', open(state).read()).group(1)))
        step = re.fullmatch(r"/slurm_%s/uid_\d+/job_%s/step_(\d+)" % (slurm.nodes[0], job),
                            cgroup)
        assert step and "%s.%s rankdeck-agent" % (job, step.group(1)) in slurm.steps(job), \
            (cgroup, slurm.steps(job))
        # the laptop goes away (the console killed): its serve steps end, and with them the
        # run; `status` then says the run failed, every node's supervisor lost
        attached.kill()
        attached.wait()
        nothing_left(slurm, job)
        st = status(run_id)
        assert st["state"] == "failed", st
        assert [n["state"] for n in st["nodes"]] == ["lost"] * 4, st
        stop = rankdeck("stop", run_id)  # nothing to kill: said so, and nothing left
        assert "Slurm job %s: no step of rankdeck left" % job in stop.stdout, stop.stdout
        nothing_left(slurm, job)

        # a --detach'ed run would die the same way as the launch returns: refused, exit 2,
        # nothing started
        before = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
        res = rankdeck("launch", "-i", login, "--slurm", job, "--detach", "--sync",
                       str(project), "trainer/train.py", *TINY, check=False)
        assert res.returncode == 2 and "--detach: this Slurm tracks a step's processes by " \
            "cgroup" in res.stderr and "Nothing was started" in res.stderr, res.stderr
        assert set(os.listdir(runs_dir)) == before
        nothing_left(slurm, job)
        # submit --requeue, the same: refused before any job is submitted
        jobs = slurm.cmd(["squeue", "-h", "-o", "%i"])
        res = rankdeck("submit", "-i", login, "--nodes", "4", "--time", "2", "--signal-before",
                       "60", "--requeue", "trainer/train.py", *TINY, check=False)
        assert res.returncode == 2 and "--requeue: this Slurm" in res.stderr, res.stderr
        assert slurm.cmd(["squeue", "-h", "-o", "%i"]) == jobs
    finally:
        if attached is not None and attached.poll() is None:
            attached.kill()
            attached.wait()
        slurm.cmd(["scancel", job], check=False)
