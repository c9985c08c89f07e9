"""The reference trainer under DeepSpeed (``deepspeed`` launcher, ``deepspeed.initialize``).

The same model, data, flags and output lines as trainer/train.py; the model is trained by a
DeepSpeed engine with ZeRO stage 1 (optimizer states partitioned over the ranks; on CPU over
gloo). Checkpoints are DeepSpeed's (``engine.save_checkpoint``: every rank writes its part,
one folder ``step_<n>`` per save), printed and resumed like trainer/train.py's:

    checkpoint saved step=50 path=/abs/ckpt/step_00000050 bytes=123456   (local rank 0)
    resumed step=50 from=/abs/ckpt/step_00000050                       (every rank)

Every rank loads its own part of a checkpoint, so on more than one node ``--ckpt-dir`` must be
a folder every node shares: where some ranks see a checkpoint and others none, every rank
stops with the reason rather than train one world from two states.

DeepSpeed's launcher passes ``--local_rank=N``; it is read from the environment instead.
Run it with ``rankdeck launch --launcher deepspeed ... trainer/ds_train.py``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `trainer` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import deepspeed

from trainer import faults
from trainer.train import Trainer, main

TAG = "step_%08d"


def join(args) -> None:
    """DeepSpeed joins the process group (gloo on CPU), with --pg-timeout for collectives.

    On CPU, DeepSpeed's communication backend first compiles a shared-memory all-reduce op
    (C++, at first use; minutes on a loaded machine, and a compiler on every host): left out
    here, the ranks' collectives go through gloo alone."""
    if args.device != "cuda":
        # by its module's name: `import deepspeed.comm.torch as m` finds deepspeed.comm's
        # `torch` attribute, which is torch itself
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo" if args.device != "cuda" else "nccl",
                               timeout=timedelta(seconds=args.pg_timeout))


class DSTrainer(Trainer):
    """trainer/train.py's Trainer, its steps and checkpoints through a DeepSpeed engine."""

    wrap_ddp = False

    def __init__(self, args, ranks) -> None:
        super().__init__(args, ranks)
        config = {
            "train_micro_batch_size_per_gpu": args.batch_size,
            "gradient_accumulation_steps": args.grad_accum,
            "gradient_clipping": args.clip_grad,
            "zero_optimization": {"stage": 1},
            "steps_per_print": 10 ** 9,  # the trainer prints its own step lines
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.module, optimizer=self.optimizer, lr_scheduler=self.scheduler,
            config=config)
        self.model = self.engine

    def train_step(self, batches) -> float:
        total = 0.0
        for _ in range(self.args.grad_accum):
            tokens, targets = (t.to(self.ranks.device) for t in next(batches))
            loss = self.engine(tokens, targets)
            self.engine.backward(loss)
            self.engine.step()  # an optimizer step at the accumulation boundary only
            total += loss.item() / self.args.grad_accum
        return total

    def save(self) -> None:
        """Every rank writes its part (a collective); local rank 0 reports the folder."""
        self.last_saved = self.step
        tag = TAG % self.step
        self.engine.save_checkpoint(str(self.args.ckpt_dir), tag=tag,
                                    client_state={"step": self.step})
        if self.ranks.local_rank != 0:
            return
        path = self.args.ckpt_dir / tag
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        print(f"checkpoint saved step={self.step} path={path} bytes={size}", flush=True)
        kept = sorted(p for p in self.args.ckpt_dir.glob("step_*") if p.is_dir())
        for old in kept[:-self.args.keep_ckpts] if self.args.keep_ckpts else []:
            shutil.rmtree(old, ignore_errors=True)

    def resume(self, arm):
        """Load the newest DeepSpeed checkpoint (its ``latest`` file), if there is one."""
        seen = faults.fired_markers(arm, self.args.ckpt_dir)
        here = (self.args.ckpt_dir / "latest").exists()
        gathered = self.ranks.all_gather((sorted(seen, key=repr), here))
        fired = {f for marks, _here in gathered for f in marks}
        found = [rank for rank, (_marks, has) in enumerate(gathered) if has]
        if found and len(found) < len(gathered):
            # every rank loads its own part of the checkpoint (ZeRO): some resuming and some
            # starting over would train one world from two different states
            raise SystemExit(
                f"ds_train.py: ranks {found} see a checkpoint in {self.args.ckpt_dir}, the "
                "others do not: DeepSpeed's checkpoints need a folder every node shares "
                "(--ckpt-dir, or RANKDECK_CKPT_DIR in the run's environment)")
        if not here:
            return faults.armed(arm, fired, 0)
        path, client = self.engine.load_checkpoint(str(self.args.ckpt_dir))
        if path is None:
            return faults.armed(arm, fired, 0)
        self.step = self.last_saved = int(client["step"])
        print(f"resumed step={self.step} from={os.path.dirname(path)}", flush=True)
        return faults.armed(arm, fired, self.step)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("--local_rank")],
         make_trainer=DSTrainer, join=join)
