"""What the tracker hands the advice rules at the end of a run: the model's wrapper, the
input-wait figures of the step clock, and the one-line top finding of the exit summary.

The end-of-run line evaluates only the rules that need no catalog offers or prediction
(:func:`mlflow_gpuopt.advice.cheap_findings`); ``mlflow gpuopt advise`` prices them all.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt.advice import RunFacts, cheap_findings, top_finding

logger = logging.getLogger(__name__)


def model_wrapper(model: Any) -> str:
    """The tracked model's wrapper: ``DataParallel``, ``DistributedDataParallel``,
    ``FullyShardedDataParallel``, ``compiled`` (``torch.compile``) or ``none``."""
    if model is None:
        return "none"
    import torch

    if isinstance(model, torch.nn.DataParallel):
        return "DataParallel"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "DistributedDataParallel"
    name = type(model).__name__
    if name == "FullyShardedDataParallel" or name.startswith("FSDP"):
        return "FullyShardedDataParallel"
    if name == "OptimizedModule" or hasattr(model, "_orig_mod"):
        return "compiled"
    return "none"


def input_wait_figures(wait_sum_s: float, waits: int, recent_waits_s: Sequence[float],
                       step_time_p50_s: float | None) -> tuple[float | None, float | None]:
    """(mean input wait per step in seconds, the typical step's share 0..1: the median of
    the recent waits over the median step time). Medians, so that a pause of the tracker's
    own thread or the garbage collector in a few steps does not read as starvation; a
    loader that is slow on every step is in the median."""
    if waits <= 0:
        return None, None
    mean = wait_sum_s / waits
    if not recent_waits_s or not step_time_p50_s or step_time_p50_s <= 0:
        return mean, None
    return mean, min(1.0, statistics.median(recent_waits_s) / step_time_p50_s)


def top_finding_line(facts: RunFacts) -> str | None:
    """``gpuopt advice: <top finding>`` or ``None`` when no cheap rule finds anything."""
    spec = None
    if facts.device != "cpu":
        try:
            from mlflow_gpuopt.catalog import load_gpus, resolve_gpu

            spec = load_gpus().get(resolve_gpu(facts.device))
        except Exception as exc:  # a GPU the catalog lacks: the precision rule says so
            logger.debug("gpuopt: no spec for %s: %s", facts.device, exc)
    top = top_finding(cheap_findings(facts, spec))
    if top is None:
        return None
    where = f" --run-id {facts.run_id}" if facts.run_id else ""
    return (f"gpuopt advice: {top.line()} — `mlflow gpuopt advise{where} --epochs ...` "
            "prices every finding")
