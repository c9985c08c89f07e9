"""The checkpoints a run saved: complete or not, the last complete one, which the trainer has
deleted since, and which one each node's ranks resumed from.

Fed by RunState from ``ckpt``, ``ckpt_done``, ``ckpt_gone`` and ``resumed`` journal records
(docs/PROTOCOL.md; the node's agent/formats/ckpt_watch.py judges completeness). A trainer
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
    complete: bool | None = None  # None: still being written (or not judged yet)
    seconds: float | None = None  # from its announcement to its last write
    missing: list[str] | None = None  # what an incomplete save lacks
    watched: bool = False  # found in --checkpoint-dir, not announced by the trainer


@dataclass
class Resumed:
    """The checkpoint a node's ranks said they loaded (step, path, or both)."""

    node: str
    rank: int | None
    step: int | None
    path: str | None
    ts: float | None


class Checkpoints:
    """A run's checkpoints in the order they were saved, the newest ``cap`` of them."""

    def __init__(self, cap: int = KEPT):
        self.cap = cap
        self._by_key: OrderedDict[tuple[str, str], Checkpoint] = OrderedDict()
        self.resumed: dict[str, Resumed] = {}  # node -> what its ranks loaded last

    def saved(self, node: str, rank: int | None, meta: dict) -> Checkpoint | None:
        """A ``ckpt`` record of ``node``; saving the same path again makes it current again.
        None when it is the save already known (the folder watch saw it before the trainer's
        line), which then only learns the rank."""
        size = meta.get("bytes")
        ckpt = Checkpoint(node, rank, meta.get("step"), str(meta.get("path") or ""),
                          meta.get("ts"), int(size) if size is not None else None,
                          watched=bool(meta.get("watch")))
        key = (node, ckpt.path)
        known = self._by_key.get(key)
        if known is not None and known.exists and known.step == ckpt.step:
            known.rank = known.rank if known.rank is not None else rank
            known.bytes = known.bytes or ckpt.bytes
            return None
        self._by_key.pop(key, None)
        self._by_key[key] = ckpt
        while len(self._by_key) > self.cap:
            self._by_key.popitem(last=False)
        return ckpt

    def done(self, node: str, meta: dict) -> Checkpoint | None:
        """A ``ckpt_done`` record of ``node``: the save it names, now complete or not."""
        ckpt = self._by_key.get((node, str(meta.get("path") or "")))
        if ckpt is None or ckpt.complete is not None:
            return None
        ckpt.complete = bool(meta.get("complete"))
        ckpt.seconds = meta.get("seconds")
        ckpt.bytes = meta.get("bytes") if meta.get("bytes") is not None else ckpt.bytes
        if not ckpt.complete:
            ckpt.missing = [str(m) for m in meta.get("missing") or ()][:20]
        return ckpt

    def resume(self, node: str, rank: int | None, meta: dict) -> Resumed | None:
        """A ``resumed`` record of one of ``node``'s ranks; returns the node's resume point
        when it changed (every rank prints the same line; Hugging Face prints the path and
        the step on two lines, which join here)."""
        step, path = meta.get("step"), meta.get("path")
        before = self.resumed.get(node)
        if before is not None and _agrees(before.step, step) and _agrees(before.path, path):
            step = before.step if step is None else step  # the other line of the same load
            path = before.path if path is None else path
            if (step, path) == (before.step, before.path):
                return None
        if path is None:  # a step only: the save of that step this run knows, if any
            path = next((c.path for c in reversed(self._by_key.values())
                         if c.node == node and c.step == step), None)
        self.resumed[node] = Resumed(node, rank, step, path, meta.get("ts"))
        return self.resumed[node]

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

    def last_complete(self) -> Checkpoint | None:
        """The newest save still on disk that its node found complete."""
        for ckpt in reversed(self._by_key.values()):
            if ckpt.exists and ckpt.complete:
                return ckpt
        return None

    def status(self) -> list[dict]:
        """The ``checkpoints`` list of ``status --json`` (docs/STATUS.md), oldest first."""
        last = self.last_complete()
        return [dict(asdict(c), last_complete=c is last) for c in self._by_key.values()]

    def resumed_status(self) -> list[dict]:
        """The ``resumed_from`` list of ``status --json``: per node, what its ranks loaded."""
        return [asdict(r) for r in self.resumed.values()]


def _agrees(known, new) -> bool:
    """Two lines may tell of one load: each value is unknown on one side or the same."""
    return known is None or new is None or known == new
