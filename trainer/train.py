"""Reference trainer for rankdeck: a small byte-level transformer under DDP.

Run under torchrun (``python -m torch.distributed.run ... trainer/train.py ARGS``) or as a plain
single process (``python trainer/train.py ARGS``). Lines on stdout the console parses, one
per event, flushed as printed:

    rank=0 local_rank=0 world_size=2 device=cpu pid=1234           (every rank, at start)
    resumed step=50 from=/abs/ckpt/step_00000050.pt                (every rank, if resuming)
    step=12 loss=4.1234 lr=3.000e-04 step_time=0.0163 tok/s=12345   (every rank, every --log-every)
    checkpoint saved step=50 path=/abs/ckpt/step_00000050.pt bytes=123456   (local rank 0)
    done steps=200                                                  (every rank, at the end)

SIGTERM: the ranks finish the step they are in, agree to stop, local rank 0 of each node
saves a checkpoint, and every rank exits with 143. A rank that reaches no step boundary within
--term-grace seconds (stuck in a collective) dumps its stacks and exits 143 without saving.
SIGUSR1 dumps all threads' stacks to stderr. A request in the file RANKDECK_CHECKPOINT_REQUEST
names (rankdeck, before a Slurm time limit: trainer/ckpt_request.py) saves a checkpoint at the
next step boundary, and training goes on. Usage errors exit 2 with one "error: ..." line.
"""

from __future__ import annotations

import argparse
import faulthandler
import inspect
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # run as a script: make the `trainer` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import checkpoint, faults
from trainer.data import FileBytes, SyntheticBytes, build_loader, micro_batches
from trainer.model import ByteTransformer, ModelConfig
from trainer.ranks import Ranks, restart_hazard, setup
from trainer.ckpt_request import CheckpointRequest
from trainer.shutdown import EXIT_SIGTERM, StopRequest

EXIT_USAGE = 2
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8, help="micro-batch size per rank")
    p.add_argument("--data", type=Path, help="text file read as bytes (default: synthetic data)")
    p.add_argument("--synthetic-samples", type=int, default=4096)
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad", type=float, default=1.0, help="max grad norm; 0 disables")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--pg-timeout", type=float, default=60.0, help="collective timeout, seconds")
    p.add_argument("--term-grace", type=float, default=10.0,
                   help="after SIGTERM, exit 143 anyway if no step boundary is reached in this many "
                        "seconds (a rank stuck in a collective); 0 waits forever")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--ckpt-dir", type=Path,
                   default=Path(os.environ.get("RANKDECK_CKPT_DIR", "./checkpoints")))
    p.add_argument("--ckpt-every", type=int, default=50, help="0 disables periodic checkpoints")
    p.add_argument("--keep-ckpts", type=int, default=3, help="newest checkpoints kept; 0 keeps all")
    p.add_argument("--hang-at-step", type=int, help="inject: --hang-rank blocks forever before this step")
    p.add_argument("--hang-rank", type=int, default=0, help="global rank that hangs")
    p.add_argument("--crash-at-step", type=int, help="inject: --crash-rank raises before this step")
    p.add_argument("--crash-rank", type=int, default=0, help="global rank that crashes")
    p.add_argument("--crash-always", action="store_true",
                   help="inject: the --crash-at-step fault fires after every restart that "
                        "reaches its step again (a restart loop), not only once")
    p.add_argument("--mismatch-at-step", type=int,
                   help="inject: --mismatch-rank enters a broadcast before this step while the "
                        "others all-reduce its gradients (a collective mismatch: all wait)")
    p.add_argument("--mismatch-rank", type=int, default=0, help="global rank that mismatches")
    p.add_argument("--slow-rank", type=int, help="inject: this global rank is a straggler")
    p.add_argument("--slow-s", type=float, default=0.05,
                   help="seconds --slow-rank spends outside collectives in every step")
    p.add_argument("--slow-at-step", type=int, default=1,
                   help="the first step --slow-rank is slow in (default: every step)")
    p.add_argument("--idle-s", type=float, default=0.0,
                   help="seconds every rank sleeps in every step, outside collectives: stands in "
                        "for time on a GPU, when a real job leaves the CPU idle")
    p.add_argument("--abort-at-exit", type=int, metavar="RANK",
                   help="inject: global rank RANK finishes its last step, then aborts (SIGABRT) "
                        "as an interpreter teardown can, without destroy_process_group")
    args = p.parse_args(argv)
    for name in ("steps", "grad_accum", "batch_size", "seq_len", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    args.ckpt_dir = args.ckpt_dir.absolute()
    return args


def usage_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


def autocast_for(precision: str, device: torch.device):
    """An autocast context for --precision; exits with a clear message if the device lacks it."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return nullcontext()
    if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        usage_error(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support")
    # Older torch builds silently disable CPU autocast for unsupported dtypes (with a warning);
    # probe once so a run never trains in fp32 while claiming fp16.
    with torch.autocast(device.type, dtype=dtype):
        probe = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
    if probe.dtype != dtype:
        usage_error(f"--precision {precision}: autocast on {device.type} does not support {dtype} "
                    f"in torch {torch.__version__}; use --precision fp32")
    return torch.autocast(device.type, dtype=dtype)


def no_buffer_sync(ddp_class) -> dict:
    """DDP's keyword for "no buffer sync each forward" in this torch: ``forward_sync_buffers``
    from torch 2.13 (which deprecates the old name), ``broadcast_buffers`` before it (torch
    2.11 raised TypeError on the new name: docs/COMPAT.md)."""
    params = inspect.signature(ddp_class.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return {name: False}


def lr_factor(args: argparse.Namespace):
    """LambdaLR factor for 0-based step i: linear warmup then cosine decay to --min-lr."""
    def factor(i: int) -> float:
        if i < args.warmup_steps:
            return (i + 1) / args.warmup_steps
        span = max(1, args.steps - args.warmup_steps)
        progress = min(1.0, (i - args.warmup_steps) / span)
        lr = args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))
        return lr / args.lr
    return factor


class Trainer:
    """Model, optimizer, data and checkpointing for one rank."""

    wrap_ddp = True  # False: a launcher's library wraps the model (trainer/accel_train.py)

    def __init__(self, args: argparse.Namespace, ranks: Ranks) -> None:
        self.args = args
        self.ranks = ranks
        self.autocast = autocast_for(args.precision, ranks.device)
        # Flag errors first, before the model and optimizer cost any time.
        try:
            self.config = ModelConfig(d_model=args.d_model, n_layers=args.layers,
                                      n_heads=args.heads, max_seq_len=args.seq_len)
            if args.data is not None:
                dataset = FileBytes(args.data, args.seq_len)
            else:
                dataset = SyntheticBytes(args.synthetic_samples, args.seq_len, seed=args.seed)
            self.loader, self.sampler = build_loader(dataset, args.batch_size, ranks.world_size,
                                                     ranks.rank, args.seed)
        except OSError as e:
            usage_error(f"--data {args.data}: {e.strerror or e}")
        except ValueError as e:
            usage_error(str(e))
        torch.manual_seed(args.seed)  # same initial weights on every rank
        self.module = ByteTransformer(self.config).to(ranks.device)
        self.model = self.module
        if ranks.distributed and self.wrap_ddp:
            # The only buffers are the rotary tables, identical everywhere: no per-forward sync.
            self.model = DDP(self.module, device_ids=[ranks.device.index] if ranks.device.type == "cuda" else None,
                             **no_buffer_sync(DDP))
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=args.lr,
                                           weight_decay=args.weight_decay, betas=(0.9, 0.95))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(args))
        self.scaler = torch.amp.GradScaler(ranks.device.type, enabled=args.precision == "fp16")
        self.step = 0
        self.last_saved = -1

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "format": 1,
            "step": self.step,
            "config": self.config.to_dict(),
            "world_size": self.ranks.world_size,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def save(self) -> None:
        """Local rank 0 of every node writes a checkpoint of the current step."""
        self.last_saved = self.step
        if self.ranks.local_rank != 0:
            return
        path, size = checkpoint.save_atomic(self.state(), self.args.ckpt_dir, self.step)
        print(f"checkpoint saved step={self.step} path={path} bytes={size}", flush=True)
        checkpoint.prune(self.args.ckpt_dir, self.args.keep_ckpts)

    def resume(self, arm: list[faults.Fault]) -> list[faults.Fault]:
        """Agree with the other ranks on the newest checkpoint anywhere and load it.

        Returns the faults still armed. Every rank reports its newest local step; the lowest
        rank holding the newest one reads it and broadcasts it, so nodes without the file (no
        shared filesystem, a replaced host) resume from the same state.
        """
        # rankdeck's --on-loop rollback (docs/JUDGE.md): below a step every rank agrees on
        limit = checkpoint.resume_limit(self.ranks.all_gather(checkpoint.resume_before()),
                                        self.ranks.all_gather(checkpoint.newest_checkpoint(
                                            self.args.ckpt_dir)[0]))
        step, path = checkpoint.newest_checkpoint(self.args.ckpt_dir, below=limit)
        seen = faults.fired_markers(arm, self.args.ckpt_dir)
        reports = self.ranks.all_gather((step, str(path) if path else None, sorted(seen, key=repr)))
        fired = {f for _, _, marks in reports for f in marks}
        best = max(r[0] for r in reports)
        if best < 0:
            return faults.armed(arm, fired, 0)
        src = min(i for i, r in enumerate(reports) if r[0] == best)
        state = checkpoint.load(Path(reports[src][1])) if self.ranks.rank == src else None
        state = self.ranks.broadcast(state, src)
        if state["config"] != self.config.to_dict():
            raise ValueError(f"checkpoint {reports[src][1]} has model {state['config']}, "
                             f"this run builds {self.config.to_dict()}: pass matching size flags")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.step = self.last_saved = state["step"]
        print(f"resumed step={self.step} from={reports[src][1]}", flush=True)
        return faults.armed(arm, fired, self.step)

    # -- training ------------------------------------------------------------------------
    def train_step(self, batches) -> float:
        """One optimizer step over --grad-accum micro-batches; returns this rank's mean loss."""
        accum = self.args.grad_accum
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.ranks.device)
        for micro in range(accum):
            tokens, targets = (t.to(self.ranks.device, non_blocking=True) for t in next(batches))
            # Gradients are all-reduced only on the last micro-batch of the step.
            last = micro == accum - 1
            sync = nullcontext() if last or not self.ranks.distributed else self.model.no_sync()
            with sync:
                with self.autocast:
                    loss = self.model(tokens, targets) / accum
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.args.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.args.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return total.item()

    def run(self, armed: list[faults.Fault], stop: StopRequest) -> int:
        """Train from self.step to --steps; returns the process exit code."""
        args, ranks = self.args, self.ranks
        asked = CheckpointRequest()
        batches = micro_batches(self.loader, self.sampler, skip=self.step * args.grad_accum)
        tokens_per_step = args.batch_size * args.seq_len * args.grad_accum
        losses, seconds = [], 0.0
        while self.step < args.steps:
            faults.fire_if_due(armed, self.step + 1, ranks.rank, args.ckpt_dir)
            if args.slow_rank == ranks.rank and self.step + 1 >= args.slow_at_step:
                if self.step + 1 == args.slow_at_step:
                    print(f"fault injected kind=slow step={self.step + 1} rank={ranks.rank}",
                          file=sys.stderr, flush=True)
                time.sleep(args.slow_s)  # a straggler: late into every all-reduce, never hung
            if args.idle_s > 0:
                time.sleep(args.idle_s)
            lr = self.optimizer.param_groups[0]["lr"]
            started = time.perf_counter()
            loss = self.train_step(batches)
            seconds += time.perf_counter() - started
            losses.append(loss)
            self.step += 1
            if self.step % args.log_every == 0:
                n = len(losses)
                print(f"step={self.step} loss={sum(losses) / n:.4f} lr={lr:.3e} "
                      f"step_time={seconds / n:.4f} tok/s={tokens_per_step * n / seconds:.0f}", flush=True)
                losses, seconds = [], 0.0
            if args.ckpt_every and self.step % args.ckpt_every == 0:
                self.save()
            # one collective decides both: a SIGTERM on any rank stops every rank; the
            # highest checkpoint request any node has (trainer/ckpt_request.py) is saved once
            stopping, wanted = ranks.highest([int(stop.requested), asked.number()])
            if stopping:
                self.save()
                return EXIT_SIGTERM
            if wanted and wanted != asked.done:
                if ranks.rank == 0:
                    said = asked.reason() if asked.number() == wanted else ""
                    print(f"checkpoint requested: {said or f'request {wanted} of another node'}",
                          flush=True)
                if self.last_saved != self.step:
                    self.save()
                asked.answered(wanted)
        if self.last_saved != self.step:
            self.save()
        print(f"done steps={self.step}", flush=True)
        return 0


@record
def main(argv: list[str] | None = None, make_trainer=Trainer, join=None) -> NoReturn:
    """Train; ``make_trainer(args, ranks)`` builds the rank's trainer and ``join(args)``, when
    given, joins the process group first (a launcher's library: trainer/ds_train.py)."""
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = parse_args(argv)
    stop = StopRequest(args.term_grace)
    stop.install()
    try:
        if join is not None:
            join(args)
        ranks = setup(args.device, args.pg_timeout)
    except ValueError as e:
        usage_error(str(e))
    print(f"rank={ranks.rank} local_rank={ranks.local_rank} world_size={ranks.world_size} "
          f"device={ranks.device} pid={os.getpid()}", flush=True)
    hazard = restart_hazard()
    if hazard and ranks.local_rank == 0:
        print(f"warning: {hazard}", file=sys.stderr, flush=True)
    trainer = make_trainer(args, ranks)
    wanted = faults.configured(args.hang_at_step, args.hang_rank, args.crash_at_step, args.crash_rank,
                               args.mismatch_at_step, args.mismatch_rank, args.crash_always)
    for fault in wanted:
        if fault.rank >= ranks.world_size and ranks.rank == 0:
            print(f"warning: --{fault.kind}-rank {fault.rank} is outside world size {ranks.world_size}; "
                  "it will never fire", file=sys.stderr, flush=True)
    code = trainer.run(trainer.resume(wanted), stop)
    if code == 0 and args.abort_at_exit == ranks.rank:
        faults.abort_at_exit(ranks.rank, trainer.step)
    # Only on the way out of a run every rank finished: after an error a peer may be stuck in
    # a collective, and tearing down the group could block on it.
    if code != EXIT_SIGTERM and ranks.distributed:
        dist.destroy_process_group()
    # Then leave without the interpreter's teardown. After SIGTERM it takes 2-3 s on a CPU box
    # and a node restart waits for this process to be gone; after a finished run, gloo's
    # threads can still hold tensors while the interpreter finalizes, which aborted one rank
    # (SIGABRT, "terminate called without an active exception") and left its peers stuck in
    # their own teardown in one test-suite run - the run trained to the end and never ended.
    # Checkpoints are closed files by now; the logs are flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
