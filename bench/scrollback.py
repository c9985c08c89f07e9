"""Benchmark: one page of scrollback from a long run's journal, against reading it from the start.

Writes a node journal of ``--mib`` MiB with the agent's JournalWriter (8 ranks' stdout and
stderr, 2-6 line records, a metric record now and then, as the supervisor writes them), then
times ``read_back`` (what the ``scrollback`` op runs) for one rank's page of 256 KiB ending at
the journal's end, middle and 1/8, and for a rank that printed nothing in the last 32 MiB.
Baseline: what serving that page would cost without journal.idx - reading the journal forward
from offset 0 to the page's end (JournalReader, as a subscription does).

    .venv/bin/python bench/scrollback.py [--mib 512]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from agent.host.journal import JournalReader, JournalWriter, read_back  # noqa: E402

PAGE = 256 * 1024


def write_journal(path: str, mib: int, quiet_fid: int) -> None:
    rnd = random.Random(1)
    w = JournalWriter(path)
    for fid in range(1, 17):
        w.append({"k": "file", "f": fid, "rank": (fid - 1) // 2, "local_rank": (fid - 1) // 2,
                  "stream": "stdout" if fid % 2 else "stderr", "attempt": 0})
    lines = [("step=%d loss=%.4f lr=3.0e-04 step_time=0.512s tok/s=31244 %s\n"
              % (i, 4.0 / (1 + i), "x" * rnd.randint(0, 60))).encode() for i in range(512)]
    batch, offsets = [], {}
    limit = mib << 20
    while w.size < limit:
        fid = rnd.randint(1, 16)
        if fid == quiet_fid and w.size > limit - (40 << 20):
            continue  # this file went quiet for the last 40 MiB
        data = b"".join(rnd.choice(lines) for _ in range(rnd.randint(2, 6)))
        batch.append(({"k": "data", "f": fid, "o": offsets.get(fid, 0), "ts": time.time()}, data))
        offsets[fid] = offsets.get(fid, 0) + len(data)
        if rnd.random() < 0.2:
            batch.append(({"k": "metric", "f": fid, "step": 1, "loss": 1.0}, b""))
        if len(batch) >= 256:
            w.append_many(batch)
            batch = []
    w.append_many(batch)
    w.close()


def best_of(n: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def forward_to(path: str, end: int) -> int:
    reader, n = JournalReader(path), 0
    while reader.offset < end:
        got = reader.read(1 << 20)
        if not got:
            break
        n += len(got)
    reader.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rdk-bench-sb-")
    try:
        path = os.path.join(tmp, "journal")
        t = time.perf_counter()
        write_journal(path, args.mib, quiet_fid=15)
        size = os.path.getsize(path)
        print("journal: %.0f MiB written in %.1f s; index: %d entries"
              % (size / 2 ** 20, time.perf_counter() - t,
                 len(open(path + ".idx").read().split())))
        print("%-34s %11s %11s %10s %8s" % ("page of 256 KiB ending at", "read_back",
                                            "baseline", "ratio", "data"))
        for label, end, fids in (("the end (rank 0)", size, [1, 2]),
                                 ("the middle (rank 0)", size // 2, [1, 2]),
                                 ("1/8 (rank 0)", size // 8, [1, 2]),
                                 ("the end, a file quiet for 40 MiB", size, [15])):
            back_s, (recs, _start) = best_of(3, lambda: read_back(path, end, fids, PAGE))
            base_s, _n = best_of(1, lambda: forward_to(path, end))
            print("%-34s %9.1f ms %9.0f ms %9.0fx %5d KiB" % (
                label, back_s * 1000, base_s * 1000, base_s / back_s,
                sum(len(d) for _m, d, _e in recs) // 1024))
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
