"""AMD Instinct/Radeon GPUs through AMD SMI (AMD's Python package ``amdsmi``, shipped with ROCm).

``amdsmi`` is optional (``pip install mlflow-gpuopt[amd]``, or ROCm's own copy under
``/opt/rocm/share/amd_smi``) and imported on first use only. Every ``AmdSmiException`` is
translated here into a :mod:`~mlflow_gpuopt.devices.errors` exception.

Which GPUs this process sees follows the ROCm runtime: ``ROCR_VISIBLE_DEVICES`` filters the
physical GPUs first, then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``, which HIP also
honours, when ``HIP_VISIBLE_DEVICES`` is unset) indexes into what is left. Physical indices are
the order of ``amdsmi_get_processor_handles()``, which, like HIP's, is PCI bus order.

Units as AMD SMI's Python API returns them (ROCm 6.x/7.x ``amdsmi_interface.py``):
``amdsmi_get_gpu_vram_usage`` → ``vram_total``/``vram_used`` in MB (MiB);
``amdsmi_get_power_info`` → watts in ``socket_power`` (ROCm 7), ``current_socket_power``
(MI300 and newer) or ``average_socket_power`` (MI200 and older); ``amdsmi_get_energy_count``
→ a counter (``energy_accumulator``, ``power`` before ROCm 6.1) times ``counter_resolution``
µJ; unsupported fields read ``"N/A"``.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Mapping

from mlflow_gpuopt.devices.base import GPUs
from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError, DeviceNotSupportedError
from mlflow_gpuopt.devices.nvml import parse_visible_devices
from mlflow_gpuopt.devices.samples import GpuSample
from mlflow_gpuopt.validation import finite_float

logger = logging.getLogger(__name__)

#: ``amdsmi_status_t`` value AMD SMI raises for a query the device does not offer.
AMDSMI_STATUS_NOT_SUPPORTED = 2
_MIB = 1024.0 * 1024.0
#: AMD SMI marks an unsupported struct member with the type's maximum (or ``"N/A"``).
_UNSUPPORTED = {0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}


def _amdsmi() -> Any:
    """The ``amdsmi`` module, imported on first use (tests may substitute a fake one)."""
    return importlib.import_module("amdsmi")


def amdsmi_importable() -> bool:
    """Whether ``import amdsmi`` succeeds here (never raises)."""
    try:
        _amdsmi()
        return True
    except Exception:
        return False


def _reading(value: Any) -> float | None:
    """A reading as float, ``None`` for AMD SMI's "N/A" and "not supported" markers."""
    v = finite_float(value)
    return None if v is None or int(v) in _UNSUPPORTED else v


def visible_physical_indices(count: int, env: Mapping[str, str]) -> list[int | str]:
    """Physical GPU indices (or UUID entries) this process sees, in the order it sees them.

    ``ROCR_VISIBLE_DEVICES`` picks from the ``count`` physical GPUs; ``HIP_VISIBLE_DEVICES``
    (else ``CUDA_VISIBLE_DEVICES``) then picks from that list by position. Parsing follows
    CUDA's rules (:func:`~mlflow_gpuopt.devices.nvml.parse_visible_devices`): it stops at the
    first invalid or out-of-range entry. UUID entries of the second variable are kept as UUIDs.
    """
    first = parse_visible_devices(env.get("ROCR_VISIBLE_DEVICES"), count)
    hip = env.get("HIP_VISIBLE_DEVICES")
    if hip is None:
        hip = env.get("CUDA_VISIBLE_DEVICES")
    if hip is None:
        return first
    out: list[int | str] = []
    for entry in parse_visible_devices(hip, len(first)):
        out.append(first[entry] if isinstance(entry, int) else entry)
    return out


class AmdSmiGPUs(GPUs):
    """The AMD GPUs visible to this process, read through AMD SMI.

    Args:
        visible_devices: a ``HIP_VISIBLE_DEVICES`` value to honour instead of the
            environment's ``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``
            (``ROCR_VISIBLE_DEVICES`` still applies first).
        env: the environment to read (default ``os.environ``).

    Raises:
        DeviceInitError: amdsmi is missing, fails to start, or no GPU is visible.
    """

    backend = "amdsmi"

    def __init__(self, visible_devices: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        try:
            self._smi = _amdsmi()
        except Exception as exc:  # ImportError, or a broken install (no libamd_smi.so)
            raise DeviceInitError(f"amdsmi unavailable: {exc}") from exc
        self._error_cls = getattr(self._smi, "AmdSmiException", Exception)
        self._call(self._smi.amdsmi_init, init=True)
        self._closed = False
        try:
            handles = list(self._call(self._smi.amdsmi_get_processor_handles, init=True))
            environ = dict(os.environ if env is None else env)
            if visible_devices is not None:
                environ["HIP_VISIBLE_DEVICES"] = visible_devices
            self._all_handles = handles
            self._handles = []
            for entry in visible_physical_indices(len(handles), environ):
                if isinstance(entry, int):
                    self._handles.append(handles[entry])
                else:
                    self._handles.append(self._by_uuid(handles, entry))
            if not self._handles:
                raise DeviceInitError("AMD SMI found no visible GPU")
            self._names = [self._market_name(h) for h in self._handles]
        except Exception:
            self.close()
            raise

    # -- error translation ---------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, init: bool = False) -> Any:
        try:
            return fn(*args)
        except self._error_cls as exc:
            code = getattr(exc, "err_code", None)
            if code is None and hasattr(exc, "get_error_code"):
                code = exc.get_error_code()
            if code == AMDSMI_STATUS_NOT_SUPPORTED:
                raise DeviceNotSupportedError(str(exc)) from exc
            if init:
                raise DeviceInitError(f"AMD SMI: {exc}") from exc
            raise DeviceError(f"AMD SMI: {exc}") from exc

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The value, or ``None`` when the device does not offer this query."""
        try:
            return self._call(fn, *args)
        except DeviceNotSupportedError:
            return None

    def _by_uuid(self, handles: list[Any], entry: str) -> Any:
        want = entry.lower().removeprefix("gpu-")
        for h in handles:
            uuid = str(self._call(self._smi.amdsmi_get_gpu_device_uuid, h, init=True)).lower()
            if uuid.removeprefix("gpu-").startswith(want):
                return h
        raise DeviceInitError(f"AMD SMI: no GPU with UUID {entry}")

    def _market_name(self, handle: Any) -> str:
        info = self._call(self._smi.amdsmi_get_gpu_asic_info, handle, init=True)
        name = str(info.get("market_name") or "").strip()
        if not name or name == "N/A":
            return f"AMD GPU {info.get('device_id', '')}".strip()
        return name if name.upper().startswith("AMD") else f"AMD {name}"

    # -- GPUs ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._handles)

    def name(self, index: int) -> str:
        return self._names[index]

    def sample(self, index: int) -> GpuSample:
        s = self._smi
        h = self._handles[index]
        activity = self._optional(s.amdsmi_get_gpu_activity, h) or {}
        vram = self._optional(s.amdsmi_get_gpu_vram_usage, h) or {}
        power = self._optional(s.amdsmi_get_power_info, h) or {}
        clock = None
        clk_type = getattr(getattr(s, "AmdSmiClkType", None), "GFX", None)
        if clk_type is not None and hasattr(s, "amdsmi_get_clock_info"):
            clock = self._optional(s.amdsmi_get_clock_info, h, clk_type) or {}
        energy = None
        if hasattr(s, "amdsmi_get_energy_count"):
            energy = self._optional(s.amdsmi_get_energy_count, h)
        used_mib = _reading(vram.get("vram_used"))
        total_mib = _reading(vram.get("vram_total"))
        watts = next((w for w in (_reading(power.get(k)) for k in
                                  ("socket_power", "current_socket_power",
                                   "average_socket_power")) if w is not None), None)
        mhz = None
        if clock:
            mhz = _reading(clock.get("clk", clock.get("cur_clk")))
        return GpuSample(
            index=index,
            utilization_percent=_reading(activity.get("gfx_activity")),
            memory_used_bytes=None if used_mib is None else used_mib * _MIB,
            memory_total_bytes=None if total_mib is None else total_mib * _MIB,
            power_watts=watts,
            sm_clock_mhz=mhz,
            energy_joules=_energy_joules(energy),
        )

    def fabric_link_active(self, index: int) -> bool:
        """Whether GPU ``index`` reaches another GPU of the node over Infinity Fabric (xGMI)
        rather than PCIe, as ``amdsmi_topo_get_link_type`` reports; False where AMD SMI
        cannot say. The AMD counterpart of NVML's NVLink state."""
        s = self._smi
        xgmi = _xgmi_link_type(s)
        if xgmi is None or not hasattr(s, "amdsmi_topo_get_link_type"):
            return False
        me = self._handles[index]
        for other in self._all_handles:
            if other is me:
                continue
            try:
                link = s.amdsmi_topo_get_link_type(me, other)
            except Exception:  # not supported, VM guest: nothing seen
                continue
            kind = link.get("type") if isinstance(link, dict) else None
            if kind is not None and int(kind) == int(xgmi):
                return True
        return False

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._smi.amdsmi_shut_down()
        except Exception as exc:  # shutting down must never fail the caller
            logger.debug("gpuopt: amdsmi_shut_down failed: %s", exc)


def _xgmi_link_type(smi: Any) -> Any:
    """AMD SMI's value for an xGMI link (the enum is ``AmdSmiLinkType`` in ROCm 6.2+,
    ``AmdSmiIoLinkType`` before), or ``None`` where this amdsmi has neither."""
    for enum_name, member in (("AmdSmiLinkType", "AMDSMI_LINK_TYPE_XGMI"),
                              ("AmdSmiIoLinkType", "XGMI"),
                              ("AmdSmiIoLinkType", "AMDSMI_IOLINK_TYPE_XGMI")):
        value = getattr(getattr(smi, enum_name, None), member, None)
        if value is not None:
            return value
    return None


def infinity_fabric_active(gpu_ids: list[int]) -> bool:
    """Does AMD SMI report an Infinity Fabric (xGMI) link on any of ``gpu_ids``
    (process-visible indices)? False without amdsmi or AMD GPUs; never raises."""
    try:
        gpus = AmdSmiGPUs()
    except Exception:  # no AMD SMI: nothing seen
        return False
    try:
        return any(gpus.fabric_link_active(i) for i in (gpu_ids or [0]) if i < len(gpus))
    finally:
        gpus.close()


def _energy_joules(reading: Mapping[str, Any] | None) -> float | None:
    """Joules from ``amdsmi_get_energy_count``: counter × ``counter_resolution`` (µJ)."""
    if not reading:
        return None
    ticks = _reading(reading.get("energy_accumulator", reading.get("power")))
    resolution_uj = _reading(reading.get("counter_resolution"))
    if ticks is None or resolution_uj is None:
        return None
    return ticks * resolution_uj / 1e6
