"""NVML, read for the GPU snapshot (agent/host/gpu.py): every GPU's fields, one wrapper around
each call, and the Xid errors NVML's event API delivers.

A single NVML field that fails (``NVMLError_NotSupported`` on consumer boards, a permission
error) comes back as None and does not cost the others. The pattern is nvitop's ``nvmlQuery``
and ``NA`` (XuehaiPan/nvitop ``nvitop/api/libnvml.py``).

pynvml (package ``nvidia-ml-py``) is optional and imported only when NVML is first wanted
(:func:`import_pynvml`), so this module imports the standard library alone. Runs on
Python >= 3.9 (docs/COMPAT.md).
"""

import sys
import time

from .gpu_fields import empty_gpu

__all__ = ["Nvml", "open_nvml", "import_pynvml", "THROTTLE_REASONS"]

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


def open_nvml():
    """``(an Nvml, None)`` once NVML is initialised, else ``(None, a short reason)``."""
    try:
        pynvml = import_pynvml()
    except ImportError:
        return None, "not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, _nvml_error_reason(pynvml, exc)
    except OSError as exc:  # old bindings raise this when libnvidia-ml.so is absent
        return None, "NVML library not found (%s)" % exc
    return Nvml(pynvml), None


class Nvml:
    """NVML once initialised (:func:`open_nvml`); not thread-safe, as the probe that reads it."""

    def __init__(self, nvml):
        self._nvml = nvml  # the pynvml module
        self._xid_set = None  # NVML event set for Xid errors, when the driver offers one
        self._xid_gpus = set()  # indexes of the GPUs registered in it

    def register_xid(self):
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

    def read(self):
        """``("nvml", reason or None, gpus)``: every GPU's fields, and its new Xid errors."""
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
        gpu = empty_gpu(index)
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

    def close(self):
        """Frees the Xid event set and releases NVML (``nvmlShutdown``)."""
        if self._xid_set is not None:
            _nvml_query(self._nvml, "nvmlEventSetFree", self._xid_set)
        _nvml_query(self._nvml, "nvmlShutdown")
        self._xid_set, self._xid_gpus = None, set()


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
