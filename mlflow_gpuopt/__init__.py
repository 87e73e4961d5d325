"""mlflow-gpuopt: measure PyTorch training in MLflow and recommend cloud GPUs for a deadline.

The public API is small and loaded lazily, because MLflow imports this package (through the
plugin entry point) on every ``import mlflow``; nothing heavy may happen at import time.

    import mlflow_gpuopt as gpuopt
    with gpuopt.track(model=model, optimizer=opt):
        ...
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["track", "Tracker", "TrackConfig", "__version__"]


def __getattr__(name: str):
    if name in ("track", "Tracker", "TrackConfig"):
        from mlflow_gpuopt import tracking

        return getattr(tracking, name)
    raise AttributeError(f"module 'mlflow_gpuopt' has no attribute {name!r}")
