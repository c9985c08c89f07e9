"""The Hugging Face Trainer family: its dict lines, its tqdm bar and its checkpoint line.

What a Trainer prints on the main process (transformers 4 and 5)::

    stdout: {'loss': '3.889', 'grad_norm': '1.077', 'learning_rate': '5e-05', 'epoch': '0.03125'}
    stderr: \\r 25%|██▌       | 10/40 [00:03<00:06,  4.40it/s]
    stderr: [transformers] Saving model checkpoint to out/checkpoint-500   (log_level="info")

The dict has no step; the step is the bar's count. Every dict goes through ``tqdm.write``,
which clears the bar (a ``\\r<blanks>\\r`` segment on stderr), prints the dict on stdout and
redraws the bar at the step just logged. So the n-th clear on a worker's stderr belongs to the
n-th dict on its stdout, and the bar drawn after that clear is the dict's step. Pairing by
count, not by arrival, makes it right whichever of the two files is read first, and when
both are one file. A worker with no bar at all (``disable_tqdm=True``) gets ``step: None``.

A loop that prints its own dict below its own bar, with no clear between them, gives nothing
to pair by: a dict there takes the bar's step in force when it was written. The agent's
reader hands a worker's stderr over before the stdout it read just before it
(agent/host/tail.py), so the bar drawn before a dict is in or before the dict's chunk; the
dicts of one chunk take the last counts the bar drew since the dict before, one each (a loop
that logs each step and steps faster than the agent reads: each dict its own step). A bar
drawn after a dict but before the reader's next turn gives that dict a later step: with no
clear, the two files do not say which came first.

The bar also gives the step between logs (``logging_steps`` defaults to 500): a bar that moved
yields a step-only record, at most one per chunk. A resumed run's bar jumps to the resumed
step. Standard library only; runs on Python >= 3.8.
"""

import re

from .values import NUM, convert
from .plain import step_from_path

# A desc-less tqdm bar at the start of a segment: `` 25%|██▌       | 10/40 [``. Bars with a
# description ("Writing model shards:", "Map:") are other work, not the training loop.
_BAR = re.compile(r"\s*[0-9]{1,3}%\|[^|\r\n]{0,200}\|\s*([0-9]{1,12})/([0-9]{1,12}) \[", re.ASCII)

# Values may be quoted (transformers 5) or wrapped (``tensor(1.2)``, ``np.float64(1.2)``).
# The quote before the key keeps ``'train_loss'`` (the final average) and ``'eval_loss'`` out.
_DICT_KV = re.compile(
    r"""['"](loss|learning_rate)['"]\s*:\s*['"]?(?:[A-Za-z_][\w.]*\()?(""" + NUM + ")",
    re.ASCII,
)
_DICT_FIELD = {"loss": "loss", "learning_rate": "lr"}
_DICT_LINE = re.compile(r"""\s*\{\s*['"]\w""")
_CKPT = re.compile(r"Saving (?:model )?checkpoint to\s+(.+)")

# Pairs kept waiting for their other half; older ones are dropped (a worker that never
# redraws its bar must not grow the agent's memory). A Trainer's stdout is a file under
# torchrun, written in blocks of 8 KiB: a block holds ~100 dicts whose clears were all read
# before it, and each must still find its step.
_KEEP = 1024


class _Worker:
    __slots__ = ("total", "step", "sent", "writes", "clears", "after_clear", "pending", "steps",
                 "drawn")

    def __init__(self):
        self.total = None  # the training bar's total: other desc-less bars are not it
        self.step = None  # the bar's latest count
        self.sent = None  # the last step put in a record
        self.writes = 0  # dict lines seen on stdout
        self.clears = 0  # bar clears seen on stderr
        self.after_clear = 0  # the clear whose redraw comes next
        self.pending = {}  # write number -> record waiting for its step
        self.steps = {}  # clear number -> step, waiting for its dict
        self.drawn = []  # the counts the bar drew since the last dict with no clear took one


class HuggingFaceFamily:
    """Hugging Face Trainer output, stdout and stderr of one worker together."""

    name = "hf"
    keywords = ("loss", "it/s", "s/it", "checkpoint")

    def segment(self, seg, worker, out):
        state = worker.get("hf")
        if seg.isspace():
            if state is None:
                return False
            # tqdm clears a bar by overwriting it with blanks: a dict line is being written.
            state.clears += 1
            state.drawn = []  # pairing by clears: no dict takes a count drawn
            state.after_clear = state.clears
            return True
        bar = _BAR.match(seg)
        if bar is not None:
            if state is None:
                state = worker["hf"] = _Worker()
            self._bar(state, int(bar.group(1)), int(bar.group(2)), out)
            # a log line written right after the bar, with no newline between them
            if "heckpoint" in seg:
                self._checkpoint(seg, bar.end(), out)
            return True
        if "heckpoint" in seg and self._checkpoint(seg, 0, out):
            return True
        if "{" in seg and _DICT_LINE.match(seg) is not None and seg.rstrip().endswith("}"):
            if state is None:
                state = worker["hf"] = _Worker()
            self._dict(state, seg, out)
            return True
        return False

    def _bar(self, state, n, total, out):
        if state.total is None:
            state.total = total
        elif total != state.total:
            return  # an evaluation bar, or another loop's
        state.step = n
        if state.after_clear:
            number, state.after_clear = state.after_clear, 0
            rec = state.pending.pop(number, None)
            if rec is not None:
                rec["step"] = n
                state.sent = n
                out.append(rec)
                return
            state.steps[number] = n
            _trim(state.steps, number)
        if state.clears == 0 and n > 0 and (not state.drawn or n > state.drawn[-1]):
            state.drawn.append(n)
            if len(state.drawn) > _KEEP:
                del state.drawn[0]
        if n > 0 and (state.sent is None or n > state.sent):
            state.sent = n
            # one step-only record per chunk: replace this worker's previous one
            if out and out[-1].get("_bar") is state:
                out[-1]["step"] = n
            else:
                out.append({"k": "metric", "step": n, "_bar": state})

    def _dict(self, state, seg, out):
        state.writes += 1
        number = state.writes
        rec = None
        for key, value in _DICT_KV.findall(seg):
            field = _DICT_FIELD[key]
            if rec is None:
                rec = {"k": "metric", "step": None}
            if field not in rec:
                rec[field] = convert(field, value)
        # Only a training-loss line is a metric: ``{'train_runtime': .., 'train_loss': ..}``
        # and ``{'eval_loss': ..}`` never matched ``'loss'``; they still took a bar clear.
        if rec is None or "loss" not in rec:
            state.steps.pop(number, None)
            return
        step = state.steps.pop(number, None)
        if step is not None:
            rec["step"] = step
            state.sent = step if state.sent is None else max(state.sent, step)
            out.append(rec)
        elif state.total is None:
            out.append(rec)  # no bar on this worker: the step is not known
        else:
            # its clear is still to come (the other file read behind this one), or there is
            # none (chunk_end decides once a third dict has come with no clear at all)
            state.pending[number] = rec
            _trim(state.pending, number)

    @staticmethod
    def chunk_end(worker, out):
        """At the end of a chunk: the dicts of a bar that is never cleared for a dict (not
        written through tqdm) take the bar's counts drawn since the dict before (the last
        ones, one each, the newest to the last dict); pairing cannot work for them."""
        state = worker.get("hf")
        if state is None or state.clears or state.writes <= 2 or not state.pending:
            return
        waiting = [state.pending.pop(number) for number in sorted(state.pending)]
        drawn = state.drawn[-len(waiting):] or [state.step]
        drawn = [drawn[0]] * (len(waiting) - len(drawn)) + drawn
        for rec, step in zip(waiting, drawn):
            rec["step"] = step
            out.append(rec)
        state.sent = step if state.sent is None else max(state.sent, step)
        state.drawn = []

    @staticmethod
    def _checkpoint(seg, start, out):
        m = _CKPT.search(seg, start)
        if m is None:
            return False
        path = m.group(1).rstrip()
        step = step_from_path(path)
        if step is None:
            return False
        out.append({"k": "ckpt", "step": step, "path": path, "bytes": None})
        return True


def _trim(table, newest):
    if len(table) > _KEEP:
        for key in [k for k in table if k <= newest - _KEEP]:
            del table[key]
