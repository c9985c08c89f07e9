"""A node's run on this host: its folder, its state, the environments of what it starts.

`serve` answers ``state``, ``runs`` and ``record`` with these functions: the node's
``state.json`` plus whether its supervisor still lives. Starting, stopping and restarting
that supervisor: agent/node/ops.py; a cordoned node's fence: agent/node/fence.py.
"""

import os
import signal

from ..host import procs
from ..wire import protocol
from ..host.paths import host_path
from ..wire.protocol import RequestError
from ..host.runfiles import file_id, read_json
from ..wire.version import HERE

AGENT_PARENT = os.path.dirname(HERE)
LIVE_STATES = ("starting", "held", "running", "restarting", "stopping")
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
    agent/torchrun/frhook.py)."""
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


def run_folder(run_root):
    """``run_root`` on this host when it is a run folder, ``<workdir>/.rankdeck/runs/<run id>``
    (console/launch/spec.py ``run_root``); RequestError (``usage``) otherwise."""
    path = host_path(run_root) if isinstance(run_root, str) and run_root else ""
    runs = os.path.dirname(path)
    if not (protocol.run_id_ok(os.path.basename(path)) and os.path.basename(runs) == "runs"
            and os.path.basename(os.path.dirname(runs)) == ".rankdeck"):
        raise RequestError("not a run folder (<workdir>/.rankdeck/runs/<run id>): %r"
                           % (str(run_root)[:200],), "usage")
    return path


def read_only_args(args):
    """A read-only connection's request (agent/serve/server.py): its ``run_root`` a run folder,
    its ``node`` one folder's name (RequestError ``usage`` otherwise), and its ``python``
    dropped: nothing it names runs (py-spy is looked for on PATH only)."""
    if not isinstance(args, dict):
        return args
    if "run_root" in args:
        run_folder(args["run_root"])
    name = args.get("node", "node")
    if not (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
            and "/" not in name and "\0" not in name):
        raise RequestError("not a node's name: %r" % (str(name)[:80],), "usage")
    return {k: v for k, v in args.items() if k != "python"}


# What serve asks of a live supervisor by a signal (SIGUSR1 restart, SIGUSR2 put a spare in)
# it first writes into the node's folder: a signal with no such word is no request. On a Slurm
# proctrack/cgroup site (agent/slurm/host_step.py) `sbatch --signal=USR1@90` and `scancel
# --signal` reach every process of the job's steps, the supervisors among them; every node
# restarted at once was the result.


def asked_path(ndir, sig):
    return os.path.join(ndir, "asked.%s" % signal.Signals(sig).name)


def ask_by_signal(ndir, sig):
    """serve's word that the ``sig`` it is about to send the node's supervisor is a request."""
    os.close(os.open(asked_path(ndir, sig), os.O_WRONLY | os.O_CREAT, 0o600))


def take_asked(ndir, sig):
    """Whether serve asked for ``sig`` (its word taken: one request, one signal)."""
    try:
        os.unlink(asked_path(ndir, sig))
        return True
    except OSError:
        return False


def supervisor_alive(state):
    return bool(state) and procs.alive(state.get("pid", -1), state.get("starttime"))


def node_state(ndir, seen=None):
    """state.json plus whether its supervisor still lives (``alive``); None without one.

    ``seen``: a dict the caller keeps between calls (``serve`` asks four times a second):
    state.json is read and parsed again only when its inode, time or size changed (the
    supervisor replaces it whole: agent/host/runfiles.py ``write_json_atomic``); its supervisor's
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


def state_of(args):
    """The node's state plus the size of its journal. ``missing`` when its state.json cannot
    be read (never started, or its run folder was removed), then with what is known: whether
    its folder is there (``folder``) and how many processes of the node still run on this
    host (``procs``: marked ``RANKDECK_RUN=<run_id>/<node>``, agent/host/procs.py, or its
    supervisor starting, which names the folder), so a console can tell a node being started
    from one nothing of which is left."""
    ndir = node_dir(args)
    out = node_state(ndir)
    if out is None:
        run_id = os.path.basename(os.path.normpath(host_path(args["run_root"])))
        marker = procs.run_marker(run_id, args["node"])
        running = procs.table()
        out = {"state": "missing", "folder": os.path.isdir(ndir), "procs": len(
            set(procs.marked(marker, running)) | set(procs.naming(ndir, running)))}
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
