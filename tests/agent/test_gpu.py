"""GpuProbe: a GPU snapshot per second that never crashes, whatever the host has.

There is no GPU where these tests run, so the NVML path uses a fake ``pynvml`` module and the
nvidia-smi path a fake ``nvidia-smi`` script; the real-host test checks the "no GPUs" answer.
"""

import os
import shutil
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from agent.host.gpu import GpuProbe
from agent.host.gpu_fields import gpu_pids_memory
from tests.waits import wait_for_sync

GIB = 1024 ** 3
MIB = 1024 ** 2


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def host_has_nvidia_gpu():
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


# -- the real host -------------------------------------------------------------------------


@pytest.mark.skipif(host_has_nvidia_gpu(), reason="host has an NVIDIA GPU")
def test_real_host_without_gpu_reports_none_with_reason():
    probe = GpuProbe()
    before = time.time()
    snap = probe.snapshot()
    assert snap["source"] == "none"
    assert snap["gpus"] == []
    try:
        import pynvml  # noqa: F401  (a project dependency; optional on hosts)
        pynvml_why = "NVML"  # e.g. "NVML library not found", "NVIDIA driver not loaded"
    except ImportError:
        pynvml_why = "not installed"
    assert snap["reason"].startswith("no GPUs (pynvml: ")
    assert pynvml_why in snap["reason"]
    assert snap["reason"].endswith("; nvidia-smi: not installed)")
    assert before <= snap["ts"] <= time.time()
    # The second call within the retry window answers from the cache, and says the same.
    again = probe.snapshot()
    assert again["source"] == "none" and again["reason"] == snap["reason"]


@pytest.mark.skipif(not host_has_nvidia_gpu(), reason="host has no NVIDIA GPU")
def test_real_host_with_gpu_reports_devices():
    snap = GpuProbe().snapshot()
    assert snap["source"] in ("nvml", "nvidia-smi"), snap["reason"]
    assert snap["gpus"] and all(g["mem_total"] for g in snap["gpus"])


# -- NVML, through a fake pynvml -----------------------------------------------------------


def fake_pynvml(init_error=None):
    """A pynvml stand-in: two GPUs; temperature unsupported; GPU 1's power query fails."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    nv.NVMLError = NVMLError
    nv.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    nv.NVMLError_NotSupported = NVMLError_NotSupported
    nv.NVML_TEMPERATURE_GPU = 0
    nv.init_calls = 0
    nv.init_error = init_error

    def nvmlInit():
        nv.init_calls += 1
        if nv.init_error is not None:
            raise nv.init_error

    def get_temperature(handle, sensor):
        raise NVMLError_NotSupported("Not Supported")

    def get_power(handle):
        if handle == 1:
            raise NVMLError("Unknown Error")
        return 312500

    nv.nvmlInit = nvmlInit
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    # Older bindings return bytes.
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3" if h == 0 else b"NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUUID = lambda h: "GPU-%d" % h
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=10 * GIB, total=80 * GIB, free=70 * GIB)
    nv.nvmlDeviceGetTemperature = get_temperature
    nv.nvmlDeviceGetPowerUsage = get_power
    # No nvmlDeviceGetEnforcedPowerManagementLimit, as in old bindings: the fallback is used.
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: 700000
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [types.SimpleNamespace(pid=1234, usedGpuMemory=2 * GIB)] if h == 0 else [])
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: (
        [types.SimpleNamespace(pid=99, usedGpuMemory=None)] if h == 0 else [])
    return nv


def test_nvml_path_failing_field_is_none_and_others_present(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    snap = GpuProbe().snapshot()
    assert snap["source"] == "nvml" and snap["reason"] is None
    gpu0, gpu1 = snap["gpus"]
    assert gpu0 == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "util": 87,
        "mem_used": 10 * GIB, "mem_total": 80 * GIB, "temp": None, "power": 312.5,
        "power_limit": 700.0, "sm_clock": None, "throttle": None, "ecc_corrected": None,
        "ecc_uncorrected": None, "xid": None, "pids": [99, 1234], "pid_mem": [[1234, 2 * GIB]],
    }
    assert gpu1["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu1["power"] is None and gpu1["power_limit"] == 700.0
    assert gpu1["util"] == 87 and gpu1["pids"] == []
    assert gpu_pids_memory(snap) == {1234: 2 * GIB}


def full_pynvml():
    """A newer driver's pynvml: every field answers, and Xid events queue per GPU.

    Modelled on nvidia-ml-py 12.x: ``nvmlDeviceGetCurrentClocksEventReasons``, an event set
    whose ``nvmlEventSetWait_v2(set, 0)`` raises ``NVMLError_Timeout`` when nothing waits.
    """
    nv = fake_pynvml()

    class NVMLError_Timeout(nv.NVMLError):
        pass

    nv.NVMLError_Timeout = NVMLError_Timeout
    nv.NVML_CLOCK_SM = 1
    nv.nvmlEventTypeXidCriticalError = 8
    nv.pending = []  # (handle, xid) events not read yet
    nv.registered = []
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 61 + h
    nv.nvmlDeviceGetPowerUsage = lambda h: 400000
    nv.nvmlDeviceGetClockInfo = lambda h, clock: 1980 if clock == 1 else 0
    # GPU 1 slowed by its power cap and thermally; GPU 0 idle
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x1 if h == 0 else 0x4 | 0x20
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: (3, 0)[kind] if h == 0 else (7, 2)[kind]
    nv.nvmlDeviceGetIndex = lambda h: h
    nv.nvmlEventSetCreate = lambda: "set"
    nv.nvmlEventSetFree = lambda es: None

    def register(handle, kinds, event_set):
        nv.registered.append((handle, kinds, event_set))

    def wait(event_set, timeout_ms):
        assert timeout_ms == 0  # the poll loop must never block on NVML
        if not nv.pending:
            raise NVMLError_Timeout("Timeout")
        handle, xid = nv.pending.pop(0)
        return types.SimpleNamespace(device=handle, eventType=8, eventData=xid)

    nv.nvmlDeviceRegisterEvents = register
    nv.nvmlEventSetWait_v2 = wait
    return nv


def test_nvml_every_field(monkeypatch):
    nv = full_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    probe = GpuProbe()
    gpu0, gpu1 = probe.snapshot()["gpus"]
    assert nv.registered == [(0, 8, "set"), (1, 8, "set")]
    assert (gpu0["temp"], gpu0["power"], gpu0["sm_clock"]) == (61, 400.0, 1980)
    assert gpu0["throttle"] == ["gpu_idle"]
    assert gpu1["throttle"] == ["sw_power_cap", "sw_thermal"]
    assert (gpu0["ecc_corrected"], gpu0["ecc_uncorrected"]) == (3, 0)
    assert (gpu1["ecc_corrected"], gpu1["ecc_uncorrected"]) == (7, 2)
    assert gpu0["xid"] == [] and gpu1["xid"] == []

    nv.pending += [(1, 79), (1, 48), (0, 13)]
    gpu0, gpu1 = probe.snapshot()["gpus"]
    assert [x for _ts, x in gpu1["xid"]] == [79, 48] and [x for _ts, x in gpu0["xid"]] == [13]
    assert all(time.time() - ts < 60 for ts, _x in gpu1["xid"])
    gpu0, gpu1 = probe.snapshot()["gpus"]  # each event is reported once
    assert gpu0["xid"] == [] and gpu1["xid"] == []


def test_nvml_fields_missing_are_none(monkeypatch):
    nv = full_pynvml()

    def not_supported(*args):
        raise nv.NVMLError_NotSupported("Not Supported")

    # an older binding: no clocks-event name, the old throttle name unsupported; no ECC
    # on a consumer board; events refused for GPU 0 only
    del nv.nvmlDeviceGetCurrentClocksEventReasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = not_supported
    nv.nvmlDeviceGetTotalEccErrors = not_supported
    nv.nvmlDeviceGetClockInfo = not_supported
    nv.nvmlDeviceRegisterEvents = lambda h, kinds, es: not_supported() if h == 0 else None
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    nv.pending.append((1, 31))
    gpu0, gpu1 = GpuProbe().snapshot()["gpus"]
    for gpu in (gpu0, gpu1):
        assert gpu["throttle"] is None and gpu["sm_clock"] is None
        assert gpu["ecc_corrected"] is None and gpu["ecc_uncorrected"] is None
        assert gpu["temp"] is not None  # the rest still there
    assert gpu0["xid"] is None and [x for _ts, x in gpu1["xid"]] == [31]


def test_nvml_without_event_api_has_no_xid(monkeypatch):
    nv = full_pynvml()
    del nv.nvmlEventSetCreate
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpu0, gpu1 = GpuProbe().snapshot()["gpus"]
    assert gpu0["xid"] is None and gpu1["xid"] is None
    assert gpu1["throttle"] == ["sw_power_cap", "sw_thermal"]


def test_nvml_throttle_from_old_name(monkeypatch):
    nv = full_pynvml()
    del nv.nvmlDeviceGetCurrentClocksEventReasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40 | 0x8
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpu0, _gpu1 = GpuProbe().snapshot()["gpus"]
    assert gpu0["throttle"] == ["hw_slowdown", "hw_thermal"]


def test_nvml_initialised_once(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    probe = GpuProbe()
    for _ in range(3):
        assert probe.snapshot()["source"] == "nvml"
    assert nv.init_calls == 1


def test_nvml_lost_device_keeps_other_gpus(monkeypatch):
    nv = fake_pynvml()

    def handle(i):
        if i == 1:
            raise nv.NVMLError("GPU is lost")
        return i

    nv.nvmlDeviceGetHandleByIndex = handle
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gpu0, gpu1 = GpuProbe().snapshot()["gpus"]
    assert gpu0["mem_total"] == 80 * GIB
    assert gpu1["index"] == 1 and gpu1["name"] is None and gpu1["mem_total"] is None


def test_nvml_missing_library_then_retry_after_a_minute(monkeypatch, tmp_path):
    nv = fake_pynvml()
    nv.init_error = nv.NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    clock = FakeClock()
    probe = GpuProbe(nvidia_smi=str(tmp_path / "absent-nvidia-smi"), clock=clock)

    snap = probe.snapshot()
    assert snap == {"source": "none", "gpus": [], "ts": snap["ts"],
                    "reason": "no GPUs (pynvml: NVML library not found; nvidia-smi: not installed)"}
    clock.now += 30
    assert probe.snapshot()["source"] == "none"
    assert nv.init_calls == 1  # not retried within the minute

    nv.init_error = None  # e.g. the driver finished loading
    clock.now += 31
    assert probe.snapshot()["source"] == "nvml"
    assert nv.init_calls == 2


def test_pynvml_not_installed(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    snap = GpuProbe(nvidia_smi=str(tmp_path / "absent")).snapshot()
    assert snap["reason"] == "no GPUs (pynvml: not installed; nvidia-smi: not installed)"


# -- nvidia-smi, through a fake script -----------------------------------------------------


def write_smi(tmp_path, body):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


FAKE_SMI = """\
    if [ -f "{flag}" ]; then echo "Unable to determine the device handle for GPU0000:01:00.0: Unknown Error"; exit 15; fi
    if [ "$2" != "--format=csv,noheader,nounits" ]; then exit 2; fi
    case "$1" in
    --query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit)
        echo "0, NVIDIA H100 80GB HBM3, GPU-aaaa, 87, 40960, 81559, 54, 312.50, 700.00"
        echo "1, NVIDIA H100 80GB HBM3, GPU-bbbb, [N/A], 0, 81559, [Not Supported], [N/A], 700.00"
        ;;
    --query-compute-apps=*)
        echo "GPU-aaaa, 1234, 40000"
        echo "GPU-bbbb, 77, [N/A]"
        ;;
    *) exit 2 ;;
    esac
"""


def test_nvidia_smi_path_parses_csv_and_na(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    smi = write_smi(tmp_path, FAKE_SMI.format(flag=tmp_path / "broken"))
    snap = GpuProbe(nvidia_smi=smi).snapshot()
    assert snap["source"] == "nvidia-smi" and snap["reason"] is None
    gpu0, gpu1 = snap["gpus"]
    assert gpu0 == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "util": 87,
        "mem_used": 40960 * MIB, "mem_total": 81559 * MIB, "temp": 54, "power": 312.5,
        "power_limit": 700.0, "sm_clock": None, "throttle": None, "ecc_corrected": None,
        "ecc_uncorrected": None, "xid": None, "pids": [1234], "pid_mem": [[1234, 40000 * MIB]],
    }
    assert gpu1["util"] is None and gpu1["temp"] is None and gpu1["power"] is None
    assert gpu1["mem_used"] == 0 and gpu1["power_limit"] == 700.0
    assert gpu1["pids"] == [77] and gpu1["pid_mem"] == []
    assert gpu_pids_memory(snap) == {1234: 40000 * MIB}


def test_nvidia_smi_that_stops_working_is_retried_soon(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    flag = tmp_path / "broken"
    smi = write_smi(tmp_path, FAKE_SMI.format(flag=flag))
    clock = FakeClock()
    probe = GpuProbe(nvidia_smi=smi, clock=clock)
    assert probe.snapshot()["source"] == "nvidia-smi"

    flag.touch()
    snap = probe.snapshot()
    assert snap["source"] == "none" and snap["gpus"] == []
    assert "exit status 15: Unable to determine the device handle" in snap["reason"]

    flag.unlink()
    clock.now += GpuProbe.RETRY_AFTER_LOSS_S + 1
    assert probe.snapshot()["source"] == "nvidia-smi"


def test_nvidia_smi_failing_gives_none_with_its_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    smi = write_smi(tmp_path, """\
        echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        exit 9
    """)
    snap = GpuProbe(nvidia_smi=smi).snapshot()
    assert snap["source"] == "none" and snap["gpus"] == []
    assert snap["reason"] == ("no GPUs (pynvml: not installed; nvidia-smi: exit status 9: "
                              "NVIDIA-SMI has failed because it couldn't communicate with the "
                              "NVIDIA driver.)")


def test_nvidia_smi_with_no_rows_is_no_gpus(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    smi = write_smi(tmp_path, "echo 'No devices were found'\n")
    snap = GpuProbe(nvidia_smi=smi).snapshot()
    assert snap["source"] == "none" and "No devices were found" in snap["reason"]


def _alive(pid):
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_nvidia_smi_hang_times_out_and_is_killed(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    pids, slept = tmp_path / "pids", tmp_path / "slept"
    # The subshell is a child holding stdout open: killing only the shell would leave
    # communicate() waiting for the pipe to close, until the sleep ends and says so.
    smi = write_smi(tmp_path, """\
        (sleep 120; echo done > "{slept}") &
        echo "$$ $!" > "{pids}"
        wait
    """.format(pids=pids, slept=slept))
    probe = GpuProbe(nvidia_smi=smi, smi_timeout=0.5)
    snap = probe.snapshot()
    assert snap["source"] == "none" and snap["gpus"] == []
    assert "nvidia-smi: timed out after 0.5 s" in snap["reason"]
    shell, child = (int(p) for p in pids.read_text().split())
    wait_for_sync(lambda: not _alive(shell) and not _alive(child), 60,
                  "nvidia-smi and its child to be killed")
    assert not slept.exists(), "the probe waited for the hung child instead of killing it"


def test_snapshot_survives_a_probe_bug(monkeypatch):
    nv = fake_pynvml()
    nv.nvmlDeviceGetCount = lambda: "two"  # range("two") -> TypeError inside the probe
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    snap = GpuProbe().snapshot()
    assert snap["source"] == "none" and snap["gpus"] == []
    assert snap["reason"].startswith("GPU probe failed: TypeError")


def test_gpu_pids_memory_ignores_junk():
    assert gpu_pids_memory(None) == {}
    assert gpu_pids_memory({"gpus": [{"pid_mem": [[1, 5], ["x", 1], [2]]},
                                     {"pid_mem": [[1, 7]]}]}) == {1: 12}

