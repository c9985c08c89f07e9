"""`rankdeck hosts`, host side: serve's ``hosts`` and ``kill_strays`` requests (docs/PROTOCOL.md).

``hosts`` answers what this host is doing and has been through: its load, its GPUs' memory and
who holds it, its **strays** (training processes that belong to no live rankdeck run here) and
its record of runs and incidents (agent/host/fleet.py; flagged by agent/rules/fleet.py).

A training process is torchrun itself (``torchrun``, ``-m torch.distributed.run`` or
``.launch``) or, for the login user's processes, whose environment can be read, a worker that
torchrun started (``LOCAL_RANK`` or ``TORCHELASTIC_*`` in it), and on a GPU host any process
holding GPU memory. Another user's process is seen only through /proc/PID/cmdline and status
(its user, pid, command, GPU memory). Ours are the live supervisors of the run folders under
``runs_dir`` (and any other rankdeck supervisor on the host) and every process below them; a
process that carries a run's marker but whose supervisor is gone is a stray (left behind). ``kill_strays`` stops only the login user's
strays, each named by pid and start time, so a pid reused since is never hit.
"""

import os
import pwd
import re

from ..host import fleet, procs
from ..host.gpu import GpuProbe
from ..host.paths import host_path
from ..node.folder import node_state
from ..rules import fleet as rules

MAX_STRAYS = 64
MAX_CMD = 300
GRACE = 5.0
TORCHRUN = re.compile(r"(^|/)torchrun$")
LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# a word of a command line whose value is a secret: --token=X, --api-key X, HF_TOKEN=X
_SECRETISH = re.compile(r"(token|key|secret|passw|auth|credential)", re.I)


def mask_argv(argv):
    """A command line as one string, secret-looking values masked, bounded."""
    out, hide_next = [], False
    for word in argv:
        if hide_next:
            out.append("****")
            hide_next = False
            continue
        name, eq, _value = word.partition("=")
        if eq and _SECRETISH.search(name):
            out.append(name + "=****")
        elif word.startswith("-") and _SECRETISH.search(word):
            out.append(word)
            hide_next = True
        else:
            out.append(word)
    text = " ".join(" ".join(out).split())
    return text if len(text) <= MAX_CMD else text[:MAX_CMD - 3] + "..."


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]


def owner(pid):
    """The real uid of ``pid`` (from /proc/PID/status), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return str(uid)


def is_launcher(argv):
    if not argv:
        return False
    if TORCHRUN.search(argv[0]) or (len(argv) > 1 and TORCHRUN.search(argv[1])
                                    and "python" in os.path.basename(argv[0])):
        return True
    return any(argv[i] == "-m" and argv[i + 1] in LAUNCH_MODULES for i in range(len(argv) - 1))


def is_worker(env):
    return "LOCAL_RANK" in env or any(k.startswith("TORCHELASTIC_") for k in env)


def supervisor_pids(table):
    """Pids of every rankdeck supervisor on this host (``python -m agent supervisor DIR``),
    whatever its workdir or user: a run of another inventory is no stray either."""
    out = []
    for pid in table:
        argv = cmdline(pid)
        if len(argv) >= 4 and argv[1:3] == ["-m", "agent"] and argv[3] == "supervisor":
            out.append(pid)
    return out


def ours(runs_dir, table):
    """Pids of the live rankdeck runs: each live supervisor (those of the run folders under
    ``runs_dir``, and any other rankdeck supervisor here) and all below it."""
    out = set()
    for pid in supervisor_pids(table):
        out.add(pid)
        out.update(procs.descendants(pid, table))
    try:
        run_ids = os.listdir(runs_dir)
    except OSError:
        return out
    for run_id in run_ids:
        try:
            nodes = os.listdir(os.path.join(runs_dir, run_id))
        except OSError:
            continue
        for name in nodes:
            state = node_state(os.path.join(runs_dir, run_id, name))
            if state and state.get("alive"):
                out.add(state["pid"])
                out.update(procs.descendants(state["pid"], table))
    return out


def gpu_memory(snapshot):
    """{pid: bytes of GPU memory} over every GPU of a snapshot."""
    held = {}
    for gpu in snapshot.get("gpus") or []:
        for entry in gpu.get("pid_mem") or []:
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], int):
                held[entry[0]] = held.get(entry[0], 0) + entry[1]
    return held


def strays(runs_dir, held=None):
    """The training processes on this host that belong to no live run under ``runs_dir``:
    ``[{"pid", "starttime", "user", "own", "cmd", "gpu_mem"}]``, at most MAX_STRAYS."""
    held = held or {}
    table = procs.table()
    mine = ours(runs_dir, table)
    me, skip = os.getuid(), {os.getpid(), os.getppid()}
    out = []
    for pid, info in sorted(table.items()):
        if pid in mine or pid in skip or info.state == "Z":
            continue
        argv = cmdline(pid)
        uid = owner(pid)
        own = uid == me
        training = is_launcher(argv) or pid in held or (own and is_worker(procs.environ(pid)))
        if not training or not argv:
            continue
        out.append({"pid": pid, "starttime": info.starttime, "user": user_name(uid),
                    "own": own, "cmd": mask_argv(argv), "gpu_mem": held.get(pid)})
        if len(out) >= MAX_STRAYS:
            break
    return out


def report(args):
    """serve's ``hosts``: ``{"hostname", "load", "cpus", "gpus", "strays", "runs",
    "incidents", "flagged", "record"}`` (docs/PROTOCOL.md)."""
    runs_dir = host_path(args["runs_dir"])
    gpus, held = [], {}
    if args.get("gpu", True):
        probe = GpuProbe()
        try:
            snap = probe.snapshot()
        finally:
            probe.close()
        held = gpu_memory(snap)
        gpus = [{"index": g.get("index"), "mem_used": g.get("mem_used"),
                 "mem_total": g.get("mem_total")} for g in snap.get("gpus") or []]
    record = fleet.read(runs_dir)
    judged = rules.judged(record["runs"])
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return dict(judged, record={"runs": record["runs"][-rules.KEEP_RUNS:]},
                hostname=os.uname().nodename, load=load, cpus=os.cpu_count(),
                gpus=gpus, strays=strays(runs_dir, held))


def kill_strays(args):
    """serve's ``kill_strays``: stop the login user's strays named in ``pids``
    (``[[pid, starttime], ...]``: those that are still strays now): SIGTERM, ``grace``
    seconds, SIGKILL, then checked gone. ``{"killed": [pid], "left": [pid], "refused":
    [{"pid", "why"}]}``."""
    runs_dir = host_path(args["runs_dir"])
    now = {s["pid"]: s for s in strays(runs_dir)}
    chosen, refused = {}, []
    for item in args.get("pids") or []:
        try:
            pid, start = int(item[0]), int(item[1])
        except (TypeError, ValueError, IndexError):
            continue
        found = now.get(pid)
        if found is None or found["starttime"] != start:
            refused.append({"pid": pid, "why": "not a stray now (gone, reused, or a live run's)"})
        elif not found["own"]:
            refused.append({"pid": pid, "why": "%s's process: not the login user's"
                            % found["user"]})
        else:
            chosen[pid] = start
    grace = min(max(float(args.get("grace", GRACE)), 0.0), 60.0)
    left = procs.stop_pids(chosen, grace)
    return {"killed": sorted(p for p in chosen if p not in left), "left": left,
            "refused": refused}
