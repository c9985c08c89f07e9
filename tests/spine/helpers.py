"""Helpers for runs of the reference trainer on local nodes (real torchrun, CPU, gloo)."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections import defaultdict
from types import SimpleNamespace

from agent.host import procs
from agent.wire.protocol import text_to_bytes
from inventory.model import Inventory
from tests import local_nodes
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(REPO, "trainer", "train.py")
# The interpreter the hosts run the agent, torchrun and the trainer with. Default: the
# console's own. bench/compat.py sets RANKDECK_TEST_HOST_PYTHON to one venv per torch version
# (docs/COMPAT.md) while pytest and the console stay on the project's environment.
# Unset, local inventories leave `python:` empty as before (the console's own interpreter).
HOST_PYTHON_OVERRIDE = os.environ.get("RANKDECK_TEST_HOST_PYTHON", "")
HOST_PYTHON = HOST_PYTHON_OVERRIDE or sys.executable
ENDED = ("succeeded", "failed", "stopped")  # a run in one of these needs no stop
# A tiny model: a step is milliseconds, so the run's time is torch's start-up.
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--synthetic-samples", "2048", "--pg-timeout", "30"]


def local_inventory(workdir, n=4) -> Inventory:
    """``n`` local nodes sharing ``workdir`` (made: preflight refuses a missing one), their
    interpreter the hosts' (HOST_PYTHON_OVERRIDE)."""
    os.makedirs(str(workdir), exist_ok=True)
    return local_nodes.local_inventory(workdir, n, python=HOST_PYTHON_OVERRIDE)


def node_dir(workdir, run_id, node) -> str:
    return os.path.join(str(workdir), ".rankdeck", "runs", run_id, node)


def rank_log_files(workdir, run_id, node) -> list[str]:
    """Every per-rank file of ``node``: torchrun's (and accelerate's) stdout/stderr.log, or
    DeepSpeed's ``<time>_rank<R>.log`` (docs/LAUNCHERS.md)."""
    base = os.path.join(node_dir(workdir, run_id, node), "torchrun")
    out = []
    for root, _dirs, files in os.walk(base):
        for name in files:
            if name in ("stdout.log", "stderr.log") or re.search(r"_rank\d+\.log$", name):
                out.append(os.path.join(root, name))
    return sorted(out)


def collect_lines(ctl):
    """{(node, path): [(offset, bytes)]}: every line batch the controller's state takes in."""
    got = defaultdict(list)
    ctl.state.line_listeners.append(
        lambda b: got[(b.node, b.path)].append((b.offset, text_to_bytes(b.text))))
    return got


def assert_arrived_once(got, node: str, path: str) -> None:
    """The lines of ``path`` on ``node`` arrived in order, none skipped, none twice, and
    together are the file as it is on disk."""
    with open(path, "rb") as f:
        on_disk = f.read()
    chunks = got.get((node, path), [])
    offset = 0
    for start, data in chunks:
        assert start == offset, (path, start, offset)
        offset += len(data)
    assert b"".join(d for _o, d in chunks) == on_disk, path


def processes_of(run_id: str) -> list[tuple[int, str]]:
    """Every live process whose command line or rankdeck marker names the run."""
    found = []
    for pid in procs.all_pids():
        if pid == os.getpid():
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        info = procs.stat(pid)
        if info is None or info.state == "Z":
            continue
        env = procs.environ(pid)
        if run_id in cmd or env.get(procs.MARKER, "").startswith(run_id + "/"):
            found.append((pid, cmd))
    return found


def all_ended(run_id: str, timeout: float = 60) -> None:
    """After a stop: every process of the run ends (the supervisors may take a moment)."""
    wait_for_sync(lambda: not processes_of(run_id), timeout,
                  lambda: "every process of the run to end: %s" % processes_of(run_id),
                  every=0.5)


async def wind_down(ctl) -> list[tuple[int, str]]:
    """A test's teardown of its run: stop what still runs, close the controller, then kill
    every process of the run still alive (never leave a run behind, even when the test
    failed). Returns what was left before that kill, for the test to assert empty.

    Leftovers usually mean a stop that reported success while a worker or torchrun lived on.
    """
    try:
        if (any(link.stream is not None for link in ctl.links.values())
                and ctl.state.run_state() not in ENDED):
            await ctl.stop()
    finally:
        await ctl.close()
        left = processes_of(ctl.run_id)
        for pid, _cmd in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return left


async def watched(ctl, watch, *args) -> SimpleNamespace:
    """One run of a module's shared runs, watched by ``watch(ctl, got, *args)`` (which
    records on ``got`` what its test reads) and wound down; ``got.error``: the watch's
    failure, kept for the test that reads this run to raise (:func:`outcome`), ``got.left``:
    its processes alive after its wind-down."""
    got = SimpleNamespace(error=None, left=None)
    try:
        await watch(ctl, got, *args)
    except Exception as e:  # noqa: BLE001 - raised again by the test that reads this run
        got.error = e
    finally:
        got.left = await wind_down(ctl)  # never leave a run behind
    return got


def outcome(run: SimpleNamespace) -> SimpleNamespace:
    """A :func:`watched` run, its watch's failure raised in the test that reads it."""
    if run.error is not None:
        raise run.error
    return run
