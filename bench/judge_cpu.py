"""CPU of the run's judge (agent/judge/judge.py) on its host, against the supervisor alone.

The workload of bench/agent_cpu.py (one local node, real torchrun with NPROC ranks printing
RATE lines a second each, the real supervisor, the real ``agent serve`` streaming to a
RunController), run in pairs: once with the judge (the controller starts it beside the
rendezvous store; the supervisor's judge link forwards its journal's metas to it, the
console follows its journal through ``serve``) and once without (the node spec carries no
``judge``, as from a console older than the judge: no link, no judge process). The two
alternate, and which comes first alternates from pair to pair, so that the shared machine's
load falls on both alike. Over each window of SECONDS: utime+stime of the judge, the
supervisor and serve (every thread; agent_cpu.cpu_of), as % of one core, and the ratios:

- judge / supervisor alone (the supervisor of the run without a judge),
- the link's cost in the supervisor (with - without) / supervisor alone,
- the judge's whole cost on the host (judge + link + serve's extra) / supervisor alone.

    .venv/bin/python bench/judge_cpu.py [--pairs 3] [--seconds 60] [--nproc 8] [--rate 10]

Target: the judge under ~0.5 % of a core at this rate. CPU seconds, not wall time.
Never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_cpu import REPO, measure, pct  # noqa: E402  (this folder's sibling bench)


def one(seconds: float, nproc: int, rate: float, judge: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="rdk-judgecpu-") as work:
        r = asyncio.run(measure(seconds, nproc, rate, work, judge=judge))
    return {g: pct(c, r["wall"]) for g, c in r["cpu"].items()} | {
        "lines": r["lines"] / r["wall"],
        "judge_wakes": r["wakes"].get("judge", 0) / r["wall"],
        "sup_wakes": r["wakes"]["supervisor"] / r["wall"]}


def table(pairs: list[tuple[dict, dict]]) -> None:
    rows = [("judge process", lambda w, o: w["judge"]),
            ("supervisor, with the judge", lambda w, o: w["supervisor"]),
            ("supervisor alone (no judge)", lambda w, o: o["supervisor"]),
            ("serve, with the judge", lambda w, o: w["serve"]),
            ("serve, no judge", lambda w, o: o["serve"]),
            ("judge / supervisor alone (x)", lambda w, o: w["judge"] / o["supervisor"]),
            ("link: supervisor with - alone", lambda w, o: w["supervisor"] - o["supervisor"]),
            ("link / supervisor alone (x)",
             lambda w, o: (w["supervisor"] - o["supervisor"]) / o["supervisor"]),
            ("all the judge costs (judge + deltas)",
             lambda w, o: w["judge"] + w["supervisor"] - o["supervisor"] + w["serve"]
             - o["serve"]),
            ("judge wake-ups a second", lambda w, o: w["judge_wakes"]),
            ("supervisor wake-ups/s, with / alone",
             lambda w, o: "%.1f / %.1f" % (w["sup_wakes"], o["sup_wakes"])),
            ("lines a second at the console, with / alone",
             lambda w, o: "%.0f / %.0f" % (w["lines"], o["lines"]))]
    print("%% of one core, %d pairs (with the judge, without)" % len(pairs))
    print("%-46s %s   median" % ("", "  ".join("pair %-3d" % (i + 1) for i in range(len(pairs)))))
    for name, fn in rows:
        vals = [fn(w, o) for w, o in pairs]
        if isinstance(vals[0], str):
            print("%-46s %s" % (name, "  ".join("%8s" % v for v in vals)))
            continue
        print("%-46s %s  %7.3f" % (name, "  ".join("%8.3f" % v for v in vals),
                                  statistics.median(vals)))


def main() -> int:
    sys.path.insert(0, REPO)
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0, help="lines a second, per rank")
    args = ap.parse_args()
    pairs = []
    for i in range(args.pairs):
        got = {}
        for judge in ((True, False) if i % 2 == 0 else (False, True)):
            got[judge] = one(args.seconds, args.nproc, args.rate, judge)
            print("pair %d, %s: judge %.3f %%, supervisor %.3f %%, serve %.3f %%" % (
                i + 1, "with the judge" if judge else "no judge", got[judge].get("judge", 0.0),
                got[judge]["supervisor"], got[judge]["serve"]), flush=True)
        pairs.append((got[True], got[False]))
    table(pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
