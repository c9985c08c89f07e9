"""Byte-level training data: a learnable synthetic corpus or a text file, sharded per rank."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB_SIZE = 256
# Each byte in the synthetic corpus has this many equally likely successors, so a model that
# has learnt the table reaches a loss of ln(4) ~ 1.39, well below the ln(256) ~ 5.55 it starts at.
SUCCESSORS = 4


class SyntheticBytes(Dataset):
    """Sequences walked through a fixed random successor table (a learnable bigram chain).

    Fully determined by ``seed``: every rank and every restart builds the same corpus.
    """

    def __init__(self, num_samples: int, seq_len: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        table = torch.randint(0, VOCAB_SIZE, (VOCAB_SIZE, SUCCESSORS), generator=g)
        choices = torch.randint(0, SUCCESSORS, (num_samples, seq_len + 1), generator=g)
        rows = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
        rows[:, 0] = torch.randint(0, VOCAB_SIZE, (num_samples,), generator=g)
        for t in range(1, seq_len + 1):  # vectorised over samples; seq_len iterations only
            rows[:, t] = table[rows[:, t - 1], choices[:, t]]
        self.rows = rows

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[i]
        return row[:-1], row[1:]


class FileBytes(Dataset):
    """Non-overlapping windows of seq_len + 1 bytes from a file."""

    def __init__(self, path: str | Path, seq_len: int) -> None:
        raw = Path(path).read_bytes()
        self.data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        self.seq_len = seq_len
        self.count = max(0, (len(self.data) - 1) // seq_len)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def build_loader(
    dataset: Dataset, batch_size: int, world_size: int, rank: int, seed: int
) -> tuple[DataLoader, DistributedSampler]:
    """A DataLoader over this rank's shard. Raises ValueError if a rank would get no batch."""
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=0)
    if len(loader) == 0:
        raise ValueError(
            f"dataset of {len(dataset)} samples gives no full batch of {batch_size} "
            f"per rank at world size {world_size}: use more data or a smaller --batch-size"
        )
    return loader, sampler


def micro_batches(
    loader: DataLoader, sampler: DistributedSampler, skip: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless micro-batches, reshuffled each epoch, starting after ``skip`` already used ones.

    Skipping lets a resumed run see the batches it would have seen without the restart.
    """
    per_epoch = len(loader)
    epoch, offset = divmod(skip, per_epoch)
    for epoch in itertools.count(epoch):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        if offset:
            # Consumes the skipped batches; cheap for byte data of this size.
            next(itertools.islice(batches, offset - 1, offset), None)
            offset = 0
        yield from batches
