"""Lightning's callback, under the integrations' names (it lives in
:mod:`mlflow_gpuopt.tracking.lightning`)::

    from mlflow_gpuopt.integrations.lightning import GpuOptCallback
    trainer = L.Trainer(logger=MLFlowLogger(...), callbacks=[GpuOptCallback()])
"""

from __future__ import annotations

from mlflow_gpuopt.tracking.lightning import GpuOptCallback, mlflow_logger_run_id

__all__ = ["GpuOptCallback", "mlflow_logger_run_id"]
