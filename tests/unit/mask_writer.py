"""A stand-in for torchrun (LaunchSpec.launcher) that writes the run's secret in pieces.

It starts one worker (RANK 0) writing into torchrun's --log-dir layout under
$RANKDECK_LOG_DIR: a line whose secret ($API_TOKEN, from the inventory) comes in two writes
a moment apart, then a line longer than the console's 64 KiB pieces with the secret across
the place where it is cut. The agent reads each write as its own piece of data.
"""

import os
import subprocess
import sys
import time

PIECE = 64 * 1024  # console/lines/lines.py MAX_PARTIAL


def worker(path, secret):
    with open(path, "ab", buffering=0) as out:
        out.write(("step 1 key=" + secret[:6]).encode())
        time.sleep(0.6)
        out.write((secret[6:] + " done\n").encode())
        out.write(("x" * (PIECE - 5) + secret[:10]).encode())
        time.sleep(0.6)
        out.write((secret[10:] + " tail\n").encode())
        out.write(b"finished\n")


def main():
    if os.environ.get("MASK_WORKER"):
        worker(os.environ["MASK_PATH"], os.environ["API_TOKEN"])
        return 0
    base = os.path.join(os.environ["RANKDECK_LOG_DIR"], "mask_x", "attempt_0", "0")
    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, "stdout.log")
    open(path, "ab").close()
    env = dict(os.environ, MASK_WORKER="1", MASK_PATH=path, LOCAL_RANK="0", RANK="0",
               TORCHELASTIC_RESTART_COUNT="0")
    return subprocess.call([sys.executable, __file__], env=env)


if __name__ == "__main__":
    sys.exit(main())
