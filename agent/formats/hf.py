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
# redraws its bar must not grow the agent's memory).
_KEEP = 64


class _Worker:
    __slots__ = ("total", "step", "sent", "writes", "clears", "after_clear", "pending", "steps")

    def __init__(self):
        self.total = None  # the training bar's total: other desc-less bars are not it
        self.step = None  # the bar's latest count
        self.sent = None  # the last step put in a record
        self.writes = 0  # dict lines seen on stdout
        self.clears = 0  # bar clears seen on stderr
        self.after_clear = 0  # the clear whose redraw comes next
        self.pending = {}  # write number -> record waiting for its step
        self.steps = {}  # clear number -> step, waiting for its dict


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
        elif state.clears == 0 and number > 2:
            # A bar that is never cleared for a dict (the dicts are not written through
            # tqdm): pairing cannot work, the bar's latest count is the best step there is.
            for older in sorted(state.pending):
                late = state.pending.pop(older)
                late["step"] = state.step
                out.append(late)
            rec["step"] = state.step
            out.append(rec)
        else:
            state.pending[number] = rec
            _trim(state.pending, number)

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
