"""What a user reads after a kill: processes left, D state, GPU memory freed or held."""

from agent.supervisor import launcher as supervisor_launcher
from console.model.buffers import Series
from console.lines.text import kill_summary


class FakeProbe:
    """Stands in for NVML: there is no GPU on this machine."""

    def __init__(self, snaps):
        self.snaps = list(snaps)

    def snapshot(self):
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]


def snap(pid_mem):
    return {"source": "nvml", "gpus": [{"index": 0, "pid_mem": pid_mem}]}


def test_gpu_memory_freed_after_the_driver_catches_up():
    probe = FakeProbe([snap([[11, 2 << 30], [99, 1 << 30]]), snap([[99, 1 << 30]])])
    assert supervisor_launcher.gpu_after_kill(probe, {11, 12}, wait=2) == {"held": 0, "pids": []}


def test_gpu_memory_still_held_is_reported():
    probe = FakeProbe([snap([[11, 2 << 30]])])
    assert supervisor_launcher.gpu_after_kill(probe, {11}, wait=0.3) == {"held": 2 << 30,
                                                                         "pids": [11]}


def test_no_gpu_means_no_gpu_line():
    probe = FakeProbe([{"source": "none", "gpus": [], "reason": "no GPUs"}])
    assert supervisor_launcher.gpu_after_kill(probe, {11}) is None


def test_summaries():
    assert kill_summary({"sigterm": [1, 2], "killed": [], "left": [], "gpu": None}) == \
        "2 process(es) signalled, none left"
    # a restart: the new torchrun starts once the workers are gone (agent/procs.kill_run)
    assert kill_summary({"sigterm": [1, 2], "killed": [], "left": [], "torchrun_exiting": 1}) \
        == "2 process(es) signalled, workers gone, torchrun 1 exiting (SIGKILL after the grace)"
    assert kill_summary({"sigterm": [1], "left": [], "torchrun_exiting": "x" * 9999}) == \
        "1 process(es) signalled, none left"  # a host's garbage is not repeated
    assert kill_summary({"sigterm": [1, 2], "killed": [2], "left": [2], "dstate": [2],
                         "gpu": {"held": 3 << 30, "pids": [2]}}) == (
        "2 process(es) signalled, 1 needed SIGKILL, HOST NEEDS ATTENTION: [2] stuck in "
        "uninterruptible sleep, GPU MEMORY STILL HELD: 3.0 GiB by [2]")
    assert kill_summary({"sigterm": [1], "left": [], "gpu": {"held": 0, "pids": []}}) == \
        "1 process(es) signalled, none left, GPU memory freed"


def test_loss_series_stays_bounded_and_keeps_the_whole_run():
    s = Series(cap=8)
    for step in range(1, 1001):
        s.append((step, 1.0 / step))
    assert len(s) <= 8
    steps = [st for st, _v in s]
    assert steps[0] == 1 and steps == sorted(steps) and steps[-1] == 1000
    assert s[-1] == (1000, 1.0 / 1000)
