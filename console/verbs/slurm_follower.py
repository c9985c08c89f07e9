"""The follower of a queued run: ``python -m console.verbs.slurm_follower RUN``, started by
``submit --detach`` when its job waits in the queue (console/slurm/queued.py).

It waits for the job to run (``squeue`` on the login host every few seconds, over one
connection) and launches the run in it under its run id, as the next ``rankdeck status`` would
have, then ends; it ends too once the run is launched by another (a ``status``, an
``attach``), stopped, or its job ended before it ran. A login host out of reach is tried again
a minute later. Its output goes to ``queued/RUN.log`` beside the run records.
"""

from __future__ import annotations

import asyncio
import sys
import time

from .cli import COMMANDS
from ..errors import LaunchError
from ..slurm.queued import follow, queued
from ..transport.base import HostUnreachable

RETRY_S = 60.0


def say(line: str) -> None:
    print("%s %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), line), file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    run_id = argv[0]
    say("following queued run %s" % run_id)
    while queued(run_id) is not None:
        try:
            state = asyncio.run(follow(run_id, COMMANDS["launch"], wait=True))
        except HostUnreachable as exc:
            say("cannot reach the login host (%s); trying again in %d s" % (exc, RETRY_S))
            time.sleep(RETRY_S)
            continue
        except LaunchError as exc:  # the job ended before it ran, or the launch failed
            say("rankdeck: %s" % exc)
            return exc.code
        if state is None:
            say("run %s launched (or launched by another console, or stopped)" % run_id)
            return 0
        if state["state"] != "queued":
            say("run %s: its job ended before it ran (%s)" % (run_id, state["state"]))
            return 1
    say("run %s is no longer queued" % run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
