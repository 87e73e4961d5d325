"""Test doubles that let the real GPU code paths run on a CPU machine.

:func:`fake_nvml` installs a fake ``pynvml`` module (in ``sys.modules``), so the real
:class:`~mlflow_gpuopt.devices.nvml.NvmlGPUs` backend — index mapping, error translation,
unit conversion — runs unchanged against :class:`FakeGPU` devices::

    with fake_nvml([FakeGPU("NVIDIA A100-SXM4-80GB"), FakeGPU("NVIDIA A100-SXM4-80GB")]) as nvml:
        nvml.fail("nvmlDeviceGetPowerUsage", nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
        ...

Not for production use; nothing in the package imports this module.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Iterator

from mlflow_gpuopt.devices.base import GPUs
from mlflow_gpuopt.devices.samples import GpuSample


@dataclass
class FakeGPU:
    """One fake device; readings are the fields below (NVML's units: bytes, mW, MHz, mJ)."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = ""
    memory_total_bytes: int = 80 * 1024**3
    memory_used_bytes: int = 10 * 1024**3
    utilization_percent: int = 87
    power_mw: int = 312_000
    sm_clock_mhz: int = 1410
    energy_mj: int = 5_000_000
    supports_energy: bool = True
    nvlink_active: bool = False
    calls: dict = field(default_factory=dict)


class _Utilization:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu, self.memory = gpu, memory


class _Memory:
    def __init__(self, total: int, used: int) -> None:
        self.total, self.used, self.free = total, used, total - used


def make_fake_pynvml(gpus: list[FakeGPU]) -> types.ModuleType:
    """A module with the parts of pynvml's API the NVML backend uses, backed by ``gpus``.

    ``module.fail(name, exc)`` makes function ``name`` raise ``exc`` from then on;
    ``module.heal(name)`` undoes it; ``module.init_count`` counts ``nvmlInit`` calls; like NVML,
    init/shutdown are reference-counted (``module.refs``).
    """
    m = types.ModuleType("pynvml")
    m.NVML_SUCCESS = 0
    m.NVML_ERROR_UNINITIALIZED = 1
    m.NVML_ERROR_INVALID_ARGUMENT = 2
    m.NVML_ERROR_NOT_SUPPORTED = 3
    m.NVML_ERROR_GPU_IS_LOST = 15
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_ERROR_UNKNOWN = 999
    m.NVML_CLOCK_SM = 1

    class NVMLError(Exception):  # pynvml's own name
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return f"NVML error {self.value}"

    class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - pynvml's own name
        def __init__(self) -> None:
            super().__init__(m.NVML_ERROR_NOT_SUPPORTED)

    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = NVMLError_NotSupported
    m.gpus = gpus
    for i, g in enumerate(gpus):
        g.uuid = g.uuid or f"GPU-fake-{i:04d}"
    m.failures = {}
    m.init_count = 0
    m.refs = 0  # NVML reference-counts init/shutdown
    m.initialized = False

    def fail(name: str, exc: BaseException) -> None:
        m.failures[name] = exc

    def heal(name: str) -> None:
        m.failures.pop(name, None)

    m.fail, m.heal = fail, heal

    def api(fn):
        def wrapper(*args):
            exc = m.failures.get(fn.__name__)
            if exc is not None:
                raise exc
            if fn.__name__ not in ("nvmlInit", "nvmlShutdown") and not m.initialized:
                raise NVMLError(m.NVML_ERROR_UNINITIALIZED)
            if args and isinstance(args[0], FakeGPU):
                args[0].calls[fn.__name__] = args[0].calls.get(fn.__name__, 0) + 1
            return fn(*args)

        wrapper.__name__ = fn.__name__
        setattr(m, fn.__name__, wrapper)
        return wrapper

    @api
    def nvmlInit():  # noqa: N802 - pynvml's name
        m.init_count += 1
        m.refs += 1
        m.initialized = True

    @api
    def nvmlShutdown():  # noqa: N802 - pynvml's name
        if m.refs == 0:
            raise NVMLError(m.NVML_ERROR_UNINITIALIZED)
        m.refs -= 1
        m.initialized = m.refs > 0

    @api
    def nvmlDeviceGetCount():  # noqa: N802 - pynvml's name
        return len(gpus)

    @api
    def nvmlDeviceGetHandleByIndex(i):  # noqa: N802 - pynvml's name
        if not 0 <= i < len(gpus):
            raise NVMLError(2)
        return gpus[i]

    @api
    def nvmlDeviceGetHandleByUUID(uuid):  # noqa: N802 - pynvml's name
        for g in gpus:
            if g.uuid.startswith(uuid):
                return g
        raise NVMLError(6)

    @api
    def nvmlDeviceGetName(h):  # noqa: N802 - pynvml's name
        return h.name

    @api
    def nvmlDeviceGetUUID(h):  # noqa: N802 - pynvml's name
        return h.uuid

    @api
    def nvmlDeviceGetUtilizationRates(h):  # noqa: N802 - pynvml's name
        return _Utilization(h.utilization_percent, 40)

    @api
    def nvmlDeviceGetMemoryInfo(h):  # noqa: N802 - pynvml's name
        return _Memory(h.memory_total_bytes, h.memory_used_bytes)

    @api
    def nvmlDeviceGetPowerUsage(h):  # noqa: N802 - pynvml's name
        return h.power_mw

    @api
    def nvmlDeviceGetClockInfo(h, clock_type):  # noqa: N802 - pynvml's name
        return h.sm_clock_mhz

    @api
    def nvmlDeviceGetNvLinkState(h, link):  # noqa: N802 - pynvml's name
        if link >= 12:
            raise NVMLError(m.NVML_ERROR_INVALID_ARGUMENT)
        return int(h.nvlink_active)

    @api
    def nvmlDeviceGetTotalEnergyConsumption(h):  # noqa: N802 - pynvml's name
        if not h.supports_energy:
            raise NVMLError_NotSupported()
        return h.energy_mj

    return m


@contextlib.contextmanager
def fake_nvml(gpus: list[FakeGPU] | None = None) -> Iterator[types.ModuleType]:
    """Install a fake ``pynvml`` for the duration of the block (and clear the hardware cache)."""
    from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

    module = make_fake_pynvml(gpus if gpus is not None else [FakeGPU()])
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module
    hardware_fingerprint.cache_clear()
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
        hardware_fingerprint.cache_clear()


class FakeGPUs(GPUs):
    """A :class:`GPUs` that returns fixed readings, for code that takes a ``GPUs`` directly."""

    backend = "fake"

    def __init__(self, names: list[str] | None = None, sample: GpuSample | None = None) -> None:
        self._names = names or ["NVIDIA A100-SXM4-80GB"]
        self._sample = sample or GpuSample(0, 90.0, 10e9, 80e9, 300.0, 1410.0, 1000.0)

    def __len__(self) -> int:
        return len(self._names)

    def name(self, index: int) -> str:
        return self._names[index]

    def sample(self, index: int) -> GpuSample:
        return replace(self._sample, index=index)
