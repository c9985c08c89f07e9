"""Checkpoint files: atomic writes, discovery of the newest one, pruning.

A checkpoint is ``<dir>/step_XXXXXXXX.pt``. It is written under a unique temporary name in the
same directory, fsynced, then renamed with ``os.replace``; so a ``step_*.pt`` name always holds a
complete file, even when several nodes write the same step into one shared directory.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from pathlib import Path
from typing import Any

import torch

CKPT_RE = re.compile(r"^step_(\d{8,})\.pt$")
TMP_PREFIX = ".tmp-"


def ckpt_path(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"step_{step:08d}.pt"


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in ckpt_dir, oldest first."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), ckpt_dir / name))
    return sorted(found)


def newest_checkpoint(ckpt_dir: Path, below: int | None = None) -> tuple[int, Path | None]:
    """(step, path) of the newest checkpoint (``below``: of a step under it), or (-1, None)
    when there is none."""
    found = [c for c in list_checkpoints(ckpt_dir) if below is None or c[0] < below]
    return found[-1] if found else (-1, None)


def resume_before() -> int | str | None:
    """What rankdeck's ``--on-loop rollback`` asks of this start (docs/JUDGE.md, "Restart
    loops"): the file RANKDECK_RESUME_FILE names holds ``{"before_step": N}`` (resume from the
    newest checkpoint of a step under N) or ``{"before_step": "newest"}`` (from the one before
    the newest). Read by the first workers of a torchrun start only
    (TORCHELASTIC_RESTART_COUNT 0): torchrun's own later restarts resume as usual."""
    path = os.environ.get("RANKDECK_RESUME_FILE")
    if not path or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    try:
        with open(path) as f:
            before = json.load(f).get("before_step")
    except (OSError, ValueError, AttributeError):
        return None
    ok = before == "newest" or (isinstance(before, int) and not isinstance(before, bool))
    return before if ok else None


def resume_limit(asked: list, newest: list[int]) -> int | None:
    """The step every rank resumes under: the lowest any rank was asked for (``asked``: each
    rank's :func:`resume_before`; ``newest``: each rank's newest checkpoint's step), or None."""
    limits = [max(newest) if a == "newest" else a for a in asked if a is not None]
    return min(limits) if limits else None


def save_atomic(state: dict[str, Any], ckpt_dir: Path, step: int) -> tuple[Path, int]:
    """Write state as the checkpoint for step; returns (absolute path, size in bytes)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_path(ckpt_dir, step).absolute()
    # Unique per host and process: nodes sharing a directory never write the same temp file.
    tmp = ckpt_dir / f"{TMP_PREFIX}{final.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(ckpt_dir)
    return final, final.stat().st_size


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not every filesystem allows opening a directory.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prune(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns what was deleted."""
    if keep <= 0:
        return []
    removed = []
    for _, path in list_checkpoints(ckpt_dir)[:-keep]:
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:  # another node sharing the directory got there first
            pass
    return removed


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU. Holds only tensors and plain values: weights_only works."""
    return torch.load(path, map_location="cpu", weights_only=True)
