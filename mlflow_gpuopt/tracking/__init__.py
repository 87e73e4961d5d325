"""Tracking: ``track()`` / ``Tracker`` measure PyTorch training into an MLflow run.

Heavy modules (torch, mlflow) are imported only when tracking starts.
"""

from __future__ import annotations

from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.tracker import Tracker, track

__all__ = ["track", "Tracker", "TrackConfig"]
