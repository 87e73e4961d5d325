"""Tracking: ``track()`` / ``Tracker`` measure PyTorch training into an MLflow run.

Measuring (this folder): ``steps`` (the step clock, the only code on the training thread),
``step_timing`` (its hooks and aggregator), ``aggregate`` (step records → windows and steady
state), ``quantiles``, ``hw_reader`` (device readings), ``profiler`` (the one-off workload
profile) and ``profile_log`` (its params and artifact), ``sampler`` (the background tick),
``summary`` (the end-of-run record and its MFU), ``config``, ``gpu_select``, ``run_params``.
``reporting`` decides what the figures become for a single process or a job's rank
(``rank_report``: a rank's report); ``run_log`` is the MLflow run; ``guard`` the never-raise
decorator; ``tracker`` wires it all. Combining the ranks of a torchrun job: ``distributed/``
(which imports none of this folder). Writing to MLflow: :mod:`mlflow_gpuopt.mlflow_io`;
every name written: :mod:`mlflow_gpuopt.contract`.

Heavy modules (torch, mlflow) are imported only when tracking starts.
"""

from __future__ import annotations

from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.tracker import Tracker, track

__all__ = ["track", "Tracker", "TrackConfig"]
