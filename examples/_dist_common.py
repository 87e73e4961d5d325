"""Shared bits of the distributed examples: process group, sharded synthetic data, the model.

Run under ``torchrun``: it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` …
Backend: ``nccl`` when CUDA is available, else ``gloo`` (CPU).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES, HIDDEN, CLASSES = 64, 256, 10


def init() -> tuple[int, int, torch.device]:
    """Join the job's process group; returns ``(rank, world_size, device)``."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


class MLP(nn.Module):
    """A small classifier: 64 → 256 → 256 → 10 (~85k parameters, ~340 kB of fp32 gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def loader(rank: int, world: int, batch: int, samples: int = 8192, seed: int = 0) -> DataLoader:
    """The same synthetic dataset on every rank (a fixed linear teacher), sharded by
    :class:`DistributedSampler`; each rank sees its ``1/world`` of it per epoch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank,
                                 shuffle=True, seed=seed, drop_last=True)
    return DataLoader(TensorDataset(x, y), batch_size=batch, sampler=sampler, drop_last=True)


def batches(data: DataLoader, steps: int):
    """``steps`` batches, going round the epochs (``set_epoch`` reshuffles each one)."""
    epoch = 0
    done = 0
    while done < steps:
        data.sampler.set_epoch(epoch)
        for batch in data:
            yield batch
            done += 1
            if done == steps:
                return
        epoch += 1


def add_args(parser) -> None:
    from _common import plan_int

    parser.add_argument("--batch", type=int, default=plan_int("GPUOPT_MICRO_BATCH", 32),
                        help="micro-batch per rank (default: $GPUOPT_MICRO_BATCH or 32)")
    parser.add_argument("--autolog", action="store_true",
                        help="call mlflow.autolog() on every rank (one run per job still)")
