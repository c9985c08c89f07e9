"""A stand-in for torchrun in benchmarks: writes synthetic rank logs in torchrun's layout.

``python bench/writer.py NPROC RATE SECONDS`` starts NPROC worker processes (with the
RANK/LOCAL_RANK/TORCHELASTIC_RESTART_COUNT environment torchrun gives its workers), each
writing RATE lines per second for SECONDS into
``$RANKDECK_LOG_DIR/bench_x/attempt_0/<local_rank>/stdout.log``. Every line carries the time
it was written (``t=...``) so a reader can measure delivery latency. No torch needed.
"""

import os
import re
import subprocess
import sys
import time


def worker(path, rate, seconds, rank):
    tick = 0.01  # write in bursts every 10 ms, as a busy trainer's buffered output would
    per_tick = max(1, int(rate * tick))
    seq = 0
    start = time.time()
    pad = "x" * 40
    with open(path, "ab", buffering=0) as out:
        while time.time() - start < seconds:
            now = time.time()
            out.write("".join("rank=%d seq=%d t=%.6f %s\n" % (rank, seq + i, now, pad)
                              for i in range(per_tick)).encode())
            seq += per_tick
            next_at = start + (seq / float(rate))
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
    return seq


def main():
    if os.environ.get("BENCH_WORKER"):
        n = worker(os.environ["BENCH_PATH"], float(sys.argv[2]), float(sys.argv[3]),
                   int(os.environ["RANK"]))
        sys.stdout.write("wrote %d\n" % n)
        return 0
    nproc, rate, seconds = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    node = int(re.sub(r"\D", "", os.environ.get("RANKDECK_NODE", "0")) or 0)
    base = os.path.join(os.environ["RANKDECK_LOG_DIR"], "bench_x", "attempt_0")
    procs = []
    for lr in range(nproc):
        os.makedirs(os.path.join(base, str(lr)), exist_ok=True)
        path = os.path.join(base, str(lr), "stdout.log")
        open(path, "ab").close()
        env = dict(os.environ, BENCH_WORKER="1", BENCH_PATH=path, LOCAL_RANK=str(lr),
                   RANK=str(node * nproc + lr), TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, __file__, str(nproc), rate, seconds],
                                      env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
