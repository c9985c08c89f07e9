"""The checkpoint a rank resumed from, read from the lines trainers print when they load one.

- reference trainer (trainer/train.py):  ``resumed step=50 from=/abs/ckpt/step_00000050.pt``
- Hugging Face Trainer (log_level="info"): ``Loading model from out/checkpoint-500.`` then
  ``Resuming training from checkpoint with epoch 1 and global step 500`` (transformers 5;
  4.x printed ``Continuing training from global step 500``)
- PyTorch Lightning: ``Restored all states from the checkpoint at /ckpt/epoch=2-step=25.ckpt``
- a script that passes ``resume_from_checkpoint`` to a Hugging Face Trainer and says so first
  (as transformers' examples do): ``Resuming from checkpoint out/checkpoint-150``

Each gives a ``resumed`` record with the ``step``, the ``path`` or both; the console joins a
node's two Hugging Face lines. Standard library only; runs on Python >= 3.8.
"""

import re

from .plain import step_from_path
from .values import to_int

_LOADING = "Loading model from "
_KEYWORDS = ("resumed step=", _LOADING, "global step ", "Restored all states",
             "Resuming from checkpoint")
_PATTERNS = (
    re.compile(r"\bresumed step=(?P<step>[0-9]{1,12}) from=(?P<path>\S{1,4096})", re.ASCII),
    re.compile(r"\bLoading model from (?P<path>\S.{0,4095}?)\.?\s*$", re.MULTILINE),
    re.compile(r"\b(?:Resuming|Continuing) training from (?:checkpoint with epoch [0-9]+ and )?"
               r"global step (?P<step>[0-9]{1,12})", re.ASCII),
    re.compile(r"\bRestored all states from the checkpoint at (?P<path>\S.{0,4095}?)\s*$",
               re.MULTILINE),
    re.compile(r"\bResuming from checkpoint:? (?P<path>\S{1,4096}?)[.,]?(?=\s|$)"),
)


def resumed_records(text, mentioned=None):
    """``{"k": "resumed", "step": int|None, "path": str|None}`` for each resume line in
    ``text`` (one chunk of a rank's output). ``mentioned``: the metric keywords ``text``
    mentions when the metrics parser scanned it already (agent/formats/metrics.py ``mentioned``):
    every resume line but Hugging Face's ``Loading model from`` says ``step`` or
    ``checkpoint``, so a chunk without either costs one scan here instead of four."""
    keywords = _KEYWORDS
    if mentioned is not None and "step" not in mentioned and "checkpoint" not in mentioned:
        keywords = (_LOADING,)
    if not any(k in text for k in keywords):
        return []
    out = []
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            found = m.groupdict()
            path = found.get("path")
            step = to_int(found["step"]) if found.get("step") else step_from_path(path)
            out.append((m.start(), {"k": "resumed", "step": step, "path": path}))
    return [rec for _, rec in sorted(out, key=lambda item: item[0])]
