"""The plain family: rankdeck's reference trainer, ``key=value`` lines and plain prints.

Reads, in order of precedence on a line:

* checkpoints: the reference trainer's ``checkpoint saved step=50 path=/x/step_00000050.pt
  bytes=123456``;
* ``key=value`` pairs (``step=12 loss=4.1234 lr=3.000e-04 step_time=0.0163 tok/s=12345``), in
  any order and after any prefix, plus ``key: value`` pairs on a line that has a step. This is
  what accelerate scripts usually print (``accelerator.print(f"step={step} loss={loss}")``).

The reference line itself is matched by :data:`REFERENCE` straight from the chunk (the hot
path in :mod:`agent.formats.metrics`). Every pattern is linear on hostile input (long digit or blank
runs). Standard library only; runs on Python >= 3.8.
"""

import re

from .values import NUM, convert, to_int

# The reference trainer's line, fields in its order: the common case gets one regex match.
REFERENCE = re.compile(
    r"step=([0-9]{1,18}) loss=(" + NUM + r") lr=(" + NUM + r") step_time=(" + NUM
    + r") tok/s=(" + NUM + r")[ \t\r]*$",
    re.ASCII,
)

# ``(?<![\w/.])`` keeps ``train_loss``, ``eval/loss``, ``x.lr`` and ``max_step`` out.
_KV = re.compile(
    r"(?<![\w/.])(step_time|global_step|step|loss|learning_rate|lr|tok/s|tok_s|tokens/s)\s*([=:])\s*("
    + NUM + ")",
    re.IGNORECASE | re.ASCII,
)
_KV_FIELD = {
    "step_time": "step_time",
    "global_step": "step",
    "step": "step",
    "loss": "loss",
    "learning_rate": "lr",
    "lr": "lr",
    "tok/s": "tok_s",
    "tok_s": "tok_s",
    "tokens/s": "tok_s",
}

_CKPT_REF = re.compile(r"checkpoint saved\b", re.IGNORECASE)
_CKPT_STEP = re.compile(r"(?<![\w/.])step\s*=\s*([0-9]+)", re.ASCII)
_CKPT_BYTES = re.compile(r"(?<![\w/.])bytes\s*=\s*([0-9]+)", re.ASCII)
_CKPT_PATH = re.compile(r"""(?<![\w/.])path\s*=\s*(?:"([^"]*)"|'([^']*)')?""")
# A bare path may hold spaces; it ends before the next `` key=`` or at the end of the line.
_NEXT_KEY = re.compile(r"\s\w+=")
_TRAILING_INT = re.compile(r"([0-9]+)[\\/]*$", re.ASCII)
_SUFFIXED_INT = re.compile(r"([0-9]+)\.[A-Za-z]+$", re.ASCII)


def step_from_path(path):
    """The step a checkpoint path names (``checkpoint-500``, ``step_00000050.pt``), or None."""
    # Only the tail: a search for a trailing digit run is quadratic in a long digit run.
    tail = path[-64:]
    m = _TRAILING_INT.search(tail)
    if m is None:
        m = _SUFFIXED_INT.search(tail)
    return to_int(m.group(1)) if m is not None else None


def reference_record(m):
    """The metric record of a :data:`REFERENCE` match."""
    step, loss, lr, step_time, tok_s = m.groups()
    return {"k": "metric", "step": int(step), "loss": float(loss), "lr": float(lr),
            "step_time": float(step_time), "tok_s": float(tok_s)}


class PlainFamily:
    """``key=value`` metrics and the reference trainer's checkpoint line."""

    name = "plain"
    keywords = ("step", "loss", "checkpoint")

    def segment(self, seg, worker, out):
        if "heckpoint" in seg and self._checkpoint(seg, out):
            return True
        pairs = _KV.findall(seg)
        if not pairs:
            return False
        found = {}
        for key, sep, value in pairs:
            field = _KV_FIELD.get(key.lower())
            if field is not None and field not in found:
                found[field] = (sep, value)
        has_step = "step" in found
        rec = {"k": "metric", "step": None}
        metric = False
        for field, (sep, value) in found.items():
            # ``key: value`` is common prose ("lr: see above"); trust it only on a step line.
            if sep == ":" and not has_step:
                continue
            rec[field] = convert(field, value)
            if field != "step":
                metric = True
        if metric:
            out.append(rec)
        return metric

    @staticmethod
    def _checkpoint(seg, out):
        if _CKPT_REF.search(seg) is None:
            return False
        pm = _CKPT_PATH.search(seg)
        if pm is None:
            return False
        path = pm.group(1) if pm.group(1) is not None else pm.group(2)
        if path is None:
            nm = _NEXT_KEY.search(seg, pm.end())
            path = seg[pm.end():nm.start() if nm is not None else len(seg)].rstrip()
        if not path:
            return False
        sm = _CKPT_STEP.search(seg)
        step = to_int(sm.group(1)) if sm is not None else step_from_path(path)
        if step is None:
            return False
        bm = _CKPT_BYTES.search(seg)
        out.append({"k": "ckpt", "step": step, "path": path,
                    "bytes": to_int(bm.group(1)) if bm is not None else None})
        return True
