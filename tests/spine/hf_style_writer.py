"""A training loop that prints as a Hugging Face Trainer does, one way per rank (no torch).

Usage: hf_style_writer.py STEPS STEP_SECONDS

Every rank steps STEPS times, a step STEP_SECONDS long, and logs a loss at every step
(``logging_steps=1``): the progress bar on stderr (``\\r 3%|▎ | 1/30 [...]``), the dict
``{'loss': ...}`` on stdout. How the two are written differs by rank, as trainers do:

- rank 0: tqdm itself, as transformers' ProgressCallback uses it: ``bar.update(1)`` at the
  step's end, then ``tqdm.write(str(logs))`` (the bar cleared on stderr, the dict on stdout,
  the bar drawn again); stdout is a file under torchrun, so the dicts leave in blocks;
- rank 1: the same bytes written by hand, each write flushed in tqdm's order;
- otherwise: the bar drawn and flushed, then the dict printed and flushed, no clear (a loop
  that prints its own dict below its own bar).

The loss of step N is ``1/N`` with 6 digits, so a reader can tell which step each loss is.
"""

import os
import sys
import time

STEPS, PERIOD = int(sys.argv[1]), float(sys.argv[2])
RANK = int(os.environ.get("RANK", "0"))


def loss(step):
    return round(1.0 / step, 6)


def bar_text(n, total):
    done = n * 10 // total
    return "%3d%%|%s%s| %d/%d [00:0%d<00:0%d,  9.50it/s]" % (
        n * 100 // total, "#" * done, " " * (10 - done), n, total, n % 10, (total - n) % 10)


def tqdm_loop():
    from tqdm.auto import tqdm
    bar = tqdm(total=STEPS)
    for step in range(1, STEPS + 1):
        time.sleep(PERIOD)
        bar.update(1)
        bar.write(str({"loss": loss(step), "learning_rate": 5e-05, "epoch": step / STEPS}))
    bar.close()


def by_hand(clear):
    err, out = sys.stderr, sys.stdout
    last = ""
    err.write("\r" + bar_text(0, STEPS))
    err.flush()
    for step in range(1, STEPS + 1):
        time.sleep(PERIOD)
        last = "\r" + bar_text(step, STEPS)
        err.write(last)
        err.flush()
        if clear:
            err.write("\r" + " " * (len(last) - 1))
            err.flush()
            err.write("\r")
            err.flush()
        out.write(str({"loss": loss(step), "learning_rate": 5e-05, "epoch": step / STEPS}) + "\n")
        out.flush()
        if clear:
            err.write(last)
            err.flush()
    err.write("\n")
    err.flush()


if RANK == 0:
    tqdm_loop()
else:
    by_hand(clear=RANK == 1)
