"""Lightning's callback under the import path docs/tracking.md also gives; it lives in
:mod:`mlflow_gpuopt.integrations.lightning`."""

from __future__ import annotations

from mlflow_gpuopt.integrations.lightning import GpuOptCallback, mlflow_logger_run_id

__all__ = ["GpuOptCallback", "mlflow_logger_run_id"]
