"""The one fit pipeline: measured runs → each measured GPU's hardware → fitted model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt.hardware import hardware_for_offer
from mlflow_gpuopt.perfmodel.types import Observation, Workload

__all__ = ["fit_runs", "hardware_for_offer"]


def fit_runs(workload: Workload, observations: Sequence[Observation], catalog: Any):
    """The scaling model fitted to ``observations`` (GPU names as the catalog resolved them,
    :mod:`.inputs`), each measured GPU placed in a node as large as its largest run.

    Raises:
        PerfModelError: the model cannot be fitted, or a run measured a GPU the catalog does
            not know; one line starting "cannot fit the scaling model to these runs".
    """
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.hardware import measured_hardware
    from mlflow_gpuopt.perfmodel import PerfModelError, fit

    try:
        return fit(workload, list(observations), measured_hardware(observations, catalog))
    except (PerfModelError, UnknownGpuError) as exc:
        raise PerfModelError(f"cannot fit the scaling model to these runs: {exc}") from None
