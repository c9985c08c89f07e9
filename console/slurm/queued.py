"""``submit --detach`` of a job that waits in the queue: the run id at once, the launch later.

While the job is pending there is no node to start anything on, and the launch needs what only
the user's shell has (the inventory's secrets, the folder ``--sync`` sends). So the launch
happens where the console is: the submit's options are kept in a small file beside the run
records (``queued/RUN.json``, 0600), and a follower started by the submit (a process of its
own on this machine, console/verbs/slurm_follower.py, its output in ``queued/RUN.log``) waits
for the job and launches the run in it under that run id, as ``submit`` would have
(docs/SLURM.md). Should the follower be gone (the machine restarted), the next ``rankdeck
status``, ``attach`` or ``watch`` of the run does the same: still pending, it says why in
Slurm's words; running, it launches.

No ``--env`` value is written to that file (a value may be a secret the inventory does not
name, as the run record keeps none either: console/launch/env.py): it keeps the names alone.
The follower gets the values from the submit through its stdin, a pipe; a ``status`` or
``attach`` that launches reads each again from this shell's variable of that name, and
refuses, naming it, when it is not exported (:func:`launch_env`). Whoever comes first launches, once: the launch holds ``queued/RUN.lock``.
``stop`` of a run still queued cancels its job.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys

from inventory.loader import load_inventory
from ..records.history import History, state_dir
from ..errors import UsageError
from ..launch.options import parse_env
from .slurm import TRANSPORT_PREFIX, JOB_ENDS, job_now, login_host
from .submit import cancel, pending_line, wait_running
from ..launch.spec import new_run_id
from ..transport import make_transport


def queued_path(run_id: str, ext: str = ".json") -> str:
    """The queued run's file beside the run records: its options (``.json``), its launch
    lock (``.lock``), its follower's output (``.log``)."""
    return os.path.join(os.path.dirname(state_dir()), "queued", run_id + ext)


def keep(args, job: str, script: str, inventory_path: str) -> str:
    """The queued run's id; its options kept for the launch (paths made absolute; of
    ``--env``, the names alone: ``env_names``)."""
    run_id = new_run_id()
    options = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool,
                                                                     list, type(None)))}
    options.update(inventory=inventory_path, detach=True, slurm=job, env=[],
                   env_names=sorted(parse_env(getattr(args, "env", None) or [])),
                   sync=os.path.abspath(args.sync) if args.sync else None)
    path = queued_path(run_id)
    os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"run_id": run_id, "job": job, "script": script, "options": options}, f)
    return run_id


def queued(run_id: str) -> dict | None:
    """The queued run ``run_id`` (not launched yet), or None."""
    try:
        with open(queued_path(os.path.basename(run_id))) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mark_submitted(job: str, script: str) -> None:
    """The run record in ``job`` keeps that rankdeck submitted it (``stop`` cancels it)."""
    history = History()
    for record in history.list():
        if record.get("transport") == TRANSPORT_PREFIX + job:
            record["slurm_submitted"] = {"job": job, "script": script}
            history.save(record)


@contextlib.contextmanager
def launch_lock(run_id: str):
    """``queued/RUN.lock`` held: one launch (or stop) of a queued run at a time; whoever
    waited looks again and finds it launched."""
    path = queued_path(os.path.basename(run_id), ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def forget(run_id: str) -> None:
    """The queued run's files gone (launched or stopped; under its lock)."""
    for path in (queued_path(os.path.basename(run_id), ext) for ext in (".json", ".lock")):
        with contextlib.suppress(OSError):
            os.unlink(path)


def launch_env(entry: dict, given: dict | None = None) -> list[str]:
    """The queued run's ``--env`` as the launch takes it (``NAME=VALUE``): each kept name's
    value from ``given`` (the follower's, from the submit), else this shell's variable of
    that name; UsageError naming those that are neither (nothing is launched)."""
    options = entry["options"]
    if "env_names" not in options:  # (a file of an earlier version kept the values)
        return list(options.get("env") or ())
    given = given or {}
    values = {n: given[n] if n in given else os.environ.get(n) for n in options["env_names"]}
    missing = [n for n, v in values.items() if v is None]
    if missing:
        raise UsageError(
            "run %s: --env %s %s never written to disk while its Slurm job waits; export %s "
            "in this shell (the value%s for the run) and run it again, or `rankdeck stop %s`"
            % (entry["run_id"], ", ".join(missing), "is" if len(missing) == 1 else "are",
               " ".join(missing), "" if len(missing) == 1 else "s", entry["run_id"]))
    return ["%s=%s" % (n, v) for n, v in values.items()]


def start_follower(run_id: str, env_values: dict | None = None) -> int:
    """The follower of a queued run (console/verbs/slurm_follower.py): a process of its own, in a
    session of its own (a closed terminal does not end it), its output in ``queued/RUN.log``
    (0600); ``env_values``, the submit's ``--env`` values, handed over on its stdin (a pipe:
    never on disk, nor in its environment). Its pid."""
    log = queued_path(run_id, ".log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    environ = dict(os.environ)
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # console's parent
    environ["PYTHONPATH"] = top + (os.pathsep + environ["PYTHONPATH"]
                                   if environ.get("PYTHONPATH") else "")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "console.verbs.slurm_follower", run_id],
                                stdin=subprocess.PIPE, stdout=fd, stderr=fd, env=environ,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    try:
        proc.stdin.write(json.dumps({"env": dict(env_values or {})}).encode())
        proc.stdin.close()
    except OSError:  # (it died at once: its log says why; status launches instead)
        pass
    return proc.pid


async def follow(run_id: str, launch, wait: bool = False,
                 env: dict | None = None) -> dict | None:
    """A queued run's state now: ``{"run_id", "state": "queued"|..., "slurm"}`` while its job
    waits (``wait``: until it runs, saying each change on stderr) or ended before it ran;
    None once it is launched now (``launch(args)``: `launch --slurm JOB` under ``run_id``,
    its ``--env`` values from ``env`` or this shell: :func:`launch_env`), launched by another
    (the follower, another shell), or when it is no queued run."""
    entry = queued(run_id)
    if entry is None:
        return None
    if wait:  # (not under the lock: a status meanwhile answers at once)
        launch_env(entry, env)  # a value missing: said now, not once the job runs
        transport = make_transport(TRANSPORT_PREFIX + entry["job"])
        try:
            await wait_running(transport, login_host(load_inventory(
                entry["options"]["inventory"])), entry["job"],
                lambda line: print("rankdeck: " + line, file=sys.stderr, flush=True))
        finally:
            await transport.close()
    with launch_lock(run_id):
        entry = queued(run_id)  # (launched by whoever held the lock before)
        if entry is None:
            return None
        options = entry["options"]
        transport = make_transport(TRANSPORT_PREFIX + entry["job"])
        try:
            now = await job_now(transport, login_host(load_inventory(options["inventory"])),
                                entry["job"])
            if now["state"] != "RUNNING":
                ended = now["state"] not in ("PENDING", "CONFIGURING", "UNKNOWN")
                return {"run_id": entry["run_id"], "state": JOB_ENDS.get(now["state"],
                                                                         "stopped")
                        if ended else "queued", "slurm": dict(now, pending=pending_line(now))}
        finally:
            await transport.close()
        args = argparse.Namespace(**options)
        args.env = launch_env(entry, env)
        args.run_id_given = entry["run_id"]
        with contextlib.redirect_stdout(sys.stderr):  # (its run id: the caller prints its own)
            await launch(args)
        mark_submitted(entry["job"], entry["script"])
        forget(entry["run_id"])
    return None


async def stop(run_id: str) -> str | None:
    """``stop`` of a queued run: its job cancelled, the run forgotten; None for no such run
    (a launch under way is waited for: then it is a run like any other)."""
    if queued(run_id) is None:
        return None
    with launch_lock(run_id):
        entry = queued(run_id)
        if entry is None:
            return None
        transport = make_transport(TRANSPORT_PREFIX + entry["job"])
        try:
            said = await cancel(transport, login_host(load_inventory(
                entry["options"]["inventory"])), entry["job"])
        finally:
            await transport.close()
        forget(entry["run_id"])
    return said + "; run %s never started" % entry["run_id"]
