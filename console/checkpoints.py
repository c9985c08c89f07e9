"""The checkpoints a run saved, and which of them the trainer has deleted since.

Fed by RunState from ``ckpt`` and ``ckpt_gone`` journal records (docs/PROTOCOL.md): a trainer
that keeps only its newest checkpoints (Hugging Face ``save_total_limit``, the reference
trainer's ``--keep-ckpts``) deletes older ones, and a list that still showed them would send an
operator to resume from a folder that is not there. Bounded; plain data, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

KEPT = 500  # newest checkpoints remembered per run


@dataclass
class Checkpoint:
    """One saved checkpoint: on which node, by which rank, of which step, where, and whether
    it is still there (``exists`` goes False when the node saw the path disappear)."""

    node: str
    rank: int | None
    step: int | None
    path: str
    ts: float | None
    bytes: int | None = None
    exists: bool = True
    deleted: float | None = None  # when the node noticed it gone


class Checkpoints:
    """A run's checkpoints in the order they were saved, the newest ``cap`` of them."""

    def __init__(self, cap: int = KEPT):
        self.cap = cap
        self._by_key: OrderedDict[tuple[str, str], Checkpoint] = OrderedDict()

    def saved(self, node: str, rank: int | None, meta: dict) -> Checkpoint:
        """A ``ckpt`` record of ``node``; saving the same path again makes it current again."""
        size = meta.get("bytes")
        ckpt = Checkpoint(node, rank, meta.get("step"), str(meta.get("path") or ""),
                          meta.get("ts"), int(size) if size is not None else None)
        key = (node, ckpt.path)
        self._by_key.pop(key, None)
        self._by_key[key] = ckpt
        while len(self._by_key) > self.cap:
            self._by_key.popitem(last=False)
        return ckpt

    def gone(self, node: str, meta: dict) -> Checkpoint | None:
        """A ``ckpt_gone`` record of ``node``: the checkpoint it names, now marked deleted
        (None when it is not one this run remembers, or was marked already)."""
        ckpt = self._by_key.get((node, str(meta.get("path") or "")))
        if ckpt is None or not ckpt.exists:
            return None
        ckpt.exists = False
        ckpt.deleted = meta.get("ts")
        return ckpt

    def __iter__(self):
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint still on disk, if any."""
        for ckpt in reversed(self._by_key.values()):
            if ckpt.exists:
                return ckpt
        return None

    def status(self) -> list[dict]:
        """The ``checkpoints`` list of ``status --json`` (docs/STATUS.md), oldest first."""
        return [asdict(c) for c in self._by_key.values()]
