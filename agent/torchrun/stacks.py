"""Python stacks of a node's ranks, for hang triage.

``py-spy dump --nonblocking`` when py-spy is on the host (it also works on a stopped process);
otherwise SIGUSR1 to a worker that registered ``faulthandler`` for it (the reference trainer
does), reading what it wrote to its stderr; otherwise a reason. SIGUSR1 is only sent to a
process whose signal mask shows it catches SIGUSR1: for any other process it would be fatal.
"""

import os
import shutil
import signal
import subprocess
import time

from ..host import procs
from ..host.paths import host_python
from ..host.runfiles import read_json

PYSPY_TIMEOUT = 15.0
FAULTHANDLER_WAIT = 1.5


def find_py_spy(python=None):
    """py-spy on PATH, or next to the training interpreter (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    if python:
        cand = os.path.join(os.path.dirname(python), "py-spy")
        if os.access(cand, os.X_OK):
            return cand
    return None


def catches(pid, signum):
    """True when the process has a handler installed for ``signum`` (SigCgt in status)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except OSError:
        pass
    return False


def workers(supervisor_pid):
    """The node's rank processes: descendants of the supervisor with RANK in their env."""
    out = []
    for pid in procs.descendants(supervisor_pid):
        env = procs.environ(pid)
        if "RANK" in env and "LOCAL_RANK" in env:
            info = procs.stat(pid)
            out.append({"pid": pid, "rank": int(env["RANK"]),
                        "local_rank": int(env["LOCAL_RANK"]),
                        "local_world_size": _int(env.get("LOCAL_WORLD_SIZE")),
                        "state": info.state if info else "?",
                        "executable": _exe(pid)})
    # a worker's own children (dataloader workers) carry RANK too: keep the topmost
    pids = {w["pid"] for w in out}
    out = [w for w in out if (procs.stat(w["pid"]) or procs.ProcInfo(0, 0, 0, 0, "", 0, "")
                              ).ppid not in pids]
    return sorted(out, key=lambda w: w["rank"])


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return 0


def _exe(pid):
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None


def _stderr_path(pid):
    try:
        path = os.readlink("/proc/%d/fd/2" % pid)
    except OSError:
        return None
    return path if path.startswith("/") and os.path.isfile(path) else None


def dump_one(worker, py_spy, signals=True):
    """One worker's stack; ``signals`` False (a read-only console's request: agent/serve/server.py,
    directly or through the run's judge, agent/supervisor/judge_link.py) sends it no SIGUSR1
    or SIGCONT, so py-spy alone may answer."""
    pid = worker["pid"]
    if py_spy:
        try:
            out = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, timeout=PYSPY_TIMEOUT)
            text = out.stdout.decode("utf-8", "replace")
            if out.returncode == 0:
                return {"method": "py-spy", "stack": text}
            py_spy_error = text.strip().splitlines()[-1:] or ["exit %d" % out.returncode]
        except subprocess.TimeoutExpired:
            py_spy_error = ["py-spy timed out after %d s" % PYSPY_TIMEOUT]
    else:
        py_spy_error = ["py-spy not installed (pip install py-spy on the host)"]
    if not signals:
        return {"method": None, "error": "; ".join(py_spy_error) + "; a read-only console "
                "sends no signal to the ranks (SIGUSR1 would make them write their stacks)"}
    if catches(pid, signal.SIGUSR1):
        path = _stderr_path(pid)
        if path is None:
            return {"method": None, "error": "faulthandler output goes nowhere readable"}
        before = os.path.getsize(path)
        if worker.get("state") == "T":
            os.kill(pid, signal.SIGCONT)  # a stopped process cannot run its handler
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + FAULTHANDLER_WAIT
        while time.monotonic() < deadline and os.path.getsize(path) == before:
            time.sleep(0.05)
        time.sleep(0.2)
        with open(path, "rb") as f:
            f.seek(before)
            text = f.read(256 * 1024).decode("utf-8", "replace")
        if text.strip():
            return {"method": "faulthandler", "stack": text}
        return {"method": None, "error": "SIGUSR1 sent but no stack was written"}
    return {"method": None, "error": "; ".join(py_spy_error) + "; and the process does not "
            "catch SIGUSR1 (register faulthandler: faulthandler.register(signal.SIGUSR1))"}


def dump_stacks(ndir, args):
    state = read_json(os.path.join(ndir, "state.json"), {}) or {}
    pid = state.get("pid")
    if not pid or not procs.alive(pid, state.get("starttime")):
        return {"ranks": [], "error": "the node's run is not running"}
    py_spy = find_py_spy(host_python(args.get("python")))
    out = []
    for w in workers(pid):
        w.update(dump_one(w, py_spy, signals=args.get("signals", True) is not False))
        out.append(w)
    return {"ranks": out, "py_spy": py_spy}
