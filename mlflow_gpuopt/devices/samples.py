"""What one reading of a device holds: frozen records with the unit in every field name.

``None`` means "this device or driver does not offer the measurement", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU.

    ``index`` is the index as this process sees it (after ``CUDA_VISIBLE_DEVICES``).
    """

    index: int
    utilization_percent: float | None = None  # share of time a kernel ran, 0..100
    memory_used_bytes: float | None = None  # device memory in use by all processes
    memory_total_bytes: float | None = None
    power_watts: float | None = None  # board power draw
    sm_clock_mhz: float | None = None
    energy_joules: float | None = None  # cumulative counter since the driver loaded


@dataclass(frozen=True)
class TorchMemorySample:
    """PyTorch's caching-allocator view of one CUDA device (this process only)."""

    index: int
    allocated_bytes: float
    reserved_bytes: float
    peak_allocated_bytes: float  # since the process started or the last peak reset
    peak_reserved_bytes: float


@dataclass(frozen=True)
class HostSample:
    """One reading of the host (CPU side)."""

    cpu_utilization_percent: float | None = None  # whole machine, 0..100, since the last reading
    process_rss_bytes: float | None = None  # resident memory of this process
    host_memory_used_bytes: float | None = None
    host_memory_total_bytes: float | None = None
