"""The PyTorch Lightning family: its tqdm training bar and the metrics logged into it.

Lightning's ``TQDMProgressBar`` (lightning/pytorch/callbacks/progress/tqdm_progress.py, the
default when ``rich`` is not installed) draws on stdout::

    \\rEpoch 1:  40%|████      | 4/10 [00:00<00:00, 40.00it/s, v_num=0, train_loss=1.230]

The count is the batch within the epoch, so the step is the last step of the epoch before plus
the count (the optimizer step unless ``accumulate_grad_batches`` > 1; the first epoch read
starts at ``epoch * total``); values
logged with ``self.log(..., prog_bar=True)`` follow the rate. A resumed run prints (stderr) ``Restored all states from the checkpoint at
.../epoch=2-step=25.ckpt`` and, when it resumed in mid-epoch, a ``Training: | 6/? [...]`` bar
until the next epoch: steps carry on from the checkpoint's. ``RichProgressBar`` draws nothing line-based into a log file (only its last
frame, when the run ends); use ``--metrics-regex`` or the tqdm bar there. Validation and
sanity-check bars are ignored. Standard library only; runs on Python >= 3.8.
"""

import re

from .values import NUM, to_float

_BAR = re.compile(r"Epoch ([0-9]{1,9}):\s+[0-9]{1,3}%\|[^|\r\n]{0,200}\|\s*([0-9]{1,12})/([0-9]{1,12}|\?)"
                  r" \[([^\]\r\n]{0,2000})\]", re.ASCII)
# After a resume in mid-epoch the bar reads "Training: | 6/? [...]" until the next epoch.
_RESUMED_BAR = re.compile(r"Training: \|[^|\r\n]{0,200}\|\s*([0-9]{1,12})/\? \[([^\]\r\n]{0,2000})\]",
                          re.ASCII)
_RESTORED = re.compile(r"Restored all states from the checkpoint at .*step=([0-9]{1,12})", re.ASCII)
_POSTFIX = re.compile(r"([A-Za-z_][\w/.-]{0,80})=(" + NUM + ")(?=,|$)", re.ASCII)


def _loss_key(keys):
    """The training loss among the bar's metrics: ``loss``, ``train_loss``, or a ``*loss*``."""
    for key in ("loss", "train_loss", "train_loss_step", "train/loss"):
        if key in keys:
            return key
    for key in keys:
        low = key.lower()
        if "loss" in low and not low.startswith(("val", "test")):
            return key
    return None


class _Bar:
    __slots__ = ("epoch", "base", "last", "resumed", "first", "values")

    def __init__(self):
        self.epoch = None  # the epoch the bar is in
        self.base = None  # the global step before the epoch's first batch
        self.last = None  # the latest global step read
        self.resumed = None  # the step of the checkpoint this run resumed from
        self.first = None  # the first count of a resumed epoch's "Training: n/?" bar
        self.values = (None, None)  # the (step, loss) read last


class LightningFamily:
    """PyTorch Lightning's training bar, and the checkpoint a run resumed from."""

    name = "lightning"
    keywords = ("it/s", "s/it", "checkpoint")

    def segment(self, seg, worker, out):
        if "Epoch " in seg:
            m = _BAR.search(seg)
            if m is None:
                return False
            bar = self._state(worker)
            epoch, n, total = int(m.group(1)), int(m.group(2)), m.group(3)
            if epoch != bar.epoch:
                bar.epoch = epoch
                if bar.last is not None:
                    bar.base = bar.last
                elif bar.resumed is not None:
                    bar.base = bar.resumed
                else:
                    bar.base = epoch * int(total) if total != "?" else None
            if n == 0:
                return True  # an epoch's bar reset, before its first batch
            step = bar.base + n if bar.base is not None else None
            self._record(bar, step, m.group(4), out)
            return True
        if "Training: " in seg:
            m = _RESUMED_BAR.search(seg)
            if m is None:
                return False
            bar = self._state(worker)
            n = int(m.group(1))
            if bar.resumed is None or n == 0 or bar.epoch is not None:
                return True
            if bar.first is None:
                bar.first = n
            self._record(bar, bar.resumed + n - bar.first + 1, m.group(2), out)
            return True
        if "Restored all states from the checkpoint at " in seg:
            m = _RESTORED.search(seg)
            if m is not None:
                self._state(worker).resumed = int(m.group(1))
                return True
        return False

    @staticmethod
    def _state(worker):
        bar = worker.get("lightning")
        if bar is None:
            bar = worker["lightning"] = _Bar()
        return bar

    @staticmethod
    def _record(bar, step, postfix, out):
        values = dict(_POSTFIX.findall(postfix))
        key = _loss_key(values)
        loss = to_float(values[key]) if key is not None else None
        last_step, last_loss = bar.values
        if step == last_step and loss == last_loss:
            return  # a redraw of what was read already
        bar.values = (step, loss)
        if step is not None:
            bar.last = step
        rec = {"k": "metric", "step": step}
        # A new count is drawn first with the previous batch's values, then redrawn with
        # this batch's: an unchanged loss on a new count is not this step's loss.
        if loss is not None and loss != last_loss:
            rec["loss"] = loss
        if "lr" in values:
            rec["lr"] = to_float(values["lr"])
        if step is not None or len(rec) > 2:
            out.append(rec)
