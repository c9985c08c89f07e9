"""A once-a-second GPU snapshot of this host, from NVML, nvidia-smi, or neither.

``GpuProbe.snapshot()`` never raises. A missing library or driver means ``"source": "none"``
with a short reason naming why each source failed, never a crash; a single NVML field that
fails (``NVMLError_NotSupported`` on consumer boards, a permission error) comes back as None
and does not cost the others. The pattern is nvitop's ``nvmlQuery`` and ``NA``
(XuehaiPan/nvitop ``nvitop/api/libnvml.py``).

pynvml (package ``nvidia-ml-py``) is optional and imported only inside the probe, so this
module imports the standard library alone. Runs on Python >= 3.9 (docs/COMPAT.md).

Over 450 lines: two sources (NVML with its event set for Xid errors, and nvidia-smi's CSV
with a killed-on-timeout child) that must give one snapshot shape field for field; split,
each half would repeat that shape.

Snapshot::

    {"source": "nvml" | "nvidia-smi" | "none", "reason": str | None, "ts": time.time(),
     "gpus": [{"index": int, "name": str|None, "uuid": str|None, "util": int|None (%),
               "mem_used": int|None (bytes), "mem_total": int|None (bytes),
               "temp": int|None (C), "power": float|None (W), "power_limit": float|None (W),
               "sm_clock": int|None (MHz), "throttle": [str, ...]|None,
               "ecc_corrected": int|None, "ecc_uncorrected": int|None,
               "xid": [[ts, xid], ...]|None,
               "pids": [int, ...], "pid_mem": [[pid, bytes], ...]}]}

``throttle`` names the active clock throttle reasons (``THROTTLE_REASONS``; ``gpu_idle``
alone means idle, not slowed). ``ecc_*`` are volatile totals (since the driver loaded).
``xid`` lists the Xid errors NVML's event API delivered since the previous snapshot
(``[]``: none; None: events not available on this GPU). nvidia-smi gives none of these five
(None); they come from NVML only.

``pid_mem`` lists the processes whose GPU memory the driver reports (see
``gpu_pids_memory``); it may be shorter than ``pids``.
"""

import csv
import os
import signal
import subprocess
import sys
import time

__all__ = ["GpuProbe", "gpu_pids_memory", "SMI_GPU_FIELDS", "THROTTLE_REASONS"]

SMI_GPU_FIELDS = (
    "index,name,uuid,utilization.gpu,memory.used,memory.total,"
    "temperature.gpu,power.draw,power.limit"
)
_SMI_APP_FIELDS = "gpu_uuid,pid,used_memory"
_MIB = 1024 * 1024
# nvmlClocksThrottleReason* / nvmlClocksEventReason* bits (nvml.h), in short words.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"), (0x100, "display_clocks"),
)
_NVML_CLOCK_SM = 1
_NVML_MEMORY_ERROR_CORRECTED, _NVML_MEMORY_ERROR_UNCORRECTED = 0, 1
_NVML_VOLATILE_ECC = 0
_NVML_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
_XID_DRAIN = 32  # events read per snapshot at most: a storm must not stall the poll loop
# NVML's NVML_VALUE_NOT_AVAILABLE for unsigned long long; older bindings pass it through.
_NOT_AVAILABLE = (1 << 64) - 1

# Short words for the NVML errors a host without a usable GPU produces; anything else is
# reported with NVML's own text.
_NVML_REASONS = (
    ("NVMLError_LibraryNotFound", "NVML library not found"),
    ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
    ("NVMLError_NoPermission", "no permission to use NVML"),
    ("NVMLError_Uninitialized", "NVML not initialised"),
)


_site_added = False


def import_pynvml():
    """The pynvml module (ImportError where it is not installed). ``serve`` on a host runs in
    the bootstrap's interpreter, started without ``site`` (console/transport/agent_copy.py):
    site-packages, where pynvml lives, join ``sys.path`` here, when first wanted."""
    global _site_added
    if sys.flags.no_site and not _site_added:
        _site_added = True
        import site

        site.main()
    import pynvml

    return pynvml


def _nvml_query(nvml, func_name, *args):
    """``nvml.func_name(*args)``, or None if it raises an NVML error or does not exist.

    One wrapper around every per-field call, so a field the board or driver does not support
    (usually means ``NVMLError_NotSupported`` or an older driver lacking the function) is
    None rather than an exception that loses the whole snapshot.
    """
    func = getattr(nvml, func_name, None)
    if func is None:
        return None
    try:
        return func(*args)
    except nvml.NVMLError:
        return None
    except UnicodeError:
        # Some pynvml versions decode names and UUIDs from bytes and choke on odd ones.
        return None


def _text(value):
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _watts(milliwatts):
    if isinstance(milliwatts, (int, float)) and 0 <= milliwatts < _NOT_AVAILABLE:
        return milliwatts / 1000.0
    return None


def _count(value):
    """A plain non-negative int from NVML, or None for sentinels and junk."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _NOT_AVAILABLE:
        return value
    return None


def _nvml_error_reason(nvml, exc):
    for class_name, words in _NVML_REASONS:
        cls = getattr(nvml, class_name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return words
    text = str(exc).strip()
    return text or type(exc).__name__


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


class GpuProbe:
    """Takes GPU snapshots of this host. Not thread-safe: poll it from one worker thread.

    ``nvidia_smi``: the nvidia-smi to fall back on (name on PATH or a path).
    ``smi_timeout``: seconds before a hung nvidia-smi is killed (it can hang on a wedged GPU).
    ``clock``: monotonic seconds, for tests of the rediscovery back-off.
    """

    #: Seconds between attempts to find a GPU source after all of them failed.
    RETRY_S = 60.0
    #: Sooner retry when a source that worked stops working (a transient nvidia-smi hang).
    RETRY_AFTER_LOSS_S = 5.0

    def __init__(self, nvidia_smi="nvidia-smi", smi_timeout=2.0, clock=time.monotonic):
        self._smi = nvidia_smi
        self._smi_timeout = smi_timeout
        self._clock = clock
        self._nvml = None  # the pynvml module, once nvmlInit succeeded
        self._source = None  # "nvml" | "nvidia-smi" | None (not found yet)
        self._reason = None
        self._next_discovery = None  # clock time before which discovery is not retried
        self._xid_set = None  # NVML event set for Xid errors, when the driver offers one
        self._xid_gpus = set()  # indexes of the GPUs registered in it

    @property
    def source(self):
        """The source in use, or None while none works."""
        return self._source

    def snapshot(self):
        """``{"source", "reason", "gpus", "ts"}`` for this host; never raises."""
        try:
            source, reason, gpus = self._take()
        except Exception as exc:  # a probe bug must not take the agent's poll loop down
            source, reason, gpus = "none", "GPU probe failed: %s: %s" % (type(exc).__name__, exc), []
        return {"source": source, "reason": reason, "gpus": gpus, "ts": time.time()}

    def close(self):
        """Releases NVML (``nvmlShutdown``); the next snapshot starts discovery again."""
        nvml, self._nvml = self._nvml, None
        self._source = None
        self._next_discovery = None
        if nvml is not None:
            if self._xid_set is not None:
                _nvml_query(nvml, "nvmlEventSetFree", self._xid_set)
            _nvml_query(nvml, "nvmlShutdown")
        self._xid_set, self._xid_gpus = None, set()

    # -- sources ---------------------------------------------------------------------------

    def _take(self):
        if self._source == "nvml":
            # Once NVML initialised it stays: a failing device call is per-field, and a
            # GPU that fell off the bus should show up as such, not as a source switch.
            return self._from_nvml()
        if self._source == "nvidia-smi":
            gpus, why = self._from_smi()
            if gpus is not None:
                return "nvidia-smi", None, gpus
            self._source = None
            self._reason = "no GPUs (nvidia-smi: %s)" % why
            self._next_discovery = self._clock() + self.RETRY_AFTER_LOSS_S
            return "none", self._reason, []
        if self._next_discovery is not None and self._clock() < self._next_discovery:
            return "none", self._reason, []
        return self._discover()

    def _discover(self):
        reasons = []
        why = self._init_nvml()
        if why is None:
            self._source = "nvml"
            return self._from_nvml()
        reasons.append("pynvml: " + why)
        gpus, why = self._from_smi()
        if gpus is not None:
            self._source = "nvidia-smi"
            return "nvidia-smi", None, gpus
        reasons.append("nvidia-smi: " + why)
        self._reason = "no GPUs (%s)" % "; ".join(reasons)
        self._next_discovery = self._clock() + self.RETRY_S
        return "none", self._reason, []

    def _init_nvml(self):
        """None once NVML is initialised, else a short reason."""
        try:
            pynvml = import_pynvml()
        except ImportError:
            return "not installed"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return _nvml_error_reason(pynvml, exc)
        except OSError as exc:  # old bindings raise this when libnvidia-ml.so is absent
            return "NVML library not found (%s)" % exc
        self._nvml = pynvml
        self._register_xid()
        return None

    def _register_xid(self):
        """Ask NVML for Xid events of every GPU that supports them (others show xid None)."""
        nvml = self._nvml
        self._xid_set = _nvml_query(nvml, "nvmlEventSetCreate")
        if self._xid_set is None:
            return
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", _NVML_EVENT_XID)
        for index in range(_count(_nvml_query(nvml, "nvmlDeviceGetCount")) or 0):
            handle = _nvml_query(nvml, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            # registering returns None on success: only an NVML error means "not supported"
            try:
                nvml.nvmlDeviceRegisterEvents(handle, kind, self._xid_set)
            except (nvml.NVMLError, AttributeError):
                continue
            self._xid_gpus.add(index)

    def _new_xids(self):
        """{gpu index: [[ts, xid], ...]} of the Xid events waiting in the event set."""
        nvml, found = self._nvml, {}
        wait = ("nvmlEventSetWait_v2" if hasattr(nvml, "nvmlEventSetWait_v2")
                else "nvmlEventSetWait")
        for _ in range(_XID_DRAIN if self._xid_set is not None else 0):
            # timeout 0: a poll; NVML raises NVMLError_Timeout (None here) when none waits
            data = _nvml_query(nvml, wait, self._xid_set, 0)
            if data is None:
                break
            index = _count(_nvml_query(nvml, "nvmlDeviceGetIndex", getattr(data, "device", None)))
            xid = _count(getattr(data, "eventData", None))
            if index is not None and xid is not None:
                found.setdefault(index, []).append([time.time(), xid])
        return found

    def _from_nvml(self):
        nvml = self._nvml
        count = _nvml_query(nvml, "nvmlDeviceGetCount")
        if count is None:
            return "nvml", "nvmlDeviceGetCount failed", []
        xids = self._new_xids()
        gpus = []
        for index in range(count):
            gpu = self._nvml_gpu(nvml, index)
            gpu["xid"] = xids.get(index, []) if index in self._xid_gpus else None
            gpus.append(gpu)
        return "nvml", None if gpus else "no GPUs (NVML reports 0 devices)", gpus

    @staticmethod
    def _nvml_gpu(nvml, index):
        gpu = _empty_gpu(index)
        handle = _nvml_query(nvml, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return gpu
        gpu["name"] = _text(_nvml_query(nvml, "nvmlDeviceGetName", handle))
        gpu["uuid"] = _text(_nvml_query(nvml, "nvmlDeviceGetUUID", handle))
        util = _nvml_query(nvml, "nvmlDeviceGetUtilizationRates", handle)
        gpu["util"] = _count(getattr(util, "gpu", None))
        mem = _nvml_query(nvml, "nvmlDeviceGetMemoryInfo", handle)
        gpu["mem_used"] = _count(getattr(mem, "used", None))
        gpu["mem_total"] = _count(getattr(mem, "total", None))
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        gpu["temp"] = _count(_nvml_query(nvml, "nvmlDeviceGetTemperature", handle, sensor))
        gpu["power"] = _watts(_nvml_query(nvml, "nvmlDeviceGetPowerUsage", handle))
        limit = _nvml_query(nvml, "nvmlDeviceGetEnforcedPowerManagementLimit", handle)
        if limit is None:
            limit = _nvml_query(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
        gpu["power_limit"] = _watts(limit)
        gpu["sm_clock"] = _count(_nvml_query(nvml, "nvmlDeviceGetClockInfo", handle,
                                             getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)))
        gpu["throttle"] = _throttle_names(_nvml_throttle_mask(nvml, handle))
        for key, kind in (("ecc_corrected", _NVML_MEMORY_ERROR_CORRECTED),
                          ("ecc_uncorrected", _NVML_MEMORY_ERROR_UNCORRECTED)):
            gpu[key] = _count(_nvml_query(nvml, "nvmlDeviceGetTotalEccErrors", handle, kind,
                                          _NVML_VOLATILE_ECC))
        pid_mem = {}
        for func_name in ("nvmlDeviceGetComputeRunningProcesses",
                          "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in _nvml_query(nvml, func_name, handle) or ():
                pid = _count(getattr(proc, "pid", None))
                if pid is None:
                    continue
                used = _count(getattr(proc, "usedGpuMemory", None))
                if used is not None or pid not in pid_mem:
                    pid_mem[pid] = used
        gpu["pids"] = sorted(pid_mem)
        gpu["pid_mem"] = [[pid, used] for pid, used in sorted(pid_mem.items()) if used is not None]
        return gpu

    def _from_smi(self):
        """(gpus, None) from nvidia-smi, or (None, short reason)."""
        out, why = self._run_smi(["--query-gpu=" + SMI_GPU_FIELDS, "--format=csv,noheader,nounits"])
        if out is None:
            return None, why
        gpus = []
        for row in csv.reader(out.splitlines(), skipinitialspace=True):
            if len(row) != 9:
                continue
            index = _smi_int(row[0])
            gpu = _empty_gpu(index if index is not None else len(gpus))
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


def _nvml_throttle_mask(nvml, handle):
    # renamed "clocks event reasons" in NVML 12.2; older bindings have only the old name
    mask = _nvml_query(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = _nvml_query(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return _count(mask)


def _throttle_names(mask):
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def _empty_gpu(index):
    return {"index": index, "name": None, "uuid": None, "util": None, "mem_used": None,
            "mem_total": None, "temp": None, "power": None, "power_limit": None,
            "sm_clock": None, "throttle": None, "ecc_corrected": None,
            "ecc_uncorrected": None, "xid": None, "pids": [], "pid_mem": []}


def gpu_pids_memory(snapshot):
    """``{pid: bytes}`` of GPU memory per process, summed over GPUs, from a snapshot.

    Only processes whose usage the driver reports appear (usually means: not in a container
    that hides host PIDs, and not a MIG/vGPU setup where NVML withholds it). Handy to check
    that a killed rank's memory was freed.
    """
    usage = {}
    for gpu in (snapshot or {}).get("gpus") or ():
        for entry in gpu.get("pid_mem") or ():
            try:
                pid, used = int(entry[0]), int(entry[1])
            except (TypeError, ValueError, IndexError):
                continue
            usage[pid] = usage.get(pid, 0) + used
    return usage
