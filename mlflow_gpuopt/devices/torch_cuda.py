"""CUDA GPUs through ``torch.cuda``: the caching allocator's view (this process only).

Used as a GPU backend when NVML is not available (e.g. no driver library in a container),
and always for allocated/reserved peaks, which NVML cannot see. torch is imported lazily.
"""

from __future__ import annotations

from mlflow_gpuopt.devices.base import GPUs
from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError
from mlflow_gpuopt.devices.samples import GpuSample, TorchMemorySample


def torch_cuda_available() -> bool:
    """Whether torch is importable and reports a CUDA device (never raises)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def torch_memory_sample(index: int) -> TorchMemorySample:
    """Allocated/reserved bytes and their peaks on CUDA device ``index`` (process-visible).

    Raises:
        DeviceError: torch has no CUDA, or the query failed.
    """
    try:
        import torch

        return TorchMemorySample(
            index=index,
            allocated_bytes=float(torch.cuda.memory_allocated(index)),
            reserved_bytes=float(torch.cuda.memory_reserved(index)),
            peak_allocated_bytes=float(torch.cuda.max_memory_allocated(index)),
            peak_reserved_bytes=float(torch.cuda.max_memory_reserved(index)),
        )
    except Exception as exc:
        raise DeviceError(f"torch.cuda memory query failed: {exc}") from exc


class TorchCudaGPUs(GPUs):
    """CUDA devices as torch sees them; only memory fields are filled.

    Raises:
        DeviceInitError: torch has no usable CUDA device.
    """

    backend = "torch.cuda"

    def __init__(self) -> None:
        if not torch_cuda_available():
            raise DeviceInitError("torch.cuda has no device")
        import torch

        self._count = torch.cuda.device_count()
        self._names = [torch.cuda.get_device_name(i) for i in range(self._count)]
        self._totals = [float(torch.cuda.get_device_properties(i).total_memory)
                        for i in range(self._count)]

    def __len__(self) -> int:
        return self._count

    def name(self, index: int) -> str:
        return self._names[index]

    def sample(self, index: int) -> GpuSample:
        mem = torch_memory_sample(index)
        return GpuSample(index=index, memory_used_bytes=mem.reserved_bytes,
                         memory_total_bytes=self._totals[index])
