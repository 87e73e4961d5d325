"""The one fit pipeline: measured runs → each measured GPU's hardware → fitted model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlflow_gpuopt.hardware import hardware_for_offer
from mlflow_gpuopt.perfmodel.types import Observation, Workload

__all__ = ["fit_runs", "hardware_for_offer"]


def fit_runs(workload: Workload, observations: Sequence[Observation], catalog: Any, *,
             proxy: Workload | None = None, source: str = "",
             adjust_hardware: Callable[[dict[str, Any]], None] | None = None):
    """The scaling model fitted to ``observations`` (GPU names as the catalog resolved them,
    :mod:`.inputs`), each measured GPU placed in a node as large as its largest run.

    With a ``proxy`` (the smaller workload ``observations`` measured), the model is fitted
    to the proxy and carried to ``workload``
    (:func:`mlflow_gpuopt.perfmodel.transfer.fit_proxy`; ``source`` names the proxy's runs
    or file). ``adjust_hardware`` may change the measured GPUs' hardware in place before the
    fit (``predict --power-limit-w`` / ``--inter-node-gbps`` on the target's GPU type).

    Raises:
        PerfModelError: the model cannot be fitted, or a run measured a GPU the catalog does
            not know; one line starting "cannot fit the scaling model to these runs".
    """
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.hardware import measured_hardware
    from mlflow_gpuopt.perfmodel import PerfModelError, fit
    from mlflow_gpuopt.perfmodel.transfer import fit_proxy

    try:
        hardware = measured_hardware(observations, catalog)
        if adjust_hardware is not None:
            adjust_hardware(hardware)
        if proxy is not None:
            return fit_proxy(proxy, list(observations), hardware, workload, source=source)
        return fit(workload, list(observations), hardware)
    except (PerfModelError, UnknownGpuError) as exc:
        raise PerfModelError(f"cannot fit the scaling model to these runs: {exc}") from None
