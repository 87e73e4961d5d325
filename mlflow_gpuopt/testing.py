"""Test doubles that let the real GPU code paths run on a CPU machine.

:func:`fake_nvml` installs a fake ``pynvml`` module (in ``sys.modules``), so the real
:class:`~mlflow_gpuopt.devices.nvml.NvmlGPUs` backend — index mapping, error translation,
unit conversion — runs unchanged against :class:`FakeGPU` devices::

    with fake_nvml([FakeGPU("NVIDIA A100-SXM4-80GB"), FakeGPU("NVIDIA A100-SXM4-80GB")]) as nvml:
        nvml.fail("nvmlDeviceGetPowerUsage", nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
        ...

:func:`fake_amdsmi` does the same for AMD SMI's ``amdsmi`` module and
:class:`~mlflow_gpuopt.devices.amd.AmdSmiGPUs`, with :class:`FakeAmdGPU` devices read in AMD
SMI's own units and dict keys (MiB of VRAM, watts, a µJ-resolution energy counter)::

    with fake_amdsmi([FakeAmdGPU("AMD Instinct MI300X") for _ in range(8)]) as smi:
        err = smi.AmdSmiLibraryException(smi.AMDSMI_STATUS_NOT_SUPPORTED)
        smi.fail("amdsmi_get_power_info", err)

:func:`clear_caches` forgets what this process has cached (the catalog, the hardware
fingerprint), for a test that changes the files, environment or devices those were read from.

Not for production use; nothing in the package imports this module.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

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


@dataclass
class FakeAmdGPU:
    """One fake AMD device; readings in AMD SMI's units (MiB, W, MHz, counter × µJ).

    ``utilization_series`` / ``vram_used_mib_series`` / ``power_w_series``, when given, are
    returned one value per read (the last repeats), so a run sees a changing series.
    """

    name: str = "AMD Instinct MI300X"
    uuid: str = ""
    vram_total_mib: int = 196_592  # what amd-smi reports for a 192 GB MI300X
    vram_used_mib: int = 20_480
    gfx_activity: int | str = 93
    socket_power_w: int | str = 612
    power_key: str = "current_socket_power"  # MI300+; "average_socket_power" on MI200
    gfx_clock_mhz: int = 2100
    energy_ticks: int = 65_359_477  # × 15.3 µJ = ~1000 J
    counter_resolution_uj: float = 15.3
    supports_energy: bool = True
    xgmi: bool = True  # linked to the other xgmi GPUs over Infinity Fabric (else PCIe)
    utilization_series: list = field(default_factory=list)
    vram_used_mib_series: list = field(default_factory=list)
    power_w_series: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)

    def _next(self, series: list, default: Any, key: str) -> Any:
        if not series:
            return default
        n = self.calls.get(key, 1) - 1
        return series[min(n, len(series) - 1)]


def make_fake_amdsmi(gpus: list[FakeAmdGPU]) -> types.ModuleType:
    """A module with the parts of AMD SMI's Python API the AMD backend uses, backed by ``gpus``.

    ``module.fail(name, exc)`` / ``module.heal(name)`` as in :func:`make_fake_pynvml`;
    ``module.init_count`` counts ``amdsmi_init`` calls, ``module.refs`` the open sessions.
    """
    m = types.ModuleType("amdsmi")
    m.AMDSMI_STATUS_SUCCESS = 0
    m.AMDSMI_STATUS_INVAL = 1
    m.AMDSMI_STATUS_NOT_SUPPORTED = 2
    m.AMDSMI_STATUS_NOT_INIT = 32
    m.AMDSMI_STATUS_DRIVER_NOT_LOADED = 54

    class AmdSmiException(Exception):  # noqa: N818 - amdsmi's own name
        pass

    class AmdSmiLibraryException(AmdSmiException):  # amdsmi's own name
        def __init__(self, err_code: int) -> None:
            super().__init__(err_code)
            self.err_code = err_code

        def get_error_code(self) -> int:
            return self.err_code

        def __str__(self) -> str:
            return f"Error code:\n\t{self.err_code} | AMD SMI error"

    class AmdSmiClkType(enum.IntEnum):
        SYS = 0
        GFX = 0
        DF = 1
        DCEF = 2
        SOC = 3
        MEM = 4

    class AmdSmiLinkType(enum.IntEnum):
        AMDSMI_LINK_TYPE_INTERNAL = 0
        AMDSMI_LINK_TYPE_XGMI = 1
        AMDSMI_LINK_TYPE_PCIE = 2
        AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
        AMDSMI_LINK_TYPE_UNKNOWN = 4

    m.AmdSmiException = AmdSmiException
    m.AmdSmiLibraryException = AmdSmiLibraryException
    m.AmdSmiClkType = AmdSmiClkType
    m.AmdSmiLinkType = AmdSmiLinkType
    m.gpus = gpus
    for i, g in enumerate(gpus):
        g.uuid = g.uuid or f"{i:02x}ff74a1-0000-1000-80a3-3dfd1fdc7a1{i:x}"
    m.failures = {}
    m.init_count = 0
    m.refs = 0
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
            if fn.__name__ not in ("amdsmi_init", "amdsmi_shut_down") and not m.initialized:
                raise AmdSmiLibraryException(m.AMDSMI_STATUS_NOT_INIT)
            if args and isinstance(args[0], FakeAmdGPU):
                args[0].calls[fn.__name__] = args[0].calls.get(fn.__name__, 0) + 1
            return fn(*args)

        wrapper.__name__ = fn.__name__
        setattr(m, fn.__name__, wrapper)
        return wrapper

    @api
    def amdsmi_init(flags=None):
        m.init_count += 1
        m.refs += 1
        m.initialized = True

    @api
    def amdsmi_shut_down():
        if m.refs == 0:
            raise AmdSmiLibraryException(m.AMDSMI_STATUS_NOT_INIT)
        m.refs -= 1
        m.initialized = m.refs > 0

    @api
    def amdsmi_get_processor_handles():
        return list(gpus)

    @api
    def amdsmi_get_gpu_device_uuid(h):
        return h.uuid

    @api
    def amdsmi_get_gpu_asic_info(h):
        return {"market_name": h.name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro "
                "Devices Inc. [AMD/ATI]", "device_id": "0x74a1", "rev_id": "0x00",
                "asic_serial": "0x0", "oam_id": 0}

    @api
    def amdsmi_get_gpu_activity(h):
        gfx = h._next(h.utilization_series, h.gfx_activity, "amdsmi_get_gpu_activity")
        return {"gfx_activity": gfx, "umc_activity": 41, "mm_activity": "N/A"}

    @api
    def amdsmi_get_gpu_vram_usage(h):
        used = h._next(h.vram_used_mib_series, h.vram_used_mib, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": h.vram_total_mib, "vram_used": used}

    @api
    def amdsmi_get_power_info(h):
        watts = h._next(h.power_w_series, h.socket_power_w, "amdsmi_get_power_info")
        out = {"current_socket_power": "N/A", "average_socket_power": "N/A",
               "gfx_voltage": "N/A", "soc_voltage": "N/A", "mem_voltage": "N/A",
               "power_limit": 750}
        out[h.power_key] = watts
        return out

    @api
    def amdsmi_get_clock_info(h, clock_type):
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiLibraryException(m.AMDSMI_STATUS_INVAL)
        return {"clk": h.gfx_clock_mhz, "min_clk": 500, "max_clk": 2100, "clk_locked": False,
                "clk_deep_sleep": "N/A"}

    @api
    def amdsmi_topo_get_link_type(src, dst):
        if src is dst:
            return {"hops": 0, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_INTERNAL}
        if src.xgmi and dst.xgmi:
            return {"hops": 1, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI}
        return {"hops": 2, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE}

    @api
    def amdsmi_get_energy_count(h):
        if not h.supports_energy:
            raise AmdSmiLibraryException(m.AMDSMI_STATUS_NOT_SUPPORTED)
        return {"energy_accumulator": h.energy_ticks,
                "counter_resolution": h.counter_resolution_uj, "timestamp": 0}

    return m


@contextlib.contextmanager
def fake_amdsmi(gpus: list[FakeAmdGPU] | None = None) -> Iterator[types.ModuleType]:
    """Install a fake ``amdsmi`` for the duration of the block (and clear the hardware cache)."""
    from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

    module = make_fake_amdsmi(gpus if gpus is not None else [FakeAmdGPU()])
    saved = sys.modules.get("amdsmi")
    sys.modules["amdsmi"] = module
    hardware_fingerprint.cache_clear()
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop("amdsmi", None)
        else:
            sys.modules["amdsmi"] = saved
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


def clear_caches() -> None:
    """Forget what this process has cached from files, the environment and the devices: the
    loaded catalog, the GPU-memory and GPU-name tables built from it, and the hardware
    fingerprint. The next call reads them again.

    Caches of pure functions (keyed by their whole input) are left warm: they cannot go stale.
    A module not imported yet holds nothing and is not imported here.
    """
    store = sys.modules.get("mlflow_gpuopt.catalog.store")
    if store is not None:
        store.clear_catalog_cache()
    catalog = sys.modules.get("mlflow_gpuopt.catalog")  # holds gpu_names once imported
    if catalog is not None:
        catalog.clear_gpu_name_caches()
    fingerprint = sys.modules.get("mlflow_gpuopt.devices.fingerprint")
    if fingerprint is not None:
        fingerprint.hardware_fingerprint.cache_clear()
