"""Where this process sits in the job, and the few collectives the trainer needs outside DDP.

The object collectives are our own rather than ``dist.all_gather_object`` and
``dist.broadcast_object_list``: in torch 2.13 those decode with ``tensor.numpy()`` and fail with
"RuntimeError: Numpy is not available" when numpy is not installed, and torch does not depend
on numpy. Here the bytes travel through a ``bytearray`` shared with a tensor
(``torch.frombuffer``), which needs nothing beyond torch.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job; ``distributed`` is False for a plain single process."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    distributed: bool

    def all_gather(self, obj: object) -> list:
        """Every rank's ``obj``, indexed by rank."""
        if not self.distributed:
            return [obj]
        payload = bytearray(pickle.dumps(obj))
        size = torch.tensor([len(payload)], dtype=torch.long, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        dist.all_gather(sizes, size)
        longest = max(int(s.item()) for s in sizes)
        payload.extend(bytes(longest - len(payload)))  # all_gather wants equal sizes
        mine = torch.frombuffer(payload, dtype=torch.uint8).to(self.device)
        gathered = [torch.empty(longest, dtype=torch.uint8, device=self.device)
                    for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        return [pickle.loads(_to_bytes(t)[: int(s.item())]) for t, s in zip(gathered, sizes)]

    def broadcast(self, obj: object, src: int) -> object:
        """``obj`` as given on rank ``src``; other ranks' ``obj`` is ignored."""
        if not self.distributed:
            return obj
        payload = bytearray(pickle.dumps(obj)) if self.rank == src else bytearray()
        size = torch.tensor([len(payload)], dtype=torch.long, device=self.device)
        dist.broadcast(size, src=src)
        if self.rank != src:
            payload = bytearray(int(size.item()))
        wire = torch.frombuffer(payload, dtype=torch.uint8).to(self.device)
        dist.broadcast(wire, src=src)
        return pickle.loads(_to_bytes(wire))

    def highest(self, values: list[int]) -> list[int]:
        """Per position, the largest of ``values`` any rank gave, on every rank."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]


def _to_bytes(t: torch.Tensor) -> bytearray:
    out = bytearray(t.numel())
    torch.frombuffer(out, dtype=torch.uint8).copy_(t)  # also brings a CUDA tensor home
    return out


def setup(device_flag: str, pg_timeout: float) -> Ranks:
    """Read torchrun's environment, pick the device and join the process group.

    Without torchrun's variables this is a plain single process: no process group at all.
    ``pg_timeout`` bounds every collective, so a hung peer surfaces as an error in
    ``pg_timeout`` seconds rather than gloo's default 30 minutes.
    Raises ValueError for ``--device cuda`` on a host without CUDA.
    """
    env = os.environ
    launched = all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    rank = int(env.get("RANK", 0)) if launched else 0
    local_rank = int(env.get("LOCAL_RANK", 0)) if launched else 0
    world_size = int(env.get("WORLD_SIZE", 1)) if launched else 1
    if device_flag == "auto":
        device_flag = "cuda" if torch.cuda.is_available() else "cpu"
    if device_flag == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch reports no CUDA device on this host")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} but this host has only "
                             f"{torch.cuda.device_count()} CUDA device(s): lower --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if launched and not dist.is_initialized():  # a launcher's library may have joined it
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=pg_timeout),
        )
    return Ranks(rank, local_rank, world_size, device, launched)


def restart_hazard() -> str | None:
    """A warning when torchrun restarts would fail to re-create the process group, else None.

    With torchrun's default shared rendezvous store, workers of a restarted attempt read the
    previous attempt's addresses from it and ``init_process_group`` fails ("Gloo
    connectFullMesh failed ... Connection refused" or "Connect timeout"), so every restart is
    wasted (pytorch/pytorch#135712; still so in torch 2.13). TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    avoids it.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) <= 0:
        return None
    return ("torchrun --max-restarts > 0 with the shared rendezvous store: restarted workers may fail "
            "to rejoin (pytorch/pytorch#135712); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun")
