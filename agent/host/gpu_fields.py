"""One GPU's entry of a snapshot (agent/host/gpu.py, where its fields are described), which both
readers fill field for field (NVML: agent/host/gpu_nvml.py; nvidia-smi: agent/host/gpu_smi.py), and what
is read back from a snapshot. Plain data, no I/O; standard library only; Python >= 3.9.
"""

__all__ = ["empty_gpu", "gpu_pids_memory"]


def empty_gpu(index):
    """One GPU's entry of a snapshot, every field unknown: a reader fills what it can."""
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
