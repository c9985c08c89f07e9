"""`check --deep`'s GPU part, through a fake pynvml (no GPU here; untested on real GPUs):
the host's NVML health fields (agent/host/gpu_health.py, agent/serve/preflight.py) and what
the console names from them and from the per-GPU figures (console/run/deep.py)."""

import sys
import types

from agent.serve.preflight import host_facts
from console.run.deep import judge_gpus
from console.run.preflight import HostCheck
from test_gpu import full_pynvml


def sick_pynvml():
    """Two GPUs: GPU 1 has uncorrected ECC errors (full_pynvml's), a pending page retirement,
    a x8 link of x16, a hardware slowdown, and a process holding its memory."""
    nv = full_pynvml()
    nv.nvmlDeviceGetRetiredPages = lambda h, cause: ["0x1000"] * (0 if h == 0 else 2 + cause)
    nv.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 1 if h == 1 else 0
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16 if h == 0 else 8
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 1  # idle: not judged
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetMaxClockInfo = lambda h, clock: 1980
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x1 if h == 0 else 0x8
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [types.SimpleNamespace(pid=4321, usedGpuMemory=1 << 30)] if h == 1 else [])
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return nv


def test_deep_facts_read_every_health_field_and_name_the_sick_gpu(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", sick_pynvml())
    facts = host_facts({"workdir": str(tmp_path), "deep": True})
    gpu0, gpu1 = facts["gpu_health"]
    assert (gpu0["retired_sbe"], gpu0["retired_dbe"], gpu0["retired_pending"]) == (0, 0, False)
    assert (gpu1["retired_sbe"], gpu1["retired_dbe"], gpu1["retired_pending"]) == (2, 3, True)
    assert (gpu1["pcie_width"], gpu1["pcie_width_max"], gpu1["pcie_gen"],
            gpu1["pcie_gen_max"], gpu1["sm_clock_max"]) == (8, 16, 1, 5, 1980)
    assert gpu1["throttle"] == ["hw_slowdown"] and gpu1["pids"] == [4321]
    assert facts["disk_write_mbps"] > 0
    check = HostCheck("node1", facts=facts)
    judge_gpus([check], {})
    assert check.problems == [
        "GPU 1: 2 uncorrected ECC errors", "GPU 1: a page retirement waits for a GPU reset",
        "GPU 1: 3 pages retired for double-bit errors", "GPU 1: clocks held down: hw_slowdown",
        "GPU 1: PCIe link x8 of x16", "GPU 1: processes already hold its memory: pid 4321"]


def test_plain_preflight_reads_no_health_fields(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", sick_pynvml())
    facts = host_facts({"workdir": str(tmp_path)})
    assert "gpu_health" not in facts and "disk_write_mbps" not in facts


def test_the_slow_gpu_of_the_cluster_is_named_with_the_median():
    checks = [HostCheck("node%d" % i) for i in range(3)]
    net = {"gpus": {"node0": [{"index": 0, "tflops": 700.0, "copy_gbps": 3800.0}],
                    "node1": [{"index": 0, "tflops": 690.0, "copy_gbps": 3900.0},
                              {"index": 1, "tflops": 410.0, "copy_gbps": 3850.0}],
                    "node2": [{"index": 0, "tflops": 705.0, "copy_gbps": 3790.0}]}}
    judge_gpus(checks, net)
    assert [c.problems for c in checks] == [
        [], ["GPU 1: bf16 matmul 410 TFLOP/s, the cluster's median 695"], []]
