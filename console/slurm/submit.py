"""``rankdeck submit``: a batch job that holds nodes, followed while it waits, then a run in it.

The sbatch script (:func:`batch_script`, shown by ``--dry-run``) only holds the allocation;
rankdeck starts its agents in it as in ``launch --slurm`` (console/slurm/slurm.py) once Slurm runs
it. While it is pending the console says so in words, with Slurm's reason and the expected
start (:func:`pending_line`). A run rankdeck submitted ends its job: when a followed run ends,
and on ``rankdeck stop`` (the record's ``slurm_submitted``).
"""

from __future__ import annotations

import asyncio
import re

from ..errors import EXIT_FAILED, LaunchError, UsageError
from .slurm import JOB_ALIVE, job_now, said

JOB_NAME = "rankdeck-submit"
TIME = re.compile(r"(\d+-)?\d+(:\d\d){0,2}", re.ASCII)
# a partition's name, or several joined by commas: nothing else reaches the batch script (a
# newline in it would add lines of shell there)
PARTITION = re.compile(r"[A-Za-z0-9_.,-]+")
REASONS = {
    "Resources": "waiting for free nodes",
    "Priority": "other jobs are ahead of it",
    "Dependency": "waiting for the jobs it depends on",
    "JobHeldUser": "held by you (scontrol release JOB)",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "not before its begin time",
    "ReqNodeNotAvail": "the nodes it needs are not available (down, drained or reserved)",
    "PartitionTimeLimit": "its --time is over the partition's limit: it will never start",
    "PartitionNodeLimit": "more nodes than the partition allows: it will never start",
    "Reservation": "waiting for its reservation",
}


def batch_script(nodes: int, time_limit: str, partition: str | None = None,
                 gpus_per_node: int | None = None, requeue: bool = False) -> str:
    """The sbatch script that holds ``nodes`` nodes for ``time_limit`` (``requeue``: a job
    Slurm may put back in the queue, as rankdeck's ``--requeue`` asks before its limit).
    Every value written into it is checked first (the counts are numbers, ``--time`` Slurm's
    time, ``--partition`` names of PARTITION's characters): UsageError (exit 2) otherwise."""
    if not TIME.fullmatch(time_limit):
        raise UsageError("--time %r: write Slurm's time, e.g. 00:30:00, 90 (minutes) or "
                         "1-00:00:00" % time_limit)
    if partition is not None and not PARTITION.fullmatch(partition):
        raise UsageError("--partition %r: a partition's name has only letters, digits and "
                         "_ . - (several: joined by commas, e.g. gpu,gpu-long); nothing was "
                         "submitted" % partition)
    if not isinstance(nodes, int) or not isinstance(gpus_per_node, (int, type(None))):
        raise UsageError("--nodes and --gpus-per-node are whole numbers")
    lines = ["#!/bin/sh", "#SBATCH --job-name=" + JOB_NAME, "#SBATCH --nodes=%d" % nodes,
             "#SBATCH --ntasks-per-node=1", "#SBATCH --time=" + time_limit,
             "#SBATCH --output=/dev/null"]
    if partition:
        lines.append("#SBATCH --partition=" + partition)
    if gpus_per_node:
        lines.append("#SBATCH --gpus-per-node=%d" % gpus_per_node)
    if requeue:
        lines.append("#SBATCH --requeue")
    lines += ["# Written by `rankdeck submit`: this job only holds the nodes. rankdeck starts its",
              "# agents as steps of it (srun --jobid --overlap) once it runs. The run's judge on",
              "# the hosts ends it once the run is over (scancel --batch --signal): USR1 when the",
              "# run succeeded (the job COMPLETED), USR2 when it failed or stopped (FAILED);",
              "# `rankdeck stop` cancels it; else it ends at its time limit.",
              "# (the sleep killed too: a process left behind outlives the job on some sites)",
              "trap 'kill $! 2>/dev/null; exit 0' USR1",
              "trap 'kill $! 2>/dev/null; exit 1' USR2",
              "while :; do sleep 3600 & wait $!; done"]
    return "\n".join(lines) + "\n"


def pending_line(job: dict, start: str = "") -> str:
    """``Slurm job 12 PENDING: waiting for free nodes (Resources); expected start ...``, made
    safe to print (one line, no escape sequence: console/lines/sanitize.py ``one_line``)."""
    reason = job.get("reason") or ""
    words = REASONS.get(reason)
    if words is None and reason.startswith(("QOS", "AssocGrp", "AssocMax")):
        words = "over a quota or limit of your account"
    text = "Slurm job %s %s" % (job["job"], job["state"])
    if reason:
        text += ": %s (%s)" % (words, reason) if words else ": %s" % reason
    if start and start not in ("N/A", "Unknown"):
        text += "; expected start %s" % start
    return said(text, 1000)  # (Slurm's words are the login host's: untrusted)


async def submit(transport, login, script: str) -> str:
    """``sbatch --parsable`` of ``script`` on the login host; the job id."""
    code, out, err = await transport.on_login(login, ["sbatch", "--parsable"], input=script)
    job = out.strip().split(";")[0]
    if code != 0 or not job.isdigit():
        raise LaunchError("sbatch on the login host refused the job: %s"
                          % (said(err or out) or "exit %s" % code), EXIT_FAILED)
    return job


async def wait_running(transport, login, job: str, say, every: float = 2.0) -> None:
    """Until ``job`` runs, ``say`` each new state/reason line; LaunchError if it ends first."""
    last = None
    while True:
        now = await job_now(transport, login, job)
        if now["state"] == "RUNNING":
            return
        if now["state"] not in ("PENDING", "CONFIGURING", "UNKNOWN") \
                and now["state"] not in JOB_ALIVE:
            raise LaunchError("Slurm job %s ended before it ran: %s%s" % (
                job, now["state"], " (%s)" % now["reason"] if now["reason"] else ""),
                EXIT_FAILED)
        code, out, _ = await transport.on_login(login, ["squeue", "-h", "-j", job, "-o", "%S"])
        line = pending_line(now, said(out, 64) if code == 0 else "")
        if line != last:
            say(line)
            last = line
        await asyncio.sleep(every)


async def cancel(transport, login, job: str) -> str:
    code, _out, err = await transport.on_login(login, ["scancel", job])
    return ("Slurm job %s cancelled (rankdeck submitted it)" % job if code == 0
            else "could not cancel Slurm job %s: %s" % (job, said(err, 200)))
