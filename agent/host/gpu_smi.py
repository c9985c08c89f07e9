"""nvidia-smi, read for the GPU snapshot (agent/host/gpu.py) where NVML is not to be had: its CSV
(``--query-gpu``, then ``--query-compute-apps`` for the processes), from a child killed with
its process group when it hangs (it can hang on a wedged GPU). nvidia-smi gives no SM clock,
throttle reasons, ECC counts or Xid errors: those fields stay None.

Standard library only; Python >= 3.9 (docs/COMPAT.md).
"""

import csv
import os
import signal
import subprocess

from .gpu_fields import empty_gpu

__all__ = ["NvidiaSmi", "SMI_GPU_FIELDS"]

SMI_GPU_FIELDS = (
    "index,name,uuid,utilization.gpu,memory.used,memory.total,"
    "temperature.gpu,power.draw,power.limit"
)
_SMI_APP_FIELDS = "gpu_uuid,pid,used_memory"
_MIB = 1024 * 1024


def _smi_value(text):
    """A stripped CSV cell, or None for nvidia-smi's ``[N/A]``, ``[Not Supported]`` etc."""
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NA"):
        return None
    return text


def _smi_int(text):
    text = _smi_value(text)
    if text is None:
        return None
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        return None


def _smi_float(text):
    text = _smi_value(text)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _first_line(text, limit=120):
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


class NvidiaSmi:
    """The GPUs nvidia-smi lists. ``path``: the nvidia-smi to run (a name on PATH or a path);
    ``timeout``: seconds before a hung nvidia-smi is killed."""

    def __init__(self, path, timeout):
        self._smi = path
        self._smi_timeout = timeout

    def read(self):
        """(gpus, None) from nvidia-smi, or (None, short reason)."""
        out, why = self._run_smi(["--query-gpu=" + SMI_GPU_FIELDS, "--format=csv,noheader,nounits"])
        if out is None:
            return None, why
        gpus = []
        for row in csv.reader(out.splitlines(), skipinitialspace=True):
            if len(row) != 9:
                continue
            index = _smi_int(row[0])
            gpu = empty_gpu(index if index is not None else len(gpus))
            gpu["name"] = _smi_value(row[1])
            gpu["uuid"] = _smi_value(row[2])
            gpu["util"] = _smi_int(row[3])
            used, total = _smi_int(row[4]), _smi_int(row[5])
            gpu["mem_used"] = used * _MIB if used is not None else None
            gpu["mem_total"] = total * _MIB if total is not None else None
            gpu["temp"] = _smi_int(row[6])
            gpu["power"] = _smi_float(row[7])
            gpu["power_limit"] = _smi_float(row[8])
            gpus.append(gpu)
        if not gpus:
            return None, "no GPUs listed (%s)" % (_first_line(out) or "empty output")
        self._smi_apps(gpus)
        return gpus, None

    def _smi_apps(self, gpus):
        # PIDs are a bonus: a failure here leaves the lists empty and the GPUs reported.
        out, _ = self._run_smi(["--query-compute-apps=" + _SMI_APP_FIELDS,
                                "--format=csv,noheader,nounits"])
        if out is None:
            return
        by_uuid = {gpu["uuid"]: gpu for gpu in gpus if gpu["uuid"]}
        for row in csv.reader(out.splitlines(), skipinitialspace=True):
            if len(row) < 2:
                continue
            gpu = by_uuid.get(row[0].strip())
            pid = _smi_int(row[1])
            if gpu is None or pid is None or pid in gpu["pids"]:
                continue
            gpu["pids"].append(pid)
            used = _smi_int(row[2]) if len(row) > 2 else None
            if used is not None:
                gpu["pid_mem"].append([pid, used * _MIB])
        for gpu in gpus:
            gpu["pids"].sort()
            gpu["pid_mem"].sort()

    def _run_smi(self, args):
        """(stdout, None) from ``nvidia-smi args``, or (None, short reason)."""
        try:
            proc = subprocess.Popen(
                [self._smi] + args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Its own process group, so a timeout kills it and anything it started.
                start_new_session=True,
            )
        except FileNotFoundError:
            return None, "not installed"
        except OSError as exc:
            return None, "cannot run (%s)" % (exc.strerror or exc)
        try:
            out, err = proc.communicate(timeout=self._smi_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:
                proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                # Stuck in the kernel (a wedged driver): leave it; subprocess reaps it later.
                pass
            return None, "timed out after %g s" % self._smi_timeout
        out = out.decode("utf-8", "replace")
        if proc.returncode != 0:
            detail = _first_line(out) or _first_line(err.decode("utf-8", "replace"))
            reason = "exit status %d" % proc.returncode
            return None, reason + (": " + detail if detail else "")
        return out, None


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass
