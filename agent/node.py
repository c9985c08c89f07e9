"""A node's run on this host: its folder, its state, and its supervisor's lifecycle.

`serve` answers ``start``, ``stop``, ``restart``, ``state`` and ``runs`` with these functions;
the run itself belongs to the node's supervisor (agent/supervisor.py), which this module
starts detached and then only signals: SIGTERM stops the node, SIGUSR1 restarts torchrun.
Every answer is the node's ``state.json`` plus whether its supervisor still lives.
"""

import json
import os
import signal
import sys
import threading
import time

from . import expel, host_step, procs, protocol, spare_hold, static_world
from .hostpaths import host_path, host_spec
from .protocol import RequestError
from .runfiles import file_id, log_tail, read_json, write_json_atomic, write_text
from .version import HERE

AGENT_PARENT = os.path.dirname(HERE)
SPAWN_TIMEOUT = 30.0
LIVE_STATES = ("starting", "held", "running", "restarting", "stopping")
STOP_END = "stop-end.json"  # how the next stop ends the node: a `stop` request's `end`
FENCE = "fenced.json"  # a cordoned node (docs/SURGERY.md): no start or restart until unfenced
# a spare's start spec under --auto-cordon (docs/SURGERY.md): the run's judge starts the spare
# from it with no console; it holds the run's env, secrets included, so 0600 and removed once
# the spare starts or is fenced
STANDBY = "standby.json"
DEFAULT_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when a run does not say (--grace)
JOB_UMASK = None  # the login's umask, for torchrun and the job (see keep_files_private)


def keep_files_private():
    """umask 077 for this process (serve) and what it starts: run folders, state, journals and
    logs are the user's alone. The login's umask is kept for torchrun and the job, whose
    outputs (checkpoints in a shared folder, say) are theirs to share (docs/SECURITY.md)."""
    global JOB_UMASK
    JOB_UMASK = os.umask(0o077)


def agent_env():
    """This environment with the agent importable: for the processes it starts (the
    supervisor, the rendezvous store) from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = AGENT_PARENT + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def job_env():
    """This environment for the job (torchrun and its workers): the agent's folder taken off
    PYTHONPATH, where :func:`agent_env` (and the SSH bootstrap, for serve's children) put it.
    Left there, rankdeck's ``agent`` package would shadow a training package of that name;
    the job's path is the login's (the flight-recorder hook has a folder of its own:
    agent/frhook.py)."""
    env = dict(os.environ)
    ours = os.path.realpath(AGENT_PARENT)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if not p or os.path.realpath(p) != ours]
    if any(kept):
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


def node_dir(args):
    """The node's run folder named by a request's ``run_root`` and ``node``."""
    return os.path.join(host_path(args["run_root"]), args["node"])


def supervisor_alive(state):
    return bool(state) and procs.alive(state.get("pid", -1), state.get("starttime"))


def node_state(ndir, seen=None):
    """state.json plus whether its supervisor still lives (``alive``); None without one.

    ``seen``: a dict the caller keeps between calls (``serve`` asks four times a second):
    state.json is read and parsed again only when its inode, time or size changed (the
    supervisor replaces it whole: agent/runfiles.py ``write_json_atomic``); its supervisor's
    life is looked at every time."""
    path = os.path.join(ndir, "state.json")
    if seen is None:
        state = read_json(path)
    else:
        key = file_id(path)
        if key is None or seen.get("key") != key:
            seen["key"], seen["state"] = key, read_json(path)
        state = dict(seen["state"]) if isinstance(seen["state"], dict) else seen["state"]
    if state is None:
        return None
    state["alive"] = supervisor_alive(state)
    if not state["alive"] and state.get("state") in LIVE_STATES:
        # The supervisor died without recording an end (SIGKILL, host reboot).
        state["state"] = "lost"
    return state


def spawn_supervisor(ndir, spec):
    """Start the node's supervisor detached, hand it the spec, wait until it has launched.

    Raises RequestError: ``agent`` when the supervisor died first (usually means a broken
    spec or an unwritable run folder; its log tail is in the message), ``timeout``.
    """
    os.makedirs(os.path.join(ndir, "torchrun"), 0o700, exist_ok=True)
    spec = prepared(ndir, spec)
    if spec.get("hostfile") is not None:  # DeepSpeed's, named by --hostfile in the argv
        write_text(os.path.join(ndir, "hostfile"), str(spec["hostfile"]))
    env = agent_env()
    before = read_json(os.path.join(ndir, "state.json"), {}) or {}
    # The spec (with secrets) goes through the pipe: never a file, never a command line. On
    # a proctrack/cgroup Slurm site the job's rankdeck-host step starts it (agent/host_step.py)
    proc = host_step.spawn([sys.executable, "-m", "agent", "supervisor", ndir],
                           protocol.encode(spec), None, env, ndir)
    deadline = time.monotonic() + SPAWN_TIMEOUT
    while time.monotonic() < deadline:
        state = node_state(ndir)
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
    if JOB_UMASK is not None:
        spec["job_umask"] = JOB_UMASK
    spec.setdefault("log_dir", os.path.join(ndir, "torchrun"))
    return spec


def signal_and_wait(ndir, sig, done, timeout):
    """Signal the node's supervisor and wait until ``done(old_state, new_state)``."""
    state = node_state(ndir)
    if not state:
        raise RequestError("no such run or node here: %s" % ndir, "missing")
    if not state["alive"]:
        return state
    # through a pidfd: the supervisor may have ended (and its pid gone to another process)
    # since node_state looked
    if not procs.send_signal(state["pid"], state.get("starttime"), sig):
        return node_state(ndir) or state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = node_state(ndir)
        if now and done(state, now):
            return now
        time.sleep(0.05)
    raise RequestError("node did not finish within %d s; state %s"
                       % (timeout, (node_state(ndir) or {}).get("state")), "timeout")


def refuse_if_fenced(ndir):
    """RequestError ``fenced`` when an operator cordoned this node: nothing of the run may
    start here again (not a restart, not the judge's --on-hang restart) until `uncordon`."""
    fence = read_json(os.path.join(ndir, FENCE))
    if fence is not None:
        raise RequestError("node %s is cordoned (%s); `rankdeck uncordon` makes it a spare "
                           "again" % (os.path.basename(ndir), fence.get("why") or "by an "
                                      "operator"), "fenced")


def fence(args):
    """Cordon the node: fence it first (no start or restart from now on), then stop it and
    confirm none of its processes is left, as :func:`stop` does, nor GPU memory held by them
    (``gpu``, :func:`gpu_words`). ``fence``: who and why; ``grace``: seconds between SIGTERM
    and SIGKILL (default: the run's --grace; 0 for a node judged hung, which cannot save).
    ``member``: its torchrun in the c10d rendezvous (:func:`expel.member`), or None."""
    ndir = node_dir(args)
    os.makedirs(ndir, 0o700, exist_ok=True)
    mark_fenced(ndir, args.get("fence") or {})
    drop_standby(ndir)
    before = node_state(ndir)
    if before is None:  # a spare that never ran: fenced, nothing to stop
        return {"state": "missing", "left": [], "fenced": True, "gpu": "nothing ran"}
    # who its torchrun is in the rendezvous, read before the kill: once the stop confirms it
    # dead, the store takes it out on its behalf (agent/expel.py)
    member = expel.member(before.get("torchrun_pid")) if before["alive"] else None
    done = stop(dict(args, end=fenced_end((args.get("fence") or {}).get("why"),
                                          args.get("grace"), 300)))
    kill = done.get("kill") if isinstance(done.get("kill"), dict) else {}
    # the supervisor's stop checks the GPU (agent/supervisor.py gpu_after_kill); one that had
    # ended before left its own end's report, which says nothing of now
    gpu = gpu_words(kill.get("gpu")) if before["alive"] else "not checked (its supervisor " \
        "had ended before the fence)"
    return dict(done, fenced=True, gpu=gpu, member=member)


def drop_workers(args):
    """A cordon of a hung node, on another node of the run: its workers, stalled in a
    collective with the hung node's ranks, are SIGKILLed; its torchrun stays and starts them
    again in the rendezvous round the spare joins (a failed worker group, counted against
    --max-restarts as the failure they meet in that collective is). Left alone, they fail
    only once the hung node is gone, and end only after their interpreter's teardown (2-4 s
    on a loaded 2-core host, docs/SURGERY.md). ``killed``: their pids. Refused (``fenced``)
    on a cordoned node; nothing to do on a node whose torchrun is not running."""
    ndir = node_dir(args)
    refuse_if_fenced(ndir)
    state = node_state(ndir)
    if not state or not state["alive"] or not isinstance(state.get("torchrun_pid"), int):
        return {"killed": []}
    # torchrun's own children that carry the run's marker (only theirs read): a pid
    # state.json names that has gone and been reused has no child of the run
    table = procs.table()
    below = {p: table[p] for p in procs.descendants(state["torchrun_pid"], table)}
    mine = procs.marked(procs.run_marker(state.get("run_id"), state.get("node")), below)
    killed = sorted(p for p in mine if procs.signal_process(table[p], signal.SIGKILL))
    return {"killed": killed}


def mark_fenced(ndir, fence):
    """The node fenced (``fence``: who, why): from now on no start or restart (a console's,
    the judge's) runs it (:func:`refuse_if_fenced`)."""
    write_json_atomic(os.path.join(ndir, FENCE), dict(fence, at=time.time()))


def fenced_end(why, grace, limit):
    """How a fenced node's stop ends it (read by its supervisor, STOP_END): ``stopped`` with
    ``why`` (cut to ``limit``) as its cause; ``grace`` 0 (a node judged hung, which cannot
    save): SIGKILL at once."""
    return {"state": "stopped", "grace": grace,
            "cause": {"message": str(why)[:limit]} if why else None}


def gpu_words(gpu):
    """The GPU check of a node's stop (agent/supervisor.py ``gpu_after_kill``), in words:
    ``freed``, ``held: N MiB by pid(s) ...`` or ``no GPU`` (no NVML per-process figures on
    the host: no GPU, or nvidia-smi only)."""
    if not isinstance(gpu, dict):
        return "no GPU"
    held = gpu.get("held") if isinstance(gpu.get("held"), int) else 0
    if not held:
        return "freed"
    pids = [p for p in gpu.get("pids") or [] if isinstance(p, int)]
    return "held: %d MiB by pid(s) %s" % (held >> 20, ",".join(str(p) for p in pids))


def standby(args):
    """``launch --auto-cordon``: keep the spare's start ``spec`` in its run folder (0600) so
    the run's judge on this host can start it in a cordoned node's place without a console
    (agent/judge_cordon.py). The login's umask for the job goes with it, as a start's does."""
    ndir = node_dir(args)
    refuse_if_fenced(ndir)
    os.makedirs(ndir, 0o700, exist_ok=True)
    spec = dict(args["spec"])
    if JOB_UMASK is not None:
        spec["job_umask"] = JOB_UMASK
    path = os.path.join(ndir, STANDBY)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    # 0600 from its first byte, whatever this process's umask (the env's secrets are in it)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(spec, f)
    os.replace(tmp, path)
    return {"standby": True}


def drop_standby(ndir):
    """The spare's kept spec goes (it started, or it is fenced): no secret stays on disk."""
    try:
        os.unlink(os.path.join(ndir, STANDBY))
    except OSError:
        pass


def unfence(args):
    """`uncordon`: the node may start again (as a spare); its old run folder stays."""
    path = os.path.join(node_dir(args), FENCE)
    was = os.path.exists(path)
    if was:
        os.unlink(path)
    return {"unfenced": was}


def start(args):
    """Start the node's run; refused (``conflict``) while a supervisor of it lives, and
    (``fenced``) on a cordoned node. A warm spare (``spec.hold``: agent/spare_hold.py) starts
    held; a start of a held spare puts it in (:func:`put_in`)."""
    ndir = node_dir(args)
    refuse_if_fenced(ndir)
    state = node_state(ndir)
    if state and state["alive"] and state.get("state") == "held" and \
            not args["spec"].get("hold"):
        released = put_in(ndir, state, args["spec"])
        if released is not None:
            drop_standby(ndir)
            return released
        state = node_state(ndir)
    if state and state["alive"]:
        raise RequestError("node %s of run %s is already running (supervisor pid %s)"
                           % (args["node"], state.get("run_id"), state.get("pid")),
                           "conflict")
    if isinstance(args.get("record"), dict):  # for `watch -i` from another laptop (record_of)
        os.makedirs(ndir, 0o700, exist_ok=True)
        write_json_atomic(os.path.join(ndir, RECORD), args["record"])
        os.chmod(os.path.join(ndir, RECORD), 0o600)
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


def stop(args):
    """Stop the node's run and confirm none of its processes is left (``left``)."""
    ndir = node_dir(args)
    timeout = float(args.get("timeout", 90))
    end = os.path.join(ndir, STOP_END)
    if isinstance(args.get("end"), dict):  # read by the supervisor on SIGTERM (stop_end)
        write_json_atomic(end, args["end"])
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
    (a static world's restart, agent/static_world.py). ``member``: the old torchrun in the
    c10d rendezvous, once it is gone (:func:`expel.member`), or None."""
    ndir = node_dir(args)
    refuse_if_fenced(ndir)
    port = args.get("master_port")
    try:
        port = None if port is None else static_world.master_port(port)
    except ValueError as exc:
        raise RequestError(str(exc), "usage")
    state = node_state(ndir)
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
            # rendezvous (agent/expel.py): the new one's round need not wait for it to expire
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


def state_of(args):
    """The node's state plus the size of its journal (``missing`` when never started)."""
    ndir = node_dir(args)
    out = node_state(ndir) or {"state": "missing"}
    try:
        out["journal_size"] = os.path.getsize(os.path.join(ndir, "journal"))
    except OSError:
        out["journal_size"] = 0
    return out


RECORD = "record.json"  # the run's record as the launching laptop kept it, no secret values
RECORD_MAX = 1 << 20


def record_of(args):
    """The record of run ``run_id`` under ``runs_dir`` that the launching console left on this
    host (``start``'s ``record``), for a console on another laptop (`rankdeck watch RUN -i`).
    ``missing`` when no node of that run here has one (a run from an older rankdeck, or a
    run folder of another login)."""
    run_id = args.get("run_id")
    if not protocol.run_id_ok(run_id):
        raise RequestError("not a run id: %r" % (str(run_id)[:40],), "usage")
    root = os.path.join(host_path(args["runs_dir"]), run_id)
    try:
        nodes = sorted(os.listdir(root))
    except OSError:
        nodes = []
    for name in nodes:
        path = os.path.join(root, name, RECORD)
        try:
            if os.path.getsize(path) > RECORD_MAX:
                continue
        except OSError:
            continue
        record = read_json(path)
        if isinstance(record, dict):
            return {"record": record, "node": name}
    raise RequestError("no record of run %s under %s on this host" % (run_id, root), "missing")


def runs(args):
    """Every run under ``runs_dir`` with each node's state."""
    root = host_path(args["runs_dir"])
    out = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return {"runs": []}
    for run_id in names:
        nodes = {}
        for node in sorted(os.listdir(os.path.join(root, run_id))):
            st = node_state(os.path.join(root, run_id, node))
            if st:
                nodes[node] = st.get("state")
        out.append({"run_id": run_id, "nodes": nodes})
    return {"runs": out}
