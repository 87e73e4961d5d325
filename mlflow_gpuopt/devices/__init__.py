"""Devices: one GPU interface (:class:`GPUs`) with AMD SMI, NVML, torch.cuda and empty
backends, and the host.

``get_gpus()`` tries the backends in a fixed order — AMD SMI, NVML, then torch.cuda — and
degrades to :class:`EmptyGPUs` when none starts. It never raises. AMD SMI goes first because it
starts only where ``amdsmi`` is importable *and* reports a GPU, which an NVIDIA machine never
does; on a ROCm build of PyTorch without ``amdsmi`` (``torch.version.hip`` set), NVML finds no
driver and torch.cuda (HIP underneath) reports the AMD GPUs.
"""

from __future__ import annotations

import logging

from mlflow_gpuopt.devices.base import GPUs, EmptyGPUs
from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError, DeviceNotSupportedError
from mlflow_gpuopt.devices.samples import GpuSample, HostSample, TorchMemorySample

logger = logging.getLogger(__name__)

__all__ = ["GPUs", "EmptyGPUs", "GpuSample", "HostSample", "TorchMemorySample", "DeviceError",
           "DeviceInitError", "DeviceNotSupportedError", "get_gpus", "get_host"]


def get_gpus(visible_devices: str | None = None) -> GPUs:
    """The GPUs this process can see: AMD SMI → NVML → torch.cuda → empty (first that starts).

    ``visible_devices`` overrides ``CUDA_VISIBLE_DEVICES`` for NVML and ``HIP_VISIBLE_DEVICES``
    for AMD SMI.
    """
    from mlflow_gpuopt.devices.amd import AmdSmiGPUs
    from mlflow_gpuopt.devices.nvml import NvmlGPUs
    from mlflow_gpuopt.devices.torch_cuda import TorchCudaGPUs

    for factory in (lambda: AmdSmiGPUs(visible_devices), lambda: NvmlGPUs(visible_devices),
                    TorchCudaGPUs):
        try:
            return factory()
        except DeviceError as exc:
            logger.debug("gpuopt: GPU backend unavailable: %s", exc)
        except Exception as exc:  # a bug in a backend must not stop tracking
            logger.warning("gpuopt: GPU backend failed to start: %s", exc)
    return EmptyGPUs()


def get_host():
    """The host monitor, or ``None`` when psutil is unavailable."""
    from mlflow_gpuopt.devices.host import HostMonitor

    try:
        return HostMonitor()
    except Exception as exc:
        logger.warning("gpuopt: host metrics unavailable: %s", exc)
        return None
