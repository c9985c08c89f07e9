"""Processes of a run on this host: find them all, kill them all, confirm none is left.

Processes are found by ancestry and by a marker in their environment, never by name.
torchrun starts every worker in a session of its own (``start_new_session=True``), so
signalling torchrun's process group does not reach them, and SIGKILL of torchrun alone
orphans its workers. The supervisor therefore makes itself a child subreaper: orphans are
re-parented to it instead of init, and "every descendant of the supervisor" is the run.
The environment marker (``RANKDECK_RUN=<run_id>/<node>``) catches anything that escaped
even that (a process re-parented before the subreaper was set, say).
"""

import ctypes
import os
import signal
import time

MARKER = "RANKDECK_RUN"
PR_SET_CHILD_SUBREAPER = 36


class ProcInfo:
    __slots__ = ("pid", "ppid", "pgid", "sid", "state", "starttime", "comm")

    def __init__(self, pid, ppid, pgid, sid, state, starttime, comm):
        self.pid = pid
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.state = state
        self.starttime = starttime
        self.comm = comm


def stat(pid):
    """Parsed /proc/<pid>/stat, or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'.
    lpar = raw.find(b"(")
    rpar = raw.rfind(b")")
    comm = raw[lpar + 1 : rpar].decode("utf-8", "replace")
    fields = raw[rpar + 2 :].split()
    return ProcInfo(
        pid,
        int(fields[1]),
        int(fields[2]),
        int(fields[3]),
        fields[0].decode(),
        int(fields[19]),
        comm,
    )


def all_pids():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            out.append(int(name))
    return out


def table():
    """Every process on the host: {pid: ProcInfo}."""
    procs = {}
    for pid in all_pids():
        info = stat(pid)
        if info is not None:
            procs[pid] = info
    return procs


def descendants(root, procs=None):
    """PIDs below ``root`` (not ``root`` itself)."""
    procs = table() if procs is None else procs
    children = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    out = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def environ(pid):
    """A process's environment as a dict ({} when unreadable or gone)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def worker_rank(root, attempt, local_rank):
    """``(rank, world_size, pid)`` of the live worker below ``root`` with that local rank in
    torchrun restart ``attempt`` (the newest if several), from its environment; else None."""
    best = None
    for pid in descendants(root):
        env = environ(pid)
        if env.get("LOCAL_RANK") != str(local_rank):
            continue
        if env.get("TORCHELASTIC_RESTART_COUNT", "0") != str(attempt):
            continue
        rank = env.get("RANK")
        if rank is None or not rank.isdigit():
            continue
        info = stat(pid)
        if info and (best is None or info.starttime > best[0]):
            size = env.get("WORLD_SIZE", "")
            best = (info.starttime, int(rank), int(size) if size.isdigit() else None, pid)
    return None if best is None else best[1:]


def run_marker(run_id, node):
    """The ``RANKDECK_RUN`` value every process of a run's node carries (:func:`marked`)."""
    return "%s/%s" % (run_id, node)


def marked(value, procs=None):
    """PIDs whose environment carries ``RANKDECK_RUN=<value>``."""
    needle = ("%s=%s\0" % (MARKER, value)).encode()
    procs = table() if procs is None else procs
    out = []
    for pid in procs:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                raw = f.read() + b"\0"
        except OSError:
            continue
        if raw.startswith(needle) or (b"\0" + needle) in raw:
            out.append(pid)
    return out


def _not_a_request(_signum, _frame):
    pass


def ignore_job_signals():
    """A long-lived agent process that takes its requests only from serve (the judge, the
    store, a Slurm job's rankdeck-host step) lives on through SIGUSR1 and SIGUSR2, whose
    default is to end it: on a Slurm proctrack/cgroup site ``sbatch --signal=USR1@90`` and
    ``scancel --signal`` reach every process of the job's steps, meant for the trainer. A
    handler that does nothing, not SIG_IGN: a handler is reset at exec, so what the process
    starts (the host's supervisors, the judge's --notify command) gets the signals as usual."""
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, _not_a_request)


def naming(arg, procs=None):
    """PIDs with ``arg`` among their command-line arguments (a node's supervisor names its
    node folder: ``python -m agent supervisor NODE_DIR``, before its state.json exists)."""
    needle = arg.encode()
    procs = table() if procs is None else procs
    out = []
    for pid in procs:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if needle in args:
            out.append(pid)
    return out


def set_child_subreaper():
    """Make orphaned descendants re-parent to this process (Linux >= 3.4). True on success."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap():
    """Collect exit statuses of finished children (we are a subreaper: orphans land here)."""
    reaped = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


def alive(pid, starttime=None):
    """True when ``pid`` runs and (if given) started at ``starttime`` (guards against reuse)."""
    info = stat(pid)
    if info is None or info.state == "Z":
        return False
    return starttime is None or info.starttime == starttime


def signal_process(info, sig):
    """Send ``sig`` to the process of snapshot entry ``info`` only if that pid is still the
    same process (same start time): a pid freed and reused since the snapshot is left alone."""
    return send_signal(info.pid, info.starttime, sig)


def send_signal(pid, starttime, sig):
    """Send ``sig`` to ``pid`` only if it is the process that started at ``starttime`` (as
    recorded in state.json or store.json); True when sent. With a pidfd (Python >= 3.9,
    Linux >= 5.3) the check and the signal reach one process for certain; without, a reuse
    in the microseconds between them is still possible."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            pidfd = None  # an older kernel: fall back to kill(2)
    try:
        now = stat(pid)
        if now is None or now.starttime != starttime:
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def stop_pids(chosen, grace, settle=5.0):
    """Stop each process of ``chosen`` ({pid: starttime}, checked before every signal):
    SIGTERM (and SIGCONT, so a stopped one can act on it), up to ``grace`` seconds, SIGKILL
    to those left, up to ``settle`` seconds more. Returns the pids still there, sorted.

    For processes named one by one (``rankdeck hosts --kill-strays``); a run's whole tree,
    which gains children while it stops, is :func:`kill_run`'s."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid, start in chosen.items():
            send_signal(pid, start, sig)
    for wait, sig in ((grace, signal.SIGKILL), (settle, None)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(alive(p, s) for p, s in chosen.items()):
            time.sleep(0.05)  # (no reap: they are not this process's children, see alive)
        if sig is not None:
            for pid, start in chosen.items():
                if alive(pid, start):
                    send_signal(pid, start, sig)
    return sorted(p for p, s in chosen.items() if alive(p, s))


def _signal(snapshot, sig):
    """Signal each process of a snapshot ({pid: ProcInfo}) by pid, never by process group: a
    group can hold processes that are not the run's (the sweeps that follow catch children
    forked meanwhile)."""
    for info in snapshot.values():
        signal_process(info, sig)


def run_procs(root, marker):
    """Every live process of the run, {pid: ProcInfo}: descendants of ``root`` plus marked
    ones (not root, not this process)."""
    procs = table()
    pids = set(descendants(root, procs))
    if marker:
        pids.update(marked(marker, procs))
    pids.discard(root)
    pids.discard(os.getpid())
    return {p: procs[p] for p in pids if p in procs and procs[p].state != "Z"}


def run_pids(root, marker):
    """The pids of :func:`run_procs`, sorted."""
    return sorted(run_procs(root, marker))


def kill_run(root, marker, grace=10.0, first=None, on_wait=None, leave_first=False):
    """Stop every process of a run: SIGTERM (to ``first`` alone, else all), grace, SIGKILL.

    ``first`` is torchrun's pid: it forwards SIGTERM to its workers and gives them time to
    save. Stopped processes get SIGCONT so they can act on SIGTERM. ``on_wait`` is called while
    waiting (the supervisor keeps reading logs then). Returns a report dict: ``killed`` (pids
    that got SIGKILL), ``left`` (pids still there afterwards) and ``dstate`` (of those, in
    uninterruptible sleep: the host needs attention); ``others_gone_s`` and ``gone_s``, when
    every process but ``first``, and every one, was gone.

    ``leave_first``: return as soon as ``first`` is the only one left, with ``exiting`` =
    ``{"pid", "starttime", "deadline"}`` (the monotonic end of the grace): a restart need not
    wait for torchrun's own exit once its workers are gone (1.2-2 s of teardown on this
    machine, docs/BENCHMARKS.md); the caller SIGKILLs it if it outlives the grace.
    """
    snapshot = run_procs(root, marker)
    report = {"sigterm": sorted(snapshot), "killed": [], "left": [], "dstate": []}
    if not snapshot:
        return report
    torchrun = {first: snapshot[first]} if first in snapshot else None
    targets = torchrun or snapshot
    began = time.monotonic()
    _signal(targets, signal.SIGTERM)
    _signal(targets, signal.SIGCONT)
    deadline = began + grace
    while time.monotonic() < deadline:
        if on_wait:
            on_wait()
        reap()
        now = run_procs(root, marker)
        if "others_gone_s" not in report and set(now) <= {first}:
            report["others_gone_s"] = round(time.monotonic() - began, 3)
            if leave_first and now:
                report["exiting"] = {"pid": first, "starttime": now[first].starttime,
                                     "deadline": deadline}
                return report
        # gone: none carries the marker, and none of the first snapshot is still exiting (a
        # process past releasing its memory shows no environment, hence no marker, for a
        # while before it is a zombie; seen on a loaded host)
        if not now and not any(alive(p, info.starttime) for p, info in snapshot.items()):
            report["gone_s"] = round(time.monotonic() - began, 3)
            return report
        # torchrun may be gone while a worker blocked in a collective ignores it: after a
        # short while, SIGTERM everybody directly.
        if targets is torchrun and not alive(first, torchrun[first].starttime):
            targets = run_procs(root, marker)
            _signal(targets, signal.SIGTERM)
            _signal(targets, signal.SIGCONT)
        time.sleep(0.05)
    for attempt in range(100):
        snapshot = run_procs(root, marker)
        if not snapshot:
            break
        report["killed"] = sorted(set(report["killed"]) | set(snapshot))
        _signal(snapshot, signal.SIGKILL)
        if on_wait:
            on_wait()
        time.sleep(0.05)
        reap()
    left = run_pids(root, marker)
    report["left"] = left
    report["dstate"] = [p for p in left if (stat(p) or ProcInfo(0, 0, 0, 0, "", 0, "")).state == "D"]
    return report
