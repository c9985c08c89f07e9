"""The reference trainer under Hugging Face Accelerate (``accelerate launch``).

The same model, data, flags, output lines and checkpoint/resume as trainer/train.py; the
process group is joined by ``Accelerator`` (gloo on CPU, NCCL on GPUs) and the model and
optimizer are wrapped by ``Accelerator.prepare`` instead of DDP by hand. Run it with
``rankdeck launch --launcher accelerate ... trainer/accel_train.py``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `trainer` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from trainer.train import Trainer, main

_accelerator: list[Accelerator] = []


def join(args) -> None:
    """Let Accelerate join the process group, with the collective timeout of --pg-timeout."""
    _accelerator.append(Accelerator(cpu=args.device == "cpu", kwargs_handlers=[
        InitProcessGroupKwargs(timeout=timedelta(seconds=args.pg_timeout))]))


class AccelTrainer(Trainer):
    """trainer/train.py's Trainer, its model and optimizer prepared by Accelerate."""

    wrap_ddp = False

    def __init__(self, args, ranks) -> None:
        super().__init__(args, ranks)
        if ranks.distributed:
            self.model, self.optimizer = _accelerator[0].prepare(self.module, self.optimizer)


if __name__ == "__main__":
    main(make_trainer=AccelTrainer, join=join)
