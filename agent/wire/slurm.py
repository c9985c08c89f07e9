"""What Slurm's ``squeue`` says, read the same on both sides: the job states in which a run
lives or waits, and ``%L`` (time left) in seconds. The agent's supervisors read it on the
nodes (agent/slurm/job.py), the console on the login host (console/slurm/slurm.py)."""

ALIVE = ("RUNNING", "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT")
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")  # a requeued job waits in them
# the start of the comment the run's judge gives a job rankdeck submitted as it ends it, the run
# over (agent/slurm/job.py release_job); status reads it (console/slurm/slurm.py with_job)
JUDGE_COMMENT = "rankdeck: its run's judge ended it:"


def seconds_left(text):
    """squeue's ``%L`` (``4:32``, ``1:02:03``, ``2-01:00:00``) in seconds; None for
    ``UNLIMITED``, ``NOT_SET`` or anything else."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 \
            or (days and not days.isdigit()):
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return seconds + int(days or 0) * 86400


def proctrack_cgroup(config):
    """Whether ``scontrol show config`` says ``ProctrackType = proctrack/cgroup`` (a step's
    processes are its cgroup's, killed when it ends: docs/SLURM.md)."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ProctrackType" and value.strip() == "proctrack/cgroup":
            return True
    return False
