"""NVIDIA GPUs through NVML (package ``nvidia-ml-py``, imported as ``pynvml``).

Only the GPUs this process can see are exposed, in the order ``CUDA_VISIBLE_DEVICES`` gives
them. Every ``pynvml.NVMLError`` is translated here into a :mod:`~mlflow_gpuopt.devices.errors`
exception, so nothing above this module knows about pynvml.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable

from mlflow_gpuopt.devices.base import GPUs
from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError, DeviceNotSupportedError
from mlflow_gpuopt.devices.samples import GpuSample

logger = logging.getLogger(__name__)


def parse_visible_devices(value: str | None, count: int) -> list[int | str]:
    """Entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them.

    Returns physical indices (``int``) or UUID prefixes (``str``). ``None`` (unset) means all
    ``count`` devices. Like CUDA, parsing stops at the first invalid entry, and an index out of
    range ends the list.
    """
    if value is None:
        return list(range(count))
    out: list[int | str] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            break
        if item.startswith(("GPU-", "MIG-")):
            out.append(item)
            continue
        try:
            idx = int(item)
        except ValueError:
            break
        if idx < 0 or idx >= count:
            break
        out.append(idx)
    return out


def _nvml() -> Any:
    """The ``pynvml`` module, imported on first use (tests may substitute a fake one)."""
    return importlib.import_module("pynvml")


class NvmlGPUs(GPUs):
    """The GPUs visible to this process, read through NVML.

    Args:
        visible_devices: the ``CUDA_VISIBLE_DEVICES`` value to honour; defaults to the
            environment's.

    Raises:
        DeviceInitError: NVML is missing, fails to start, or no GPU is visible.
    """

    backend = "nvml"

    def __init__(self, visible_devices: str | None = None) -> None:
        try:
            self._pynvml = _nvml()
        except Exception as exc:  # ImportError, or a broken install
            raise DeviceInitError(f"pynvml unavailable: {exc}") from exc
        self._error_cls = getattr(self._pynvml, "NVMLError", Exception)
        self._call(self._pynvml.nvmlInit, init=True)
        self._closed = False
        try:
            count = int(self._call(self._pynvml.nvmlDeviceGetCount, init=True))
            if visible_devices is None:
                env = os.environ.get("CUDA_VISIBLE_DEVICES")
            else:
                env = visible_devices
            self._handles = []
            for entry in parse_visible_devices(env, count):
                if isinstance(entry, int):
                    self._handles.append(self._call(self._pynvml.nvmlDeviceGetHandleByIndex,
                                                    entry, init=True))
                elif entry.startswith("GPU-"):
                    self._handles.append(self._call(self._pynvml.nvmlDeviceGetHandleByUUID,
                                                    entry, init=True))
                else:  # MIG instances: not measured through NVML device queries
                    logger.info("gpuopt: skipping MIG device %s", entry)
            if not self._handles:
                raise DeviceInitError("NVML found no visible GPU")
            self._names = [self._decode(self._call(self._pynvml.nvmlDeviceGetName, h, init=True))
                           for h in self._handles]
        except Exception:
            self.close()
            raise

    # -- error translation ---------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, init: bool = False) -> Any:
        try:
            return fn(*args)
        except self._error_cls as exc:
            value = getattr(exc, "value", None)
            if value == getattr(self._pynvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                raise DeviceNotSupportedError(str(exc)) from exc
            if init:
                raise DeviceInitError(f"NVML: {exc}") from exc
            raise DeviceError(f"NVML: {exc}") from exc

    @staticmethod
    def _decode(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The value, or ``None`` when the device does not support this query."""
        try:
            return self._call(fn, *args)
        except DeviceNotSupportedError:
            return None

    # -- GPUs ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._handles)

    def name(self, index: int) -> str:
        return self._names[index]

    def sample(self, index: int) -> GpuSample:
        p = self._pynvml
        h = self._handles[index]
        util = self._optional(p.nvmlDeviceGetUtilizationRates, h)
        mem = self._optional(p.nvmlDeviceGetMemoryInfo, h)
        power_mw = self._optional(p.nvmlDeviceGetPowerUsage, h)
        clock = self._optional(p.nvmlDeviceGetClockInfo, h, getattr(p, "NVML_CLOCK_SM", 1))
        energy_mj = self._optional(p.nvmlDeviceGetTotalEnergyConsumption, h)
        return GpuSample(
            index=index,
            utilization_percent=None if util is None else float(util.gpu),
            memory_used_bytes=None if mem is None else float(mem.used),
            memory_total_bytes=None if mem is None else float(mem.total),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            energy_joules=None if energy_mj is None else energy_mj / 1000.0,
        )

    def nvlink_active(self, index: int) -> bool:
        """Whether NVML reports an active NVLink on GPU ``index`` (False where it cannot say)."""
        p = self._pynvml
        for link in range(getattr(p, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if p.nvmlDeviceGetNvLinkState(self._handles[index], link):
                    return True
            except Exception:  # link absent, not supported, old pynvml
                continue
        return False

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._pynvml.nvmlShutdown()
        except Exception as exc:  # shutting down must never fail the caller
            logger.debug("gpuopt: nvmlShutdown failed: %s", exc)
