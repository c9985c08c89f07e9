"""Benchmark: the goodput of a run of 1 million log lines, against a plain replay of its journals.

Writes the journals of a finished run with the agent's JournalWriter: 4 nodes x 2 ranks, each
rank printing a step line and four other lines a step (log data in records of 2-6 lines, a
metric record a step line, a checkpoint line every 100 steps, as the supervisor writes them),
one stall restarted half way, and the judge's journal with its stall, verdict, restart and
stepping events. Then times (CPU seconds of this process, the best of 3):

- baseline: a plain replay: every record of every journal read and parsed (JournalReader, as
  a console's subscription reads them);
- goodput: the same replay with each meta fed to agent/rules/goodput.py and its report made;
- goodput from metas: only the metas goodput reads (``read_metas``: no log data decoded), fed
  and reduced: what a reader of the journals on their host needs;
- the reduction alone (``report``) once the records are in;
- the judge's report read: what `rankdeck goodput RUN` does when the run's judge has kept it
  (agent/judge/goodput.py: the judge fed every meta as it came and wrote its report; serve's
  ``goodput`` reads the file, the console checks it: console/records/goodput.py ``from_judge``),
  with no replay.

Then the reducer's memory (tracemalloc) at ``--mem-ranks`` x ``--mem-steps`` (512 x 100,000),
a restart resumed 500 steps back every 20,000 steps, against the 16 bytes a step a rank that
keeping every step took.

    .venv/bin/python bench/goodput.py [--lines 1000000] [--mem-ranks 512 --mem-steps 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from agent.host.journal import JournalReader, JournalWriter  # noqa: E402
from agent.judge.goodput import JudgeGoodput, read_report  # noqa: E402
from agent.rules.goodput import Goodput  # noqa: E402
from console.records.goodput import from_judge  # noqa: E402

NODES, RANKS_PER_NODE, LINES_PER_STEP = 4, 2, 5
KINDS = ("file", "metric", "ckpt", "ckpt_done", "event")
T0 = 1_800_000_000.0


def write_run(root: str, lines: int) -> int:
    """The run's journals under ``root``; the steps each rank made."""
    rnd = random.Random(1)
    ranks = NODES * RANKS_PER_NODE
    steps = lines // (ranks * LINES_PER_STEP)
    hang = steps // 2 + 37  # every rank stalls after this step; resumed from the checkpoint before
    resume = hang - hang % 100
    for n in range(NODES):
        os.makedirs(os.path.join(root, "node%d" % n))
        w = JournalWriter(os.path.join(root, "node%d" % n, "journal"))
        w.append({"k": "event", "what": "launched", "ts": T0, "node": "node%d" % n})
        for local in range(RANKS_PER_NODE):
            w.append({"k": "file", "f": local + 1, "rank": n * RANKS_PER_NODE + local,
                      "stream": "stdout"})
        batch, offsets, t = [], {}, T0 + 20.0
        order = list(range(1, hang + 1)) + list(range(resume + 1, steps + 1))
        for i, step in enumerate(order):
            if i == hang:
                t += 40.0  # the stall and the restart
            t += 0.5
            for local in range(RANKS_PER_NODE):
                fid = local + 1
                text = ["step=%d loss=%.4f lr=3.0e-04 step_time=0.500 tok/s=31244\n"
                        % (step, 4.0 / (1 + step))] + ["info %d %s\n" % (step, "x" * rnd.randint(
                            0, 60)) for _ in range(LINES_PER_STEP - 1)]
                while text:
                    cut = rnd.randint(2, 6)
                    take, text = text[:cut], text[cut:]
                    data = "".join(take).encode()
                    batch.append(({"k": "data", "f": fid, "o": offsets.get(fid, 0), "ts": t},
                                  data))
                    offsets[fid] = offsets.get(fid, 0) + len(data)
                batch.append(({"k": "metric", "f": fid, "step": step, "loss": 1.0, "ts": t}, b""))
                if step % 100 == 0:
                    batch.append(({"k": "ckpt", "f": fid, "step": step, "path": "/c/%d" % step,
                                   "ts": t + 0.2}, b""))
                    batch.append(({"k": "ckpt_done", "f": fid, "step": step, "complete": True,
                                   "path": "/c/%d" % step, "ts": t + 0.3}, b""))
            if len(batch) >= 256:
                w.append_many(batch)
                batch = []
        batch.append(({"k": "event", "what": "ended", "state": "succeeded", "ts": t + 1.0}, b""))
        w.append_many(batch)
        w.close()
    os.makedirs(os.path.join(root, "judge"))
    w = JournalWriter(os.path.join(root, "judge", "journal"))
    stall_at = T0 + 20.0 + 0.5 * hang
    w.append({"k": "event", "what": "judge", "action": "started", "ts": T0})
    for r in range(ranks):
        w.append({"k": "event", "what": "stalled", "node": "node%d" % (r // 2), "rank": r,
                  "step": hang, "idle_s": 6.0, "ts": stall_at + 6.0})
    w.append({"k": "event", "what": "verdict", "verdict": {"suspects": [{"rank": 2,
             "node": "node1"}]}, "ts": stall_at + 7.0})
    w.append({"k": "event", "what": "policy", "action": "restart", "node": "node1",
              "ts": stall_at + 7.5})
    for r in range(ranks):
        w.append({"k": "event", "what": "stepping", "node": "node%d" % (r // 2), "rank": r,
                  "step": resume + 1, "ts": stall_at + 40.5})
    w.close()
    return steps


def journals(root: str):
    for name in ["judge"] + ["node%d" % n for n in range(NODES)]:
        yield (None if name == "judge" else name), os.path.join(root, name, "journal")


def replay(root: str, feed: bool):
    good, n = Goodput(), 0
    for node, path in journals(root):
        reader = JournalReader(path)
        while True:
            got = reader.read(4 << 20)
            if not got:
                break
            n += len(got)
            if feed:
                for rec in got:
                    good.add(node, rec[0])
        reader.close()
    return good.report() if feed else n


def from_metas(root: str):
    good = Goodput()
    for node, path in journals(root):
        reader = JournalReader(path)
        while True:
            got = reader.read_metas(KINDS, 4 << 20)
            if not got:
                break
            for meta in got:
                good.add(node, meta)
        reader.close()
    return good


def judge_kept(root: str) -> JudgeGoodput:
    """The judge's reducer fed every meta as its nodes forward them, and its report written."""
    jdir = os.path.join(root, "judge")
    kept = JudgeGoodput(jdir)
    kept.reducer = from_metas(root)
    kept.write(kept.report(True))
    return kept


def judges_answer(root: str) -> dict:
    """`rankdeck goodput RUN` with a judge: serve reads its report, the console checks it."""
    out = from_judge(read_report(os.path.join(root, "judge")))
    assert out is not None
    return out


def reducer_memory(ranks: int, steps: int) -> tuple[int, int]:
    """(bytes the reducer holds, seconds to feed it) for ``ranks`` x ``steps`` step records."""
    tracemalloc.start()
    t = time.process_time()
    good = Goodput()
    for r in range(ranks):
        good.add("node%d" % (r // 8), {"k": "file", "f": r % 8, "rank": r})
    ts = T0
    step = 0
    for i in range(1, steps + 1):
        ts += 0.5 + (60.0 if i % 20000 == 0 else 0.0)
        step = step - 500 if i % 20000 == 0 else step + 1
        for r in range(ranks):
            good.add("node%d" % (r // 8), {"k": "metric", "f": r % 8, "step": step, "ts": ts})
    fed = time.process_time() - t
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert good.report()["ranks"] == ranks
    return size, fed


def best_of(n: int, fn):
    """The least CPU time (this process's) of ``n`` calls, and the last's result: CPU time,
    since the development VM's 2 cores are shared (docs/BENCHMARKS.md)."""
    best, out = float("inf"), None
    for _ in range(n):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mem-ranks", type=int, default=512)
    ap.add_argument("--mem-steps", type=int, default=100_000, help="0: no memory figure")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="rankdeck-goodput-")
    try:
        steps = write_run(root, args.lines)
        size = sum(os.path.getsize(p) for _n, p in journals(root))
        print("%d log lines, %d ranks x %d steps, journals %.0f MiB" % (
            args.lines, NODES * RANKS_PER_NODE, steps, size / (1 << 20)))
        base, records = best_of(args.repeat, lambda: replay(root, False))
        full, report = best_of(args.repeat, lambda: replay(root, True))
        metas, good = best_of(args.repeat, lambda: from_metas(root).report())
        fed = from_metas(root)
        alone, _ = best_of(args.repeat, fed.report)
        judge_kept(root)
        judged, answer = best_of(args.repeat, lambda: judges_answer(root))
        print("baseline: plain replay of %d records  %8.0f ms" % (records, base * 1000))
        print("goodput: replay + reducer + report     %8.0f ms  (%.2fx the replay)"
              % (full * 1000, full / base))
        print("goodput from metas (read_metas)        %8.0f ms  (%.2fx the replay)"
              % (metas * 1000, metas / base))
        print("report alone                           %8.0f ms" % (alone * 1000))
        print("the judge's report read (no replay)    %8.2f ms  (1/%.0f of the replay)"
              % (judged * 1000, base / max(judged, 1e-9)))
        print("goodput %.4f, buckets %s, steps redone %d" % (
            report["goodput"], {k: round(v, 1) for k, v in report["buckets"].items()},
            report["incidents"][0]["steps_redone"]))
        assert good == report, "the two readings differ"
        assert {k: v for k, v in answer.items() if k not in ("source", "as_of_s")} == report, \
            "the judge's report differs from the replay"
        if args.mem_steps:
            size, secs = reducer_memory(args.mem_ranks, args.mem_steps)
            print("reducer at %d ranks x %d steps: %.2f MB held (every step kept: %.0f MB), "
                  "fed in %.0f s" % (args.mem_ranks, args.mem_steps, size / 1e6,
                                     16 * args.mem_ranks * args.mem_steps / 1e6, secs))
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
