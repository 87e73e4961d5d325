"""Which process of a (possibly distributed) job this is.

``DistributedContext.from_env()`` reads torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node's rank) and ``GROUP_WORLD_SIZE`` (nodes), and
prefers ``torch.distributed``'s rank and world size when a process group is initialised.
The ranks of a distributed job are combined on rank 0 from gathered reports
(:mod:`.rank_rows`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1  # processes (= GPUs for data parallel) in the job
    local_rank: int = 0
    local_world_size: int = 1  # processes on this node
    strategy: str = "single"  # single|ddp|fsdp|zero1|zero2|zero3|pp|tp
    node_rank: int = 0  # torchrun's GROUP_RANK
    node_count: int | None = None  # torchrun's GROUP_WORLD_SIZE, when the launcher says it

    @property
    def nodes(self) -> int:
        if self.node_count:
            return self.node_count
        return max(1, -(-self.world_size // max(1, self.local_world_size)))

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_logging_rank(self) -> bool:
        """Only rank 0 writes to MLflow."""
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, strategy: str | None = None
                 ) -> DistributedContext:
        env = os.environ if env is None else env

        def _int(name: str, default: int) -> int:
            try:
                return int(env.get(name, default))
            except (TypeError, ValueError):
                return default

        world = max(1, _int("WORLD_SIZE", 1))
        rank = _int("RANK", 0)
        if env is os.environ:  # the live process: an initialised process group wins
            rank, world = _torch_rank(rank, world)
        local_world = max(1, _int("LOCAL_WORLD_SIZE", world))
        nodes = _int("GROUP_WORLD_SIZE", 0)
        return cls(rank=rank, world_size=world, local_rank=_int("LOCAL_RANK", 0),
                   local_world_size=local_world,
                   strategy=strategy or ("single" if world == 1 else "ddp"),
                   node_rank=max(0, _int("GROUP_RANK", 0)), node_count=nodes if nodes > 0 else None)


def _torch_rank(rank: int, world: int) -> tuple[int, int]:
    """``torch.distributed``'s rank and world size if a group is initialised (and torch is
    already imported: this never imports it)."""
    import sys

    if "torch" not in sys.modules:
        return rank, world
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # fall back to the launcher's environment
        pass
    return rank, world
