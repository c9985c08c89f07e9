"""A checkpoint asked for from outside the trainer: rankdeck's hook before a Slurm time limit.

rankdeck's supervisor puts ``RANKDECK_CHECKPOINT_REQUEST`` (a file's path) in every rank's
environment and writes that file when the run should save now: ``--signal-before SECONDS``
before its Slurm job's time limit (docs/SLURM.md). The file's first word is the request's
number (the same on every node: the job's end time as digits), the rest says why in words.

A file, not a signal: it reaches the ranks under any launcher (torchrun handles no SIGUSR1 or
SIGUSR2: either would end it, not reach them), costs one small read per step, and a request
made while a rank is inside a collective waits for the next step boundary.

Each node's supervisor writes its own node's file, a few seconds apart: the ranks agree on the
highest number any of them sees (one all_reduce MAX) and answer it once, so the nodes whose
request comes later do not save again. Copy this class into your own training script
(standard library only), then at each step boundary::

    asked = CheckpointRequest()
    ...
    wanted = torch.tensor([asked.number()]); dist.all_reduce(wanted, op=dist.ReduceOp.MAX)
    if int(wanted) and int(wanted) != asked.done:
        save_checkpoint()
        asked.answered(int(wanted))
"""

from __future__ import annotations

import os

ENV = "RANKDECK_CHECKPOINT_REQUEST"


class CheckpointRequest:
    """The request in the file ``path`` (default: the environment's
    ``RANKDECK_CHECKPOINT_REQUEST``; none: never one)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get(ENV) or None
        self.done = 0  # the number of the request answered last

    def _read(self) -> str:
        if self.path is None:
            return ""
        try:
            with open(self.path, errors="replace") as f:
                return f.read(300)
        except OSError:
            return ""

    def number(self) -> int:
        """The request's number, 0 without one (no file, or not a request)."""
        words = self._read().split(maxsplit=1)
        return int(words[0]) if words and words[0].isdigit() else 0

    def pending(self) -> bool:
        """A request this process has not answered (one process: no agreeing needed)."""
        return self.number() not in (0, self.done)

    def answered(self, number: int | None = None) -> None:
        """Request ``number`` (default: the file's) was answered with a checkpoint."""
        self.done = self.number() if number is None else number

    def reason(self) -> str:
        """What the request says (who asked and why), for the trainer's line."""
        words = self._read().strip().split(maxsplit=1)
        return words[1] if len(words) > 1 else ""
