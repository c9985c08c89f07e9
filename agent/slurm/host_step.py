"""A Slurm job's ``rankdeck-host`` step on one node: the long-lived parent of a run's detached
processes on a ``proctrack/cgroup`` site (docs/SLURM.md, "proctrack/cgroup sites").

There Slurm kills everything in a step's cgroup when the step ends, and leaving a process tree
does not leave a cgroup: a supervisor the console's short-lived ``serve`` step started dies
with that step. So the console starts, once per job and node, a step of its own that lives
until its work is done (``python -m agent host JOB``, :func:`main`), and ``serve`` asks it to
start the run's supervisors, store and judge (:func:`spawn`): they are its children, in its
cgroup, and outlive any console.

It listens on an abstract Unix socket named for the user and the job (:func:`address`;
abstract sockets belong to the network namespace, so each node has its own) and answers only
its own user, and is asked only when its own user listens (``SO_PEERCRED`` both ways: an
abstract socket has no file mode, and another user may take the name first). It ends once it has had
no child for ``IDLE_S`` seconds (``START_S`` before its first), so a stopped run leaves no
step behind. Without a host (a ``linuxproc`` site, a run outside Slurm) :func:`spawn` starts
the process itself, as before.

Standard library only.
"""

import json
import os
import signal
import socket
import struct
import sys
import time

from ..host import detach, procs

JOB_ENV = "RANKDECK_SLURM_JOB"
IDLE_S = 5.0  # no child for this long once it had one: it ends (the run was stopped)
START_S = 180.0  # ... or before its first one (a launch that failed before starting any)
ASK_TIMEOUT = 30.0
REQUEST_MAX = 8 << 20  # bytes of one request (a spec with its environment)


def address(job):
    return "\0rankdeck-host-%d-%s" % (os.getuid(), job)


class HostAbsent(Exception):
    """No rankdeck-host step answers for this job on this node."""


def ask(job, request, timeout=ASK_TIMEOUT):
    """The host's answer to ``request`` (a dict); HostAbsent when none listens, RuntimeError
    with the host's words when it refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(address(job))
        except OSError as exc:
            raise HostAbsent(str(exc)) from None
        if peer_uid(sock) != os.getuid():  # another user took the name first: tell it nothing
            raise HostAbsent("the socket %r is another user's" % address(job)[1:])
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = _read_line(sock, 1 << 16)
    finally:
        sock.close()
    try:
        answer = json.loads(answer)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise HostAbsent("no answer from the rankdeck-host step")
    if answer.get("error"):
        raise RuntimeError("rankdeck-host: %s" % str(answer["error"])[:500])
    return answer


def up(environ=None):
    """Whether this job's host answers on this node (False outside a Slurm run)."""
    job = (environ if environ is not None else os.environ).get(JOB_ENV)
    if not job:
        return False
    try:
        return bool(ask(job, {"op": "ping"}, timeout=5).get("ok"))
    except (HostAbsent, RuntimeError, OSError):
        return False


class Spawned:
    """A process the host started (its child, reaped there): ``Popen``'s ``pid``, ``poll``,
    ``kill`` and ``wait`` as the callers use them; its exit code is not known here."""

    returncode = "unknown (started by the rankdeck-host step)"

    def __init__(self, pid, starttime):
        self.pid = pid
        self.starttime = starttime

    def poll(self):
        return None if procs.alive(self.pid, self.starttime) else self.returncode

    def kill(self):
        info = procs.stat(self.pid)
        if info is not None and info.starttime == self.starttime:
            procs.signal_process(info, signal.SIGKILL)

    def wait(self):  # (the host reaps it)
        return None


def spawn(argv, data=None, out=None, env=None, cwd=None):
    """Start ``argv`` detached (a session of its own), ``data`` on its stdin (the spec, with
    its secrets: never a file, never a command line), its output appended to ``out`` (a path;
    None: nowhere): through this job's host when one answers, else here. A ``Popen`` or a
    :class:`Spawned`."""
    job = (env or os.environ).get(JOB_ENV)
    if job:
        try:
            answer = ask(job, {"op": "spawn", "argv": list(argv), "env": env, "cwd": cwd,
                               "out": out, "stdin": (data or b"").decode("utf-8")})
            return Spawned(int(answer["pid"]), answer.get("starttime"))
        except HostAbsent:
            pass
    return detach.spawn(argv, data, out, env, cwd)


# -- the host itself ------------------------------------------------------------------------
def main(job, idle_s=IDLE_S, start_s=START_S):
    """``python -m agent host JOB``: start what this node's ``serve`` steps ask, until idle."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    procs.ignore_job_signals()  # the job's --signal is the trainer's (agent/host/procs.py)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address(job))
    except OSError:  # another host of this job holds the name: it serves this node
        return 0
    sock.listen(16)
    sock.settimeout(0.5)
    children = {}
    had_one, since = False, time.monotonic()
    while True:
        for pid, proc in list(children.items()):
            if proc.poll() is not None:
                del children[pid]
        now = time.monotonic()
        if children:
            had_one, since = True, now
        elif now - since >= (idle_s if had_one else start_s):
            return 0
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            continue
        with conn:
            conn.settimeout(ASK_TIMEOUT)
            try:
                answer = _answer(conn, children)
            except Exception as exc:  # noqa: BLE001 (said to the asker; the host goes on)
                answer = {"error": "%s: %s" % (type(exc).__name__, exc)}
            try:
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except OSError:
                pass


def peer_uid(sock):
    """The user of the process at the other end of a connected Unix socket (the kernel's
    word, ``SO_PEERCRED``)."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               struct.calcsize("3i")))[1]


def _answer(conn, children):
    uid = peer_uid(conn)
    if uid != os.getuid():
        return {"error": "uid %d is not this step's user" % uid}
    request = json.loads(_read_line(conn, REQUEST_MAX))
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    if request.get("op") == "ping":
        return {"ok": True, "pid": os.getpid(), "children": sorted(children)}
    if request.get("op") != "spawn":
        raise ValueError("unknown op %r" % request.get("op"))
    argv, env = request.get("argv"), request.get("env")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv is a list of strings")
    if env is not None and not (isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env is an object of strings")
    proc = detach.spawn(argv, request.get("stdin", "").encode("utf-8"), request.get("out"), env,
                  request.get("cwd"))
    children[proc.pid] = proc
    info = procs.stat(proc.pid)
    return {"pid": proc.pid, "starttime": info.starttime if info else None}


def _read_line(sock, limit):
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("a request over %d bytes" % limit)
    return data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
