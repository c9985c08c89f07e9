"""``rankdeck stop`` of a Slurm run: what is left of it in its job, and the job rankdeck made.

After the nodes' supervisors stopped (console/run/control.py), :func:`after_stop` checks that no
step of rankdeck is left in the job (``squeue -s``) and cancels a job ``submit`` made. A job
back in the queue (requeued before its time limit, docs/SLURM.md) has no node to reach:
:func:`stop_queued` cancels it instead (or says how, for a job that is the user's), and each
node's supervisor, waiting for the job to run again, ends its part when it sees it cancelled.
A job that is over (the run's judge ended it with the run) has nothing left to stop.
"""

from __future__ import annotations

import sys

from ..errors import EXIT_FAILED, EXIT_OK
from ..records.history import inventory_from_record
from .slurm import JOB_ALIVE, JOB_QUEUED, job_now, job_of, steps_left
from .submit import cancel
from ..transport import make_transport


async def stop_queued(record: dict) -> int | None:
    """The exit code of a stop whose job waits in the queue or is over, or None when it runs
    (or the run is not a Slurm run): the stop goes to the nodes then."""
    job = job_of(record.get("transport", ""))
    if not job:
        return None
    transport = make_transport(record["transport"])
    login = inventory_from_record(record).hosts[0]
    try:
        now = await job_now(transport, login, job)
        if now["state"] not in JOB_QUEUED + JOB_ALIVE + ("UNKNOWN", "COMPLETING"):
            # over (the run's judge ended it with the run, scancel, its time limit): the
            # nodes are out of reach with it, and each node's supervisor ended its part
            print("Slurm job %s is over (%s): the run ended with it; nothing of it runs"
                  % (job, now["state"]))
            return EXIT_OK
        if now["state"] not in JOB_QUEUED:
            return None
        if not record.get("slurm_submitted"):
            print("rankdeck: Slurm job %s waits in the queue (%s): its nodes cannot be reached; "
                  "`scancel %s` ends it, and each node's supervisor then ends its part"
                  % (job, now["state"], job), file=sys.stderr)
            return EXIT_FAILED
        print("Slurm job %s waited in the queue (%s) to run the rest of the run: %s" % (
            job, now["state"], await cancel(transport, login, job)))
        return EXIT_OK
    finally:
        await transport.close()


async def after_stop(record: dict) -> int:
    """Once every node stopped: no step of rankdeck left in the job (else EXIT_FAILED, with
    the ``scancel`` that ends them), and the job cancelled when rankdeck submitted it."""
    job = job_of(record.get("transport", ""))
    transport = make_transport(record["transport"])
    login = inventory_from_record(record).hosts[0]
    try:
        left = await steps_left(transport, login, job)
        if left:
            print("rankdeck: Slurm job %s still has rankdeck's steps %s (squeue -s); "
                  "`scancel %s` ends them" % (job, ", ".join(left), " ".join(left)),
                  file=sys.stderr)
            return EXIT_FAILED
        print("Slurm job %s: %s" % (job, "no step of rankdeck left (squeue -s)" if left == []
                                    else "squeue did not answer; steps not checked"))
        if record.get("slurm_submitted"):  # rankdeck made the job: it ends it too
            print(await cancel(transport, login, job))
        return EXIT_OK
    finally:
        await transport.close()
