"""Reads every device backend once per tick into a :class:`HardwareReading`, keeping peaks.

Each backend and each GPU is read inside its own ``try``; a failure is warned about
(rate-limited) and the other readings of that tick are still returned. A reading names its
own MLflow metrics (:meth:`HardwareReading.metrics`); the distributed job reads its fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from mlflow_gpuopt import contract
from mlflow_gpuopt.devices import GPUs
from mlflow_gpuopt.devices.host import HostMonitor
from mlflow_gpuopt.devices.samples import GpuSample, HostSample, TorchMemorySample
from mlflow_gpuopt.tracking._warn import WarnOnce

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HardwareReading:
    """One tick's readings; keys of ``gpus`` / ``torch_memory`` are ``j`` of ``gpu_<j>`` (the
    GPU's position among those this process samples). A device that failed is absent."""

    gpus: Mapping[int, GpuSample] = field(default_factory=dict)
    torch_memory: Mapping[int, TorchMemorySample] = field(default_factory=dict)
    host: HostSample | None = None

    def metrics(self) -> dict[str, float]:
        """``{metric name: value}`` for the readings the devices gave."""
        m: dict[str, float] = {}
        gm = contract.gpu_metric
        for j, s in self.gpus.items():
            for name, v in ((contract.GPU_UTILIZATION_PERCENT, s.utilization_percent),
                            (contract.GPU_MEMORY_USED_BYTES, s.memory_used_bytes),
                            (contract.GPU_POWER_WATTS, s.power_watts),
                            (contract.GPU_SM_CLOCK_MHZ, s.sm_clock_mhz)):
                if v is not None:
                    m[gm(j, name)] = v
        for j, t in self.torch_memory.items():
            m[gm(j, contract.GPU_TORCH_ALLOCATED_BYTES)] = t.allocated_bytes
            m[gm(j, contract.GPU_TORCH_RESERVED_BYTES)] = t.reserved_bytes
        h = self.host
        if h is not None:
            for name, v in ((contract.METRIC_CPU_UTILIZATION, h.cpu_utilization_percent),
                            (contract.METRIC_HOST_MEMORY_USED, h.host_memory_used_bytes),
                            (contract.METRIC_PROCESS_RSS, h.process_rss_bytes)):
                if v is not None:
                    m[name] = v
        return m


class HardwareReader:
    """Samples ``gpus`` (any backend), torch.cuda memory and the host."""

    def __init__(self, gpus: GPUs, host: HostMonitor | None = None,
                 torch_cuda_indices: list[int] | None = None, warn: WarnOnce | None = None) -> None:
        self.gpus = gpus
        self.host = host
        self.torch_cuda_indices = torch_cuda_indices or []
        self._warn = warn or WarnOnce(logger, every=100)
        self.peak_gpu_memory_used_bytes: float | None = None  # NVML, whole device
        self.peak_torch_reserved_bytes: float | None = None  # this process, caching allocator
        # (the profiler resets torch's peak counters once; it reports the peak it saw first)
        self.peak_process_rss_bytes: float | None = None
        self.first_energy_j: dict[int, float] = {}
        self.last_energy_j: dict[int, float] = {}
        self.util_sum: float = 0.0
        self.util_n: int = 0
        self.cpu_sum: float = 0.0
        self.cpu_n: int = 0

    def read(self) -> HardwareReading:
        """One reading of everything (peaks, energy and utilisation sums are kept)."""
        gpus: dict[int, GpuSample] = {}
        for i in range(len(self.gpus)):
            try:
                s = self.gpus.sample(i)
            except Exception as exc:
                self._warn(f"gpu{i}", "GPU %d reading failed: %s", i, exc)
                continue
            gpus[i] = s
            if s.utilization_percent is not None:
                self.util_sum += s.utilization_percent
                self.util_n += 1
            if s.memory_used_bytes is not None:
                self.peak_gpu_memory_used_bytes = max(self.peak_gpu_memory_used_bytes or 0.0,
                                                      s.memory_used_bytes)
            if s.energy_joules is not None:
                self.first_energy_j.setdefault(i, s.energy_joules)
                self.last_energy_j[i] = s.energy_joules
        torch_memory: dict[int, TorchMemorySample] = {}
        if self.torch_cuda_indices:
            from mlflow_gpuopt.devices.torch_cuda import torch_memory_sample

            for i, cuda_index in enumerate(self.torch_cuda_indices):  # i: as in gpu_<i>
                try:
                    t = torch_memory_sample(cuda_index)
                except Exception as exc:
                    self._warn(f"torch{i}", "torch.cuda memory reading failed: %s", exc)
                    continue
                torch_memory[i] = t
                self.peak_torch_reserved_bytes = max(self.peak_torch_reserved_bytes or 0.0,
                                                     t.peak_reserved_bytes)
        host = None
        if self.host is not None:
            try:
                host = self.host.sample()
            except Exception as exc:
                self._warn("host", "host reading failed: %s", exc)
            else:
                if host.cpu_utilization_percent is not None:
                    self.cpu_sum += host.cpu_utilization_percent
                    self.cpu_n += 1
                if host.process_rss_bytes is not None:
                    self.peak_process_rss_bytes = max(self.peak_process_rss_bytes or 0.0,
                                                      host.process_rss_bytes)
        return HardwareReading(gpus, torch_memory, host)

    @property
    def gpu_utilization_mean_percent(self) -> float | None:
        """Mean GPU utilisation over every reading of every sampled GPU."""
        return self.util_sum / self.util_n if self.util_n else None

    @property
    def cpu_utilization_mean_percent(self) -> float | None:
        """Mean host CPU utilisation over every reading (this node's host)."""
        return self.cpu_sum / self.cpu_n if self.cpu_n else None

    @property
    def energy_joules(self) -> float | None:
        """Energy all sampled GPUs used between the first and the last reading."""
        if not self.last_energy_j:
            return None
        return sum(self.last_energy_j[i] - self.first_energy_j[i] for i in self.last_energy_j)

    def peak_memory_bytes(self) -> float | None:
        """Peak memory of the run: torch's reserved peak, else NVML's, else the process RSS."""
        for v in (self.peak_torch_reserved_bytes, self.peak_gpu_memory_used_bytes,
                  self.peak_process_rss_bytes):
            if v is not None:
                return v
        return None
