"""A node's supervisor started, stopped and restarted (`serve`'s ``start``, ``stop`` and
``restart``): the run itself belongs to the node's supervisor (agent/supervisor/supervisor.py), which this
module starts detached and then only signals: SIGTERM stops the node, SIGUSR1 restarts
torchrun, SIGUSR2 puts a held spare in (each of these two with serve's word in the node's
folder first: agent/node/folder.py ``ask_by_signal``; the supervisor ignores one without).
Every answer is the node's ``state.json`` plus whether its supervisor still lives
(agent/node/folder.py ``node_state``). A fenced node (agent/node/fence.py) starts nothing.
"""

import os
import signal
import sys
import threading
import time

from ..surgery import expel, spare_hold, static_world
from ..slurm import host_step
from . import folder as node
from ..host import fleet, procs
from ..wire import protocol
from ..host.paths import host_spec
from .fence import drop_standby, refuse_if_fenced
from ..wire.protocol import RequestError
from ..host.runfiles import log_tail, read_json, write_json_atomic, write_text

SPAWN_TIMEOUT = 30.0
STOP_END = "stop-end.json"  # how the next stop ends the node: a `stop` request's `end`
DEFAULT_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when a run does not say (--grace)


def spawn_supervisor(ndir, spec):
    """Start the node's supervisor detached, hand it the spec, wait until it has launched.

    Raises RequestError: ``agent`` when the supervisor died first (usually means a broken
    spec or an unwritable run folder; its log tail is in the message), ``timeout``.
    """
    os.makedirs(os.path.join(ndir, "torchrun"), 0o700, exist_ok=True)
    spec = prepared(ndir, spec)
    if spec.get("hostfile") is not None:  # DeepSpeed's, named by --hostfile in the argv
        write_text(os.path.join(ndir, "hostfile"), str(spec["hostfile"]))
    env = node.agent_env()
    before = read_json(os.path.join(ndir, "state.json"), {}) or {}
    # The spec (with secrets) goes through the pipe: never a file, never a command line. On
    # a proctrack/cgroup Slurm site the job's rankdeck-host step starts it (agent/slurm/host_step.py)
    proc = host_step.spawn([sys.executable, "-m", "agent", "supervisor", ndir],
                           protocol.encode(spec), None, env, ndir)
    deadline = time.monotonic() + SPAWN_TIMEOUT
    while time.monotonic() < deadline:
        state = node.node_state(ndir)
        # launched: torchrun started, or a warm spare's held (its launch counts once put in;
        # it may have ended already: a run without a judge keeps no spare held)
        if state and state.get("pid") == proc.pid and (state.get("launches", 0) > before.get(
                "launches", 0) or (spec.get("hold") and state.get("state") != "starting")):
            threading.Thread(target=proc.wait, daemon=True).start()  # reap if it ends
            return state
        if proc.poll() is not None:
            raise RequestError("supervisor exited with code %s: %s" % (
                proc.returncode, log_tail(os.path.join(ndir, "supervisor.log"))), "agent")
        time.sleep(0.02)
    raise RequestError("supervisor did not report within %d s; see %s/supervisor.log"
                       % (SPAWN_TIMEOUT, ndir), "timeout")


def prepared(ndir, spec):
    """A start spec as the supervisor gets it: host paths expanded, the login's umask for the
    job, torchrun's log folder."""
    spec = host_spec(spec)
    if node.JOB_UMASK is not None:
        spec["job_umask"] = node.JOB_UMASK
    spec.setdefault("log_dir", os.path.join(ndir, "torchrun"))
    return spec


def signal_and_wait(ndir, sig, done, timeout):
    """Signal the node's supervisor and wait until ``done(old_state, new_state)``."""
    state = node.node_state(ndir)
    if not state:
        raise RequestError("no such run or node here: %s" % ndir, "missing")
    if not state["alive"]:
        return state
    if sig != signal.SIGTERM:  # a request, not a stray signal (agent/node/folder.py)
        node.ask_by_signal(ndir, sig)
    # through a pidfd: the supervisor may have ended (and its pid gone to another process)
    # since node_state looked
    if not procs.send_signal(state["pid"], state.get("starttime"), sig):
        node.take_asked(ndir, sig)
        return node.node_state(ndir) or state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = node.node_state(ndir)
        if now and done(state, now):
            return now
        time.sleep(0.05)
    raise RequestError("node did not finish within %d s; state %s"
                       % (timeout, (node.node_state(ndir) or {}).get("state")), "timeout")


def start(args):
    """Start the node's run; refused (``conflict``) while a supervisor of it lives, and
    (``fenced``) on a cordoned node. A warm spare (``spec.hold``: agent/surgery/spare_hold.py) starts
    held; a start of a held spare puts it in (:func:`put_in`)."""
    ndir = node.node_dir(args)
    refuse_if_fenced(ndir)
    state = node.node_state(ndir)
    if state and state["alive"] and state.get("state") == "held" and \
            not args["spec"].get("hold"):
        released = put_in(ndir, state, args["spec"])
        if released is not None:
            drop_standby(ndir)
            return released
        state = node.node_state(ndir)
    if state and state["alive"]:
        raise RequestError("node %s of run %s is already running (supervisor pid %s)"
                           % (args["node"], state.get("run_id"), state.get("pid")),
                           "conflict")
    if isinstance(args.get("record"), dict):  # for `watch -i` from another laptop (record_of)
        os.makedirs(ndir, 0o700, exist_ok=True)
        write_json_atomic(os.path.join(ndir, node.RECORD), args["record"])
        os.chmod(os.path.join(ndir, node.RECORD), 0o600)
    started = spawn_supervisor(ndir, args["spec"])
    if not args["spec"].get("hold"):  # (a held spare is still the judge's to put in)
        drop_standby(ndir)  # a spare put in by a console: the judge must not start it again
    return started


def put_in(ndir, state, spec):
    """A held spare's torchrun released into the run's rendezvous (SIGUSR2 to its supervisor)
    when ``spec`` is what it holds; the node's state then, or None when it is not the process
    asked for (another spec: it is stopped) or it ended meanwhile: the caller starts anew."""
    differ = spare_hold.differences(state.get("digest"), spare_hold.digest(
        prepared(ndir, spec), secret=state.get("secret_names") or ()))
    if differ:
        stop({"run_root": os.path.dirname(ndir), "node": os.path.basename(ndir),
              "end": {"state": "stopped", "cause": {
                  "message": "a cordon asked for another start spec than the one it held "
                  "(%s differ); it starts cold" % ", ".join(differ)[:300]}}})
        return None
    now = signal_and_wait(ndir, signal.SIGUSR2,
                          lambda old, new: new.get("state") != "held" or not new["alive"],
                          SPAWN_TIMEOUT)
    return now if now.get("alive") and now.get("state") == "running" else None


def stop(args, wait=True):
    """Stop the node's run and confirm none of its processes is left (``left``).

    ``wait`` False: the stop asked of the supervisor by its own link to the judge
    (agent/node/door.py), which cannot wait for its own end: the ``end`` is left for it and the
    node's state answered at once, nothing signalled; the link sends its process SIGTERM once
    it has answered, and the supervisor's last state says what the stop left."""
    ndir = node.node_dir(args)
    timeout = float(args.get("timeout", 90))
    end = os.path.join(ndir, STOP_END)
    if isinstance(args.get("end"), dict):  # read by the supervisor on SIGTERM (stop_end)
        write_json_atomic(end, args["end"])
    if not wait:
        state = node.node_state(ndir)
        if not state:
            raise RequestError("no such run or node here: %s" % ndir, "missing")
        return state
    try:
        state = signal_and_wait(ndir, signal.SIGTERM, lambda old, new: not new["alive"], timeout)
    finally:  # not read (no supervisor was alive): no later stop may take it
        if os.path.exists(end):
            os.unlink(end)
    # Belt and braces: anything still marked as this run's (the supervisor may have been
    # SIGKILLed earlier) is killed here, and what is left is reported.
    marker = procs.run_marker(state.get("run_id"), state.get("node"))
    report = procs.kill_run(None, marker, grace=float(state.get("grace", DEFAULT_GRACE)))
    state["left"] = procs.run_pids(None, marker)
    state["sweep"] = report
    return state


def restart(args):
    """Restart torchrun through a live supervisor, or start a new one from ``spec``; refused
    (``fenced``) on a cordoned node. ``master_port``: the launcher starts again on that port
    (a static world's restart, agent/surgery/static_world.py). ``member``: the old torchrun in the
    c10d rendezvous, once it is gone (:func:`expel.member`), or None."""
    ndir = node.node_dir(args)
    refuse_if_fenced(ndir)
    port = args.get("master_port")
    try:
        port = None if port is None else static_world.master_port(port)
    except ValueError as exc:
        raise RequestError(str(exc), "usage")
    if isinstance(args.get("named"), str):  # the judge's --on-hang restart: the host's record
        fleet.note_named(ndir, args["named"])
    state = node.node_state(ndir)
    if state and state["alive"]:
        member = expel.member(state.get("torchrun_pid"))  # the old torchrun, in the rendezvous
        if port is not None:  # read by the supervisor at this restart (take_master_port)
            static_world.leave_master_port(ndir, port)
        # done: the new torchrun started and the old one is gone (the supervisor starts the
        # new one as soon as the old workers are, and watches the old torchrun's exit)
        state = signal_and_wait(
            ndir, signal.SIGUSR1,
            lambda old, new: (new.get("launches", 0) > old.get("launches", 0)
                              and not new.get("exiting")) or not new["alive"],
            float(args.get("timeout", 90)))
        # a supervisor that ended just before the signal (its launcher gone on its own: a
        # static world's rank failing as another node's ranks are killed) starts anew below
        if state.get("alive") or not args.get("spec"):
            # ``member``: the old torchrun, gone now, for the store to take out of the
            # rendezvous (agent/surgery/expel.py): the new one's round need not wait for it to expire
            gone = member and not procs.alive(member["pid"])
            return dict(state, member=member if gone else None)
    if not args.get("spec"):
        raise RequestError("node %s is not running here; restart needs the run spec"
                           % args["node"], "missing")
    static_world.take_master_port(ndir)  # a new supervisor: its spec says the port
    spec = dict(args["spec"], restarted=True)
    if port is not None:
        spec["argv"] = static_world.with_master_port(spec.get("argv") or [], port)
    marker = procs.run_marker(spec["run_id"], args["node"])
    procs.kill_run(None, marker, grace=float(spec.get("grace", DEFAULT_GRACE)))
    return spawn_supervisor(ndir, spec)
