"""Which GPUs a tracked process samples, and which of them torch.cuda holds the model on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from mlflow_gpuopt.devices import GPUs
from mlflow_gpuopt.tracking.distributed.context import DistributedContext


@dataclass(frozen=True)
class GpuSelection:
    """The GPUs to sample, as a backend view, with their indices."""

    gpus: GPUs  # the selected GPUs (position j is ``gpu_<j>`` in the run)
    gpu_ids: tuple[int, ...]  # their node-local (process-visible) indices
    cuda_indices: tuple[int, ...]  # torch.cuda devices holding the model (memory readings)

    @property
    def device(self) -> str:
        """NVML name of the first selected GPU, or ``cpu``."""
        return self.gpus.name(0) if len(self.gpus) else "cpu"


def select_gpus(model: Any, gpu_indices: Sequence[int] | None, ctx: DistributedContext,
                gpus: GPUs) -> GpuSelection:
    """In order: ``gpu_indices`` if given; the CUDA devices holding ``model``; none when the
    model is on the CPU of a machine with GPUs (they are not ours); the rank's
    ``LOCAL_RANK`` GPU in a distributed job; else every GPU."""
    model_cuda: list[int] = []
    on_cpu = False
    if model is not None:
        import torch

        devs = {p.device for p in model.parameters()}
        model_cuda = sorted({d.index if d.index is not None else torch.cuda.current_device()
                             for d in devs if d.type == "cuda"})
        on_cpu = bool(devs) and not model_cuda and torch.cuda.is_available()
    if gpu_indices is not None:
        indices = list(gpu_indices)
    elif model_cuda:
        indices = model_cuda
    elif on_cpu:
        indices = []
    elif ctx.world_size > 1:
        indices = [ctx.local_rank]
    else:
        return GpuSelection(gpus, tuple(range(len(gpus))), ())
    ids = tuple(i for i in indices if i < len(gpus))
    return GpuSelection(gpus.select(list(ids)), ids, tuple(model_cuda))
