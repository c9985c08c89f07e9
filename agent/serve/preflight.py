"""Host facts for preflight: Python, torch/CUDA/NCCL, GPUs, disk, hostname, clock, and
whether the workdir, the interpreter and the script are there.

The agent does not import torch: the training interpreter is asked in a subprocess, which
also proves that interpreter can import torch at all. Paths are read as the host reads them
(agent/host/paths.py): ``~`` is this host's home, a relative workdir is relative to it, a
relative script is relative to the workdir.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..host.gpu import GpuProbe
from ..host.gpu_health import gpu_health
from ..host.paths import host_path, python_exists, shell_word

TORCH_PROBE = r"""
import json, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["cuda_devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
    except Exception as exc:
        out["cuda_error"] = str(exc)
    try:
        nccl = torch.cuda.nccl.version() if out.get("cuda_available") else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception:
        out["nccl"] = None
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""
WRITE_BYTES = 256 << 20  # `check --deep`'s write test: this much, or WRITE_SECONDS
WRITE_SECONDS = 1.0


MODULE_PROBE = r"""
import importlib.util, json, sys
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
    print(json.dumps({"found": found}))
except Exception as exc:  # a parent package that fails to import, say
    print(json.dumps({"found": False, "error": "%s: %s" % (type(exc).__name__, exc)}))
"""


def probe_python(python, timeout=90.0):
    """What the training interpreter says about itself and torch."""
    try:
        out = subprocess.run([python or sys.executable, "-c", TORCH_PROBE],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        return {"python_error": "%s: not found" % python}
    except subprocess.TimeoutExpired:
        return {"python_error": "%s did not answer within %d s" % (python, timeout)}
    if out.returncode != 0:
        tail = out.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return {"python_error": "%s exited %d: %s" % (python, out.returncode, tail[0])}
    try:
        return json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"python_error": "%s printed no answer" % python}


def workdir_facts(workdir):
    """Where the run will work: the expanded path, whether it exists and can be written."""
    return {"workdir": workdir, "workdir_exists": os.path.isdir(workdir),
            "workdir_writable": os.path.isdir(workdir) and os.access(workdir, os.W_OK | os.X_OK)}


def python_facts(python):
    """The training interpreter as found here: ``python_path`` (None: not found)."""
    python = python or sys.executable
    found = python_exists(python)
    return {"python_path": found, "python_exists": found is not None}


def script_facts(script, module, workdir, python, timeout=60.0):
    """Whether the script file (or ``-m`` module, as the host's python finds it from the
    workdir) is on this host. A missing one usually means the code was not copied there."""
    if module:
        out = {"script": script, "script_module": True}
        if not python:
            out.update(script_exists=None, script_error="no python to look the module up with")
            return out
        try:
            res = subprocess.run([python, "-c", MODULE_PROBE, script], cwd=workdir,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, timeout=timeout)
            answer = json.loads(res.stdout.decode().strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            out.update(script_exists=None, script_error="could not look the module up: %s" % exc)
            return out
        out["script_exists"] = bool(answer.get("found"))
        if answer.get("error"):
            out["script_error"] = answer["error"]
        return out
    path = os.path.join(workdir, shell_word(script))
    return {"script": os.path.normpath(path), "script_module": False,
            "script_exists": os.path.isfile(path)}


def write_speed(folder, limit_bytes=WRITE_BYTES, seconds=WRITE_SECONDS):
    """How fast a file is written (and synced to disk) in ``folder``, where checkpoints go:
    ``{"disk_write_mbps", "disk_dir"}`` or ``{"disk_write_error"}`` (a full disk says so).
    Writes for about ``seconds`` or ``limit_bytes``, whichever comes first; removes its file."""
    out = {"disk_dir": folder}
    if not os.path.isdir(folder):
        out["disk_write_error"] = "%s is not there" % folder
        return out
    chunk = b"\0" * (1 << 20)
    written, path = 0, None
    try:
        fd, path = tempfile.mkstemp(prefix=".rankdeck-write-", dir=folder)
        start = time.monotonic()
        with os.fdopen(fd, "wb") as f:
            while written < limit_bytes and time.monotonic() - start < seconds:
                f.write(chunk)
                written += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        took = time.monotonic() - start
        out["disk_write_mbps"] = round(written / (1 << 20) / max(took, 1e-6), 1)
    except OSError as exc:
        out["disk_write_error"] = "cannot write in %s: %s" % (folder, exc.strerror or exc)
    finally:
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out


GPU_DEEP_FIELDS = ("index", "name", "ecc_corrected", "ecc_uncorrected", "throttle", "xid", "pids",
                   "sm_clock")


def deep_gpu_facts(snapshot_gpus, health):
    """Each GPU's snapshot fields the deep check judges, with its NVML health fields
    (agent/host/gpu_health.py) by index."""
    by_index = {h["index"]: h for h in health}
    return [dict({k: g.get(k) for k in GPU_DEEP_FIELDS}, **by_index.get(g.get("index"), {}))
            for g in snapshot_gpus]


def host_facts(args):
    facts = {"hostname": socket.gethostname(), "time": time.time(),
             "agent_python": "%d.%d.%d" % sys.version_info[:3]}
    try:
        facts["hostname_resolves"] = socket.gethostbyname(facts["hostname"])
    except OSError as exc:
        facts["hostname_resolves"] = None
        facts["hostname_error"] = str(exc)
    workdir = host_path(args.get("workdir") or "~")
    facts.update(workdir_facts(workdir))
    facts.update(python_facts(args.get("python")))
    try:
        usage = shutil.disk_usage(workdir if facts["workdir_exists"] else
                                  os.path.dirname(workdir.rstrip("/")) or "/")
        facts["disk_free"] = usage.free
    except OSError:
        facts["disk_free"] = None
    if args.get("deep"):  # `check --deep`: where checkpoints go, written to
        target = host_path(os.path.join(workdir, args["ckpt_dir"])) if args.get("ckpt_dir") \
            else workdir
        facts.update(write_speed(target))
    gpu = GpuProbe().snapshot()
    facts["gpu_source"] = gpu["source"]
    facts["gpu_reason"] = gpu.get("reason")
    facts["gpus"] = [{"index": g.get("index"), "name": g.get("name"),
                      "mem_free": (g["mem_total"] - g["mem_used"])
                      if g.get("mem_total") is not None and g.get("mem_used") is not None
                      else None} for g in gpu.get("gpus", [])]
    if args.get("deep") and gpu.get("gpus"):  # `check --deep`: each GPU's health fields
        facts["gpu_health"] = deep_gpu_facts(gpu["gpus"], gpu_health())
    if args.get("python") is not None:
        facts.update(probe_python(facts["python_path"] or args.get("python")))
    if args.get("script"):
        facts.update(script_facts(args["script"], bool(args.get("module")), workdir,
                                  facts["python_path"]))
    facts["time_after"] = time.time()
    return facts


class Listener:
    """A TCP listener for the preflight's reachability probe; accepts and closes."""

    def __init__(self, addr, port=0):
        self.sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self):
        self.sock.close()
