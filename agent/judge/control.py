"""The run's judge from its host's side: start it beside the store, stop it, ask it (the
``judge_start``, ``judge_stop`` and ``judge`` requests of ``serve``, docs/PROTOCOL.md). The
judge itself is agent/judge/judge.py.

Standard library only; Python >= 3.9.
"""

import json
import os
import signal
import sys
import threading
import time

from ..slurm import host_step
from . import notify as judge_notify
from ..wire import judge as judge_wire
from ..host import detach, procs
from ..host.runfiles import read_json
from ..node.fence import drop_standbys


def judge_dir(run_root):
    return os.path.join(run_root, "judge")


def start_judge(run_root, spec, timeout=30.0):
    """Start the run's judge on this host (or return the running one's state): ``spec`` holds
    ``addr``, ``token``, ``nodes`` and the settings. The token is also kept in the run folder
    for the supervisors of this host (agent/wire/judge.py). Raises RuntimeError with the
    judge's log when it does not come up."""
    info = running_judge(run_root)
    if info:
        return info
    jdir = judge_dir(run_root)
    os.makedirs(jdir, 0o700, exist_ok=True)
    judge_wire.keep_token(run_root, spec["token"])
    from ..node.folder import agent_env  # here: node imports much the judge process does not need
    # the token and secrets through its stdin: never a command line (on a proctrack/cgroup
    # Slurm site the job's rankdeck-host step starts it: agent/slurm/host_step.py)
    info, proc = detach.start(
        [sys.executable, "-m", "agent", "judge", run_root], os.path.join(jdir, "state.json"),
        "the judge", data=json.dumps(spec).encode(), out=os.path.join(jdir, "judge.log"),
        env=agent_env(), cwd=jdir, timeout=timeout, spawn=host_step.spawn,
        ready=lambda info, proc: info.get("pid") == proc.pid and running_judge(run_root))
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped if it ends
    return running_judge(run_root) or info


def stop_judge(run_root, wait=judge_notify.TIMEOUT_S + 15):
    """End the run's judge on this host: SIGTERM (it says how the run ended and runs its last
    notifications), SIGKILL if it is still there after ``wait`` seconds; pids checked by
    start time (agent/host/procs.py). Then, judge or none, the spares' kept start specs on
    this host go (agent/node/fence.py ``standby``: the run's secrets are in them)."""
    try:
        return _stop_judge(run_root, wait)
    finally:
        drop_standbys(run_root)


def _stop_judge(run_root, wait):
    info = running_judge(run_root)
    if not info:
        return {"stopped": False}
    me = procs.stat(info["pid"])
    if me is None or me.starttime != info.get("starttime"):
        return {"stopped": False}
    procs.signal_process(me, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and procs.alive(info["pid"], info.get("starttime")):
        time.sleep(0.05)
    if procs.alive(info["pid"], info.get("starttime")):
        procs.signal_process(me, signal.SIGKILL)
    return {"stopped": True}


def ask_judge(run_root, op, timeout=60.0, args=None):
    """A console's request to the run's judge on this host (``why``: a fresh verdict;
    ``ping``; ``cordon`` with ``args``: node surgery); RuntimeError when there is no judge
    or it does not answer."""
    info = running_judge(run_root)
    token = judge_wire.read_token(run_root)
    if not info or not token:
        raise RuntimeError("no judge runs for this run on this host")
    try:
        answer = judge_wire.ask(info["addr"], info["port"], token, op, timeout, args)
    except (OSError, judge_wire.WireError) as exc:
        raise RuntimeError("the judge did not answer: %s" % exc)
    if not answer or not answer.get("ok"):
        raise RuntimeError("the judge did not answer %s" % op)
    return answer.get("data") or {}


def running_judge(run_root):
    """The judge's state.json if its process lives, else None."""
    info = read_json(os.path.join(judge_dir(run_root), "state.json"))
    if info and info.get("state") == "running" and procs.alive(info.get("pid", -1),
                                                                 info.get("starttime")):
        return info
    return None
