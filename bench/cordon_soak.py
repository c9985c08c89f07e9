"""Cordons in a row over SSH: is the spare stepping after every one?

Each round is tests/e2e/test_ssh_cordon.py once: 5 fresh SSH test hosts in network namespaces
(tests/e2e/sshhosts.py; node4 a warm spare that hosts the store and the judge), real torchrun,
gloo, the reference trainer; rank 2 hangs at step 6, the console goes away, and
`rankdeck cordon RUN --node node2 --yes` from a new shell puts the spare in. A round passes when
the cordon said `done` (the spare's ranks stepping: agent/rules/cordon.py, the ``join`` step)
and `rankdeck status RUN --json` then shows the new world: each rank 0-3 once, every one
running past step 8, one on node4, none on node2 and no stale rank of the old world.

    .venv/bin/python bench/cordon_soak.py [--rounds 10]

Not in the suite (a round takes 1-3 minutes on a loaded 2-core machine; the suite keeps one).
Never a test of timings. Results go in docs/BENCHMARKS.md ("Cordons in a row").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST = "tests/e2e/test_ssh_cordon.py"


def one_round(k: int) -> tuple[bool, float, str]:
    """(passed, seconds, the last status line or the failure's last lines) of round ``k``."""
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-s", "-p",
                          "no:cacheprovider", TEST], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=900)
    took = time.monotonic() - began
    said = [line for line in out.stdout.splitlines() if line.startswith("status:")]
    passed = out.returncode == 0 and re.search(r"\b1 passed\b", out.stdout) is not None
    tail = said[-1] if passed and said else "\n".join(out.stdout.splitlines()[-15:])
    return passed, took, tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    good = 0
    for k in range(1, args.rounds + 1):
        passed, took, tail = one_round(k)
        good += passed
        print("round %d: %s in %.0f s: %s" % (k, "spare stepping" if passed else "FAILED",
                                             took, tail), flush=True)
    print("%d of %d cordons left the spare stepping and no stale rank" % (good, args.rounds))
    return 0 if good == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
