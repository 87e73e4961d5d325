"""Which process of a (possibly distributed) job this is, and how per-rank figures combine.

Single process today: ``DistributedContext.from_env()`` reads torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``. :func:`combine_window` is the one
place where per-step records of all ranks would be aggregated before logging; for one
process it returns its input.
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

    @property
    def nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))

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
        local_world = max(1, _int("LOCAL_WORLD_SIZE", world))
        return cls(rank=_int("RANK", 0), world_size=world, local_rank=_int("LOCAL_RANK", 0),
                   local_world_size=local_world,
                   strategy=strategy or ("single" if world == 1 else "ddp"))


@dataclass(frozen=True)
class StepWindow:
    """Steps completed between two sampler ticks, as seen by this process."""

    first_step: int
    last_step: int
    steps: int
    duration_s: float  # sum of the step times in the window
    samples: int  # samples processed in the window (0 = unknown)
    tokens: int


def combine_window(ctx: DistributedContext, window: StepWindow) -> StepWindow:
    """The job-wide view of a window. One process: the window itself."""
    return window
