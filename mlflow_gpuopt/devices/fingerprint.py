"""What machine this is, read offline and cheaply: GPU model/count, CPU, memory, cloud instance.

Used for the run tags (``plugin.HardwareRunContextProvider``) and the ``hardware`` block of
``gpuopt/profile.json``. Nothing here touches the network or imports torch.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from mlflow_gpuopt import contract

logger = logging.getLogger(__name__)

DMI_DIR = Path("/sys/class/dmi/id")


@dataclass(frozen=True)
class HardwareFingerprint:
    """The machine a run ran on. ``gpu`` is the driver's name (NVML or AMD SMI), or ``cpu`` when
    no GPU is visible."""

    gpu: str = "cpu"
    gpu_count: int = 0
    gpu_memory_bytes: float | None = None  # per GPU
    cpu: str = "unknown"
    cpu_count: int = 0  # logical CPUs
    memory_bytes: float = 0.0  # host RAM
    cloud: str | None = None  # aws | gcp | azure | colab | None
    instance_type: str | None = None  # e.g. p4d.24xlarge, where it can be read offline

    def to_dict(self) -> dict:
        return asdict(self)

    def tags(self) -> dict[str, str]:
        """The MLflow tags of this fingerprint (``gpuopt.hw.*``); unknown values are left out."""
        tags = {
            contract.TAG_HW_GPU: self.gpu,
            contract.TAG_HW_GPU_COUNT: str(self.gpu_count),
            contract.TAG_HW_CPU: self.cpu,
            contract.TAG_HW_CPU_COUNT: str(self.cpu_count),
            contract.TAG_HW_MEMORY_GB: f"{self.memory_bytes / 1e9:.1f}",
        }
        if self.cloud:
            tags[contract.TAG_HW_CLOUD] = self.cloud
        if self.instance_type:
            tags[contract.TAG_HW_INSTANCE_TYPE] = self.instance_type
        return tags


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else ``platform.processor()``."""
    text = _read(cpuinfo)
    if text:
        for line in text.splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or platform.machine() or "unknown"


def host_memory_bytes() -> float:
    """Physical RAM of the host, in bytes (0.0 where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def cloud_instance(dmi_dir: Path = DMI_DIR, env: Mapping[str, str] | None = None
                   ) -> tuple[str | None, str | None]:
    """``(cloud, instance_type)`` from DMI files and Colab's environment, offline.

    AWS Nitro puts the instance type in ``product_name``; GCP and Azure only name themselves.
    """
    env = os.environ if env is None else env
    if env.get("COLAB_GPU") is not None or env.get("COLAB_RELEASE_TAG"):
        gpu = env.get("COLAB_GPU")
        return "colab", "colab" + (f"-gpu{gpu}" if gpu not in (None, "", "0") else "")
    vendor = " ".join(filter(None, (_read(dmi_dir / n) for n in ("board_vendor", "sys_vendor"))))
    product = _read(dmi_dir / "product_name")
    low = vendor.lower()
    if "amazon" in low:
        return "aws", product
    if "google" in low:
        return "gcp", None
    if "microsoft" in low:
        return "azure", None
    return None, None


def probe_hardware() -> HardwareFingerprint:
    """Look at this machine now (uncached; see :func:`hardware_fingerprint`)."""
    gpu, count, gpu_mem = "cpu", 0, None
    from mlflow_gpuopt.devices.amd import AmdSmiGPUs
    from mlflow_gpuopt.devices.nvml import NvmlGPUs

    for backend in (AmdSmiGPUs, NvmlGPUs):  # the vendor libraries, in get_gpus' order
        try:
            gpus = backend()
        except Exception as exc:  # library missing / no GPU of this vendor
            logger.debug("gpuopt: no %s GPU: %s", backend.backend, exc)
            continue
        try:
            count = len(gpus)
            gpu = gpus.name(0)
            gpu_mem = gpus.memory_total_bytes(0)
        except Exception as exc:
            logger.debug("gpuopt: %s GPU unreadable: %s", backend.backend, exc)
        finally:
            gpus.close()
        break
    cloud, instance = cloud_instance()
    return HardwareFingerprint(gpu=gpu, gpu_count=count, gpu_memory_bytes=gpu_mem, cpu=cpu_model(),
                               cpu_count=os.cpu_count() or 0, memory_bytes=host_memory_bytes(),
                               cloud=cloud, instance_type=instance)


@functools.lru_cache(maxsize=1)
def hardware_fingerprint() -> HardwareFingerprint:
    """This machine, probed once per process (``hardware_fingerprint.cache_clear()`` re-probes)."""
    return probe_hardware()
