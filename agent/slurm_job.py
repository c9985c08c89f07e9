"""The Slurm job that holds this node's run, watched so the run ends with it.

A run launched with ``--slurm`` (console/transport/slurm.py) starts its agents as steps of
the job, with ``RANKDECK_SLURM_JOB`` in their environment. When the job ends (``scancel``, its
time limit, a node failure) Slurm kills its steps, but with ``proctrack/linuxproc`` not the
supervisor, torchrun and workers, which left the step's process tree: the supervisor must end
them itself. :class:`JobWatch` asks ``squeue`` every few seconds; an answer it cannot read (no
``squeue`` on the node, the controller away) never ends the run.
"""

import os
import shutil
import subprocess
import time

JOB_ENV = "RANKDECK_SLURM_JOB"
EVERY_S = 5.0
ALIVE = ("RUNNING", "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT")


class JobWatch:
    """``ended()``: None while the job runs (or when it cannot tell), else why the run ends."""

    def __init__(self, job, squeue="squeue", every=EVERY_S):
        self.job = job
        self.squeue = squeue
        self.every = every
        self.last = 0.0

    @classmethod
    def from_env(cls, environ=None):
        """The watch for this process's job, or None outside a Slurm run (or no squeue)."""
        job = (environ if environ is not None else os.environ).get(JOB_ENV, "")
        squeue = shutil.which("squeue")
        if not job or squeue is None:
            return None
        return cls(job, squeue)

    def ended(self, now=None):
        now = time.monotonic() if now is None else now
        if now - self.last < self.every:
            return None
        self.last = now
        try:
            res = subprocess.run([self.squeue, "-h", "--states=all", "-j", self.job, "-o",
                                  "%T|%r"],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return job_end(self.job, res.returncode, res.stdout, res.stderr)


def job_end(job, code, out, err):
    """Why the run ends from one ``squeue -h --states=all -j JOB -o '%T|%r'`` answer, or None
    (alive, or an answer that says nothing: the controller busy or away)."""
    fields = (out.strip().splitlines() or [""])[0].split("|")
    state = fields[0].strip()
    if (code != 0 and "Invalid job id" in err) or (code == 0 and not state):
        return "Slurm job %s is over (no longer known to Slurm): the run ended with it" % job
    if code != 0 or state in ALIVE:
        return None
    reason = fields[1].strip() if len(fields) > 1 else ""
    how = {"CANCELLED": "was cancelled (scancel)", "TIMEOUT": "reached its time limit",
           "NODE_FAIL": "lost a node", "PREEMPTED": "was preempted",
           "COMPLETING": "is ending", "COMPLETED": "has ended"}.get(state, "is %s" % state)
    return "Slurm job %s %s%s: the run ended with it" % (
        job, how, " (%s)" % reason if reason and reason != "None" else "")
