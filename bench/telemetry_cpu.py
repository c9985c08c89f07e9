"""CPU time of the agent's telemetry: GPU snapshot + host sample once a second.

Run: ``python bench/telemetry_cpu.py [SECONDS] [WORKDIR]``. Prints the process CPU seconds
spent over the wall time, as a percentage of one core (target <= 1 %). Not a timed test.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.host.gpu import GpuProbe  # noqa: E402
from agent.host.stats import HostSampler  # noqa: E402


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    workdir = sys.argv[2] if len(sys.argv) > 2 else os.getcwd()
    probe, host = GpuProbe(), HostSampler()
    probe.snapshot()  # discovery (importing pynvml, nvmlInit) is a one-off, not the loop
    host.sample(workdir)
    cpu0, wall0 = time.process_time(), time.monotonic()
    samples = 0
    while time.monotonic() - wall0 < seconds:
        snap = probe.snapshot()
        sample = host.sample(workdir)
        samples += 1
        time.sleep(max(0.0, wall0 + samples - time.monotonic()))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    print("telemetry: %d samples in %.1f s, %.3f s CPU = %.3f %% of a core "
          "(%.2f ms a sample; gpu source %s, %d GPUs, %d interfaces, disk %s)"
          % (samples, wall, cpu, 100.0 * cpu / wall, 1000.0 * cpu / samples,
             snap["source"], len(snap["gpus"]), len(sample["net"]),
             (sample["disk"] or {}).get("dev")))


if __name__ == "__main__":
    main()
