"""Scaling models: throughput, step time, memory and intervals for any GPU, count and
parallelism strategy, fitted to measured runs.

Pure: numbers and frozen dataclasses in and out; numpy/scipy only, no MLflow, torch,
requests or file I/O (adapters in :mod:`mlflow_gpuopt.hardware` and
:mod:`mlflow_gpuopt.mlflow_io` build the inputs).

    predictor = fit(workload, observations, hardware)        # hardware: gpu name -> Hardware
    prediction = predictor.predict(ParallelConfig(gpus_per_node=8), hardware["A100-80GB-SXM4"])
"""

from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import resolve_layout, validate_config
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.perfmodel.precision import normalize_precision
from mlflow_gpuopt.perfmodel.predictor import Predictor, fit, validate_workload
from mlflow_gpuopt.perfmodel.time_to_train import (
    TrainingTime,
    samples_for_target,
    time_to_train,
)
from mlflow_gpuopt.perfmodel.types import (
    STRATEGIES,
    Hardware,
    MemoryBreakdown,
    Observation,
    ParallelConfig,
    Prediction,
    Workload,
)

__all__ = [
    "fit", "Predictor", "Workload", "Hardware", "Observation", "ParallelConfig", "Prediction",
    "MemoryBreakdown", "PerfModelError", "memory_per_gpu", "validate_config",
    "validate_workload", "resolve_layout", "normalize_precision", "STRATEGIES",
    "TrainingTime", "time_to_train", "samples_for_target",
]
