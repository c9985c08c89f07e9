"""A Slurm time limit on a real Slurm: `submit --time 2 --signal-before 110 --requeue`. Before the
limit each node's supervisor asks the reference trainer for a checkpoint (its request file), the
first node requeues the job once it is complete, the ranks end while the job waits in the queue
and start again when it runs: the same run id, each node's restart counted, every rank resuming
from the requested checkpoint, every line shown once across the requeue."""

import collections
import re

from tests.cli import rankdeck
from tests.slurm.test_slurm_run import (PAIR, PREFIX, TIMEOUT, login,  # noqa: F401
                                        run_left_on_nodes, status)
from tests.spine.helpers import TINY, rank_log_files
from tests.waits import wait_for_sync

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.root]
SAVED = re.compile(r"checkpoint saved step=(\d+) ")


def test_before_its_limit_the_run_checkpoints_is_requeued_and_resumes_from_it(
        slurm, login, project, host_workdir):  # noqa: F811
    # two nodes: the first asks Slurm for the requeue, the other waits it out; both must
    # resume from the step both saved (each node is two torch imports, twice over here);
    # --signal-before 110: the line is 10 s into the job, about when the launch has started the
    # ranks (they read the request at their first step boundary), not 10 s after they step
    res = rankdeck("submit", "-i", login, "--nodes", str(PAIR), "--time", "2", "--signal-before",
                   "110", "--requeue", "--detach", "--skip-preflight", "--sync", str(project),
                   "--max-restarts", "0", "trainer/train.py", *TINY, "--steps", "100000",
                   "--ckpt-every", "0", check=True)
    run_id = res.stdout.split()[-1]
    job = re.search(r"submitted Slurm job (\d+)", res.stderr).group(1)
    try:  # (a status launches it, if it was still pending when submit returned)
        wait_for_sync(lambda: status(run_id).get("state") != "queued", TIMEOUT, "the launch")
        # once requeued, an administrator gives the job 5 minutes: its next run is not
        # requeued again while the test looks at it
        wait_for_sync(lambda: "Restarts=0" not in slurm.cmd(["scontrol", "show", "job", "-o",
                                                             job]), TIMEOUT,
                      lambda: "job %s requeued: %s" % (job, status(run_id)), every=0.5)
        slurm.cmd(["scontrol", "update", "JobId=" + job, "TimeLimit=5"])

        def let_it_run():
            """... and lets it run soon, once it waits: Slurm holds a requeued batch job about
            2 minutes (its BeginTime), Slurm's wait, not rankdeck's (the suite's time); the
            nodes then see it running again before some of them ever saw it queued. Not in the
            second of the requeue: each slurmd revoked the job's credential then, and takes
            every credential made in that second or before for the revoked one (`ctime <=
            revoked`, whole seconds), so a start then fails (`Killing non-startable batch
            JobId: Job credential revoked`, the job FAILED): Slurm's own hold is there for it."""
            state = slurm.job_state(job)
            if state == "PENDING" and not released:  # (once: each update moves it on)
                try:
                    released.append(slurm.cmd(["scontrol", "update", "JobId=" + job,
                                               "StartTime=now+2"]))
                except RuntimeError:  # (it started between the two: the next look says)
                    pass
            return state == "RUNNING"
        released = []
        wait_for_sync(let_it_run, TIMEOUT, lambda: "job %s running again: %s" % (
            job, slurm.cmd(["squeue", "-h", "--states=all", "-j", job, "-o", "%T %r %S"],
                           check=False)), every=1)

        def lines_on_nodes() -> list[str]:
            """What the ranks wrote, read on the nodes: a wait looks there before it asks
            `logs` (a rankdeck process, an SSH login and an srun to each node, every look)."""
            lines = []
            for node in slurm.nodes:
                for path in rank_log_files(slurm.hosts.local_path(node, host_workdir),
                                           run_id, node):
                    with open(path, errors="replace") as f:
                        lines += f.read().splitlines()
            return lines
        wait_for_sync(lambda: sum(bool(re.search(r"resumed step=\d+ ", ln))
                                  for ln in lines_on_nodes()) >= PAIR, TIMEOUT,
                      lambda: "every rank's resume in its file: %s" % lines_on_nodes()[-20:],
                      every=0.5)

        def resumed():
            lines = rankdeck("logs", run_id).stdout.splitlines()
            asked = [ln for ln in lines if "checkpoint requested: " in ln]
            saved = [int(m.group(1)) for m in map(SAVED.search, lines) if m]
            back = [ln for ln in lines if re.search(r"resumed step=\d+ ", ln)]
            return asked and saved and len(back) >= PAIR and (saved, back)
        def seen():
            st = status(run_id)
            nodes = [(n["name"], n["state"], n.get("cause"), n["restarts_used"],
                      (n.get("phase") or {}).get("text")) for n in st.get("nodes") or ()]
            tail = rankdeck("logs", run_id).stdout.splitlines()[-25:]
            return "every rank resumed after the requeue: %s %s\n%s" % (
                st.get("slurm"), nodes, "\n".join(tail))
        saved, back = wait_for_sync(resumed, TIMEOUT, seen)
        # every rank resumed from one step every node saved (asked for, or as the ranks ended)
        steps = {re.search(r"resumed step=(\d+) ", ln).group(1) for ln in back[:PAIR]}
        assert len(steps) == 1 and saved.count(int(steps.pop())) == PAIR, (saved, back)
        st = status(run_id)
        assert st["slurm"]["job"] == job and len(st["nodes"]) == PAIR and all(
            n["restarts_used"] >= 1 for n in st["nodes"]), st
        # every line each rank wrote, before and after the requeue, shown once by `logs`
        # (the files first: a line written after them may be shown, never one missing)
        written = collections.Counter()
        for node in slurm.nodes:
            for path in rank_log_files(slurm.hosts.local_path(node, host_workdir), run_id,
                                       node):
                with open(path, errors="replace") as f:
                    # whole lines only: the ranks still write
                    written.update((node, line) for line in f.read().split("\n")[:-1])
        shown = collections.Counter()
        for line in rankdeck("logs", run_id, check=True).stdout.splitlines():
            m = PREFIX.match(line)
            if m:
                shown[(m.group(1), m.group(3))] += 1
        assert written and {k: shown[k] for k in written} == dict(written)
        stop = rankdeck("stop", run_id, check=True)
        assert "Slurm job %s cancelled (rankdeck submitted it)" % job in stop.stdout
        wait_for_sync(lambda: not run_left_on_nodes(slurm), 60,
                      lambda: "nothing of the run left: %s" % run_left_on_nodes(slurm))
    finally:
        slurm.cmd(["scancel", job], check=False)
