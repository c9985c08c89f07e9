"""The follower of a queued run: ``python -m console.verbs.slurm_follower RUN``, started by
``submit --detach`` when its job waits in the queue (console/slurm/queued.py).

It waits for the job to run (``squeue`` on the login host every few seconds, over one
connection) and launches the run in it under its run id, as the next ``rankdeck status`` would
have, then ends; it ends too once the run is launched by another (a ``status``, an
``attach``), stopped, or its job ended before it ran. A login host out of reach is tried again
a minute later. Its output goes to ``queued/RUN.log`` beside the run records. The submit's
``--env`` values come on its stdin (:func:`given_env`), never from a file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from .cli import COMMANDS
from ..errors import LaunchError, UsageError
from ..slurm.queued import follow, queued
from ..transport.base import HostUnreachable

RETRY_S = 60.0


def say(line: str) -> None:
    print("%s %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), line), file=sys.stderr, flush=True)


def given_env(stream=None) -> dict:
    """The ``--env`` values the submit wrote to this process's stdin (``{"env": {NAME:
    VALUE}}``, then end of file); {} when none came (a follower started by hand)."""
    stream = sys.stdin if stream is None else stream
    if stream is None or stream.isatty():
        return {}
    try:
        env = json.loads(stream.read() or "{}").get("env") or {}
    except (ValueError, AttributeError, OSError):
        return {}
    if not isinstance(env, dict):
        return {}
    return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}


def main(argv: list[str]) -> int:
    run_id = argv[0]
    env = given_env()
    say("following queued run %s" % run_id)
    while queued(run_id) is not None:
        try:
            state = asyncio.run(follow(run_id, COMMANDS["launch"], wait=True, env=env))
        except HostUnreachable as exc:
            say("cannot reach the login host (%s); trying again in %d s" % (exc, RETRY_S))
            time.sleep(RETRY_S)
            continue
        except LaunchError as exc:  # the job ended before it ran, or the launch failed
            say("rankdeck: %s" % exc)
            return exc.code
        except UsageError as exc:  # an --env value it was not given (started by hand)
            say("rankdeck: %s" % exc)
            return 2
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
