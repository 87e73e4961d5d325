"""The one interface every GPU backend implements (NVML, torch.cuda, empty, fake)."""

from __future__ import annotations

import abc
from dataclasses import replace

from mlflow_gpuopt.devices.samples import GpuSample


class GPUs(abc.ABC):
    """The GPUs this process uses, indexed 0..len-1 as the process sees them.

    A collection rather than one device, because index mapping (``CUDA_VISIBLE_DEVICES``)
    and start-up/shutdown of the vendor library are group-level concerns.
    Methods raise :class:`~mlflow_gpuopt.devices.errors.DeviceError` subclasses only.
    """

    backend: str = "abstract"

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def name(self, index: int) -> str:
        """Marketing name as the driver reports it, e.g. ``NVIDIA A100-SXM4-80GB``."""

    @abc.abstractmethod
    def sample(self, index: int) -> GpuSample:
        """Read utilisation, memory, power, clock and energy; unsupported fields are ``None``."""

    def memory_total_bytes(self, index: int) -> float | None:
        """Device memory size in bytes, or ``None`` when unknown."""
        return self.sample(index).memory_total_bytes

    def select(self, indices: list[int]) -> GPUs:
        """The subset of these GPUs at ``indices`` (process-visible indices)."""
        return _Subset(self, indices)

    def close(self) -> None:  # noqa: B027 - optional hook: a no-op unless a library is held
        """Release the vendor library; safe to call twice."""


class EmptyGPUs(GPUs):
    """No GPU: ``len() == 0``; any device call is a programming error (``IndexError``)."""

    backend = "empty"

    def __len__(self) -> int:
        return 0

    def name(self, index: int) -> str:
        raise IndexError(f"no GPU {index}: no GPUs are available")

    def sample(self, index: int) -> GpuSample:
        raise IndexError(f"no GPU {index}: no GPUs are available")


class _Subset(GPUs):
    """A view of some GPUs of another collection, re-indexed from 0."""

    def __init__(self, parent: GPUs, indices: list[int]) -> None:
        for i in indices:
            if not 0 <= i < len(parent):
                raise IndexError(f"GPU index {i} out of range (have {len(parent)})")
        self._parent = parent
        self._indices = list(indices)
        self.backend = parent.backend

    def __len__(self) -> int:
        return len(self._indices)

    def name(self, index: int) -> str:
        return self._parent.name(self._indices[index])

    def sample(self, index: int) -> GpuSample:
        return replace(self._parent.sample(self._indices[index]), index=index)

    def close(self) -> None:
        self._parent.close()
