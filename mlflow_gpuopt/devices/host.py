"""The host through psutil: CPU utilisation, this process's memory, host memory."""

from __future__ import annotations

from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError
from mlflow_gpuopt.devices.samples import HostSample


class HostMonitor:
    """Reads the host. The first CPU reading covers the time since construction.

    Raises:
        DeviceInitError: psutil is missing.
    """

    backend = "psutil"

    def __init__(self) -> None:
        try:
            import psutil
        except Exception as exc:
            raise DeviceInitError(f"psutil unavailable: {exc}") from exc
        self._psutil = psutil
        self._process = psutil.Process()
        psutil.cpu_percent(interval=None)  # prime: the next call reports the interval since now

    def sample(self) -> HostSample:
        """One reading; raises :class:`DeviceError` if psutil fails."""
        try:
            vm = self._psutil.virtual_memory()
            return HostSample(
                cpu_utilization_percent=float(self._psutil.cpu_percent(interval=None)),
                process_rss_bytes=float(self._process.memory_info().rss),
                host_memory_used_bytes=float(vm.total - vm.available),
                host_memory_total_bytes=float(vm.total),
            )
        except Exception as exc:
            raise DeviceError(f"psutil: {exc}") from exc
