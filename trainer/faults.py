"""Injected faults for exercising the console: a rank that hangs, crashes or enters a
mismatched collective at a given step, or one that aborts after its last step.

A fault fires at most once per run: when it fires, the firing rank drops a marker file
``<ckpt-dir>/.fault-fired-<kind>-<step>-<rank>``. After a restart every rank reports whether it
sees a marker and the fault stays disarmed if any does, so a restarted job (where global rank R
may now live on another host) recovers instead of failing the same way again. A run that
resumes from a checkpoint at or past the step never reaches it either. A fault made
``always`` (``--crash-always``) fires each time its step is reached, after every restart: a
restart loop (docs/JUDGE.md, "Restart loops").
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` ("hang", "crash" or "mismatch") on global ``rank`` at ``step``."""

    kind: str
    step: int
    rank: int
    always: bool = False  # fires after every restart that reaches its step again

    def marker(self, ckpt_dir: Path) -> Path:
        return ckpt_dir / f".fault-fired-{self.kind}-{self.step}-{self.rank}"


def configured(hang_at: int | None, hang_rank: int, crash_at: int | None, crash_rank: int,
               mismatch_at: int | None = None, mismatch_rank: int = 0,
               crash_always: bool = False) -> list[Fault]:
    faults = []
    if hang_at is not None:
        faults.append(Fault("hang", hang_at, hang_rank))
    if crash_at is not None:
        faults.append(Fault("crash", crash_at, crash_rank, crash_always))
    if mismatch_at is not None:
        faults.append(Fault("mismatch", mismatch_at, mismatch_rank))
    return faults


def fired_markers(faults: list[Fault], ckpt_dir: Path) -> set[Fault]:
    """The faults whose marker this rank can see in its own checkpoint directory."""
    return {f for f in faults if f.marker(ckpt_dir).exists()}


def armed(faults: list[Fault], fired_anywhere: set[Fault], resumed_step: int) -> list[Fault]:
    """Faults still to fire: not fired on any rank, and not already behind the resumed step."""
    return [f for f in faults if (f.always or f not in fired_anywhere) and resumed_step < f.step]


def fire_if_due(faults: list[Fault], step: int, rank: int, ckpt_dir: Path) -> None:
    """Hang forever, mismatch or raise, if one of ``faults`` is due on this rank at this step."""
    for fault in faults:
        if fault.step != step or fault.rank != rank:
            continue
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fault.marker(ckpt_dir).touch()
        print(f"fault injected kind={fault.kind} step={step} rank={rank}", file=sys.stderr, flush=True)
        if fault.kind == "hang":
            injected_hang()
        if fault.kind == "mismatch":
            injected_mismatch(rank)
        raise RuntimeError(f"injected crash at step {step} on rank {rank}")


def injected_mismatch(rank: int) -> None:
    """Enter a broadcast from this rank while the others enter the step's gradient all-reduce:
    the same collective sequence number with a different op and size, so every rank waits
    (gloo) until the process group's timeout raises."""
    import torch
    import torch.distributed as dist

    dist.broadcast(torch.zeros(7), src=rank)


def injected_hang() -> None:
    """Block forever, as a rank stuck before its collective would.

    SIGTERM does not end the loop: its handler only sets a flag read at step boundaries, which
    this rank never reaches, like a rank stuck in a collective. The SIGTERM watchdog
    (``--term-grace``) or SIGKILL ends the process.
    """
    while True:
        time.sleep(3600)


def abort_at_exit(rank: int, step: int) -> None:
    """Die by SIGABRT after the last step, before the process group is destroyed: what an
    interpreter teardown did to one rank of a script without ``destroy_process_group`` (gloo
    threads still holding tensors, "terminate called without an active exception")."""
    print(f"fault injected kind=abort-at-exit step={step} rank={rank}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.abort()
