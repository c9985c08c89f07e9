"""NVML fields the deep check reads besides the GPU snapshot's (``rankdeck check --deep``,
docs/HEALTH.md): retired pages (and whether a retirement waits for a reset), the PCIe link's
width and generation against the board's maximum, and the SM clock's maximum. Every call
goes through the snapshot's one wrapper (agent/host/gpu_nvml.py ``_nvml_query``): a field the
board or driver does not support is None. Tested only with a fake pynvml: no GPU was at hand.
"""

from .gpu_nvml import _count, _nvml_query, import_pynvml

_RETIRED_SBE, _RETIRED_DBE = 0, 1  # nvmlPageRetirementCause_t: multiple single-bit, double-bit
_NVML_CLOCK_SM = 1


def _retired(nvml, handle, cause):
    pages = _nvml_query(nvml, "nvmlDeviceGetRetiredPages", handle, cause)
    return len(pages) if isinstance(pages, (list, tuple)) else None


def gpu_health():
    """``[{"index", "retired_sbe", "retired_dbe", "retired_pending", "pcie_width",
    "pcie_width_max", "pcie_gen", "pcie_gen_max", "sm_clock_max"}]`` per GPU, or [] where NVML
    is not to be had (the snapshot says why)."""
    try:
        nvml = import_pynvml()
        nvml.nvmlInit()
    except Exception:  # no pynvml, no library, no driver: the snapshot's reason says which
        return []
    out = []
    try:
        for index in range(_count(_nvml_query(nvml, "nvmlDeviceGetCount")) or 0):
            handle = _nvml_query(nvml, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            pending = _nvml_query(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
            out.append({
                "index": index,
                "retired_sbe": _retired(nvml, handle, _RETIRED_SBE),
                "retired_dbe": _retired(nvml, handle, _RETIRED_DBE),
                "retired_pending": None if pending is None else bool(pending),
                "pcie_width": _count(_nvml_query(nvml, "nvmlDeviceGetCurrPcieLinkWidth",
                                                 handle)),
                "pcie_width_max": _count(_nvml_query(nvml, "nvmlDeviceGetMaxPcieLinkWidth",
                                                     handle)),
                "pcie_gen": _count(_nvml_query(nvml, "nvmlDeviceGetCurrPcieLinkGeneration",
                                               handle)),
                "pcie_gen_max": _count(_nvml_query(nvml, "nvmlDeviceGetMaxPcieLinkGeneration",
                                                   handle)),
                "sm_clock_max": _count(_nvml_query(nvml, "nvmlDeviceGetMaxClockInfo", handle,
                                                   getattr(nvml, "NVML_CLOCK_SM",
                                                           _NVML_CLOCK_SM))),
            })
    finally:
        _nvml_query(nvml, "nvmlShutdown")
    return out
