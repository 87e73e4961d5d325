"""Read measured gpuopt runs for ``recommend --experiment`` and ``compare`` (read-only).

A "measured run" is one that ``gpuopt.track()`` wrote with a profile: it has the
``gpuopt.flops_per_sample`` param. A "tracked run" is any run ``gpuopt.track()`` wrote (a
``gpuopt.`` param or the ``gpuopt.tracked`` tag), profiled or not: ``compare`` lists those,
with blanks where a figure is missing. Recommendation and candidate runs (tag
``gpuopt.kind``) are neither.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt import contract
from mlflow_gpuopt.mlflow_io.runs import experiment_runs, param_float, param_int

logger = logging.getLogger(__name__)

class MeasuredRunError(InputError):
    """An experiment or run that cannot be read as a measured gpuopt run."""


@dataclass(frozen=True)
class MeasuredRun:
    """What ``compare`` shows for one measured run (``None`` where the run lacks it)."""

    run_id: str
    run_name: str
    device: str  # NVML name or "cpu"
    device_count: int
    nodes: int
    world_size: int
    strategy: str | None
    precision: str | None
    micro_batch: int | None
    params: int | None
    flops_per_sample: float | None
    throughput_samples_per_s: float | None
    mfu: float | None
    step_time_p50_s: float | None
    peak_memory_bytes: float | None
    start_time_ms: int
    plan_id: str | None = None  # tag gpuopt.plan: the run was launched as this plan
    predicted_throughput_samples_per_s: float | None = None  # that plan's prediction


def _measured(run) -> MeasuredRun:
    p, m = run.data.params, run.data.metrics
    return MeasuredRun(
        run_id=run.info.run_id, run_name=run.info.run_name or "",
        device=p.get(contract.PARAM_DEVICE, "unknown"),
        device_count=param_int(p, contract.PARAM_DEVICE_COUNT) or 1,
        nodes=param_int(p, contract.PARAM_NODES) or 1,
        world_size=param_int(p, contract.PARAM_WORLD_SIZE) or 1,
        strategy=p.get(contract.PARAM_STRATEGY), precision=p.get(contract.PARAM_PRECISION),
        micro_batch=param_int(p, contract.PARAM_MICRO_BATCH),
        params=param_int(p, contract.PARAM_PARAMS),
        flops_per_sample=param_float(p, contract.PARAM_FLOPS_PER_SAMPLE),
        throughput_samples_per_s=m.get(contract.SUMMARY_THROUGHPUT_SAMPLES),
        mfu=m.get(contract.SUMMARY_MFU),
        step_time_p50_s=m.get(contract.SUMMARY_STEP_TIME_P50_S),
        peak_memory_bytes=m.get(contract.SUMMARY_PEAK_MEMORY_BYTES),
        start_time_ms=run.info.start_time or 0,
        plan_id=run.data.tags.get(contract.TAG_PLAN),
        predicted_throughput_samples_per_s=m.get(contract.PREDICTED_THROUGHPUT_SAMPLES),
    )


def _is_tracked(run) -> bool:
    return ((run.data.tags.get(contract.TAG_TRACKED) == "true"
             or any(k.startswith(contract.PARAM_PREFIX) for k in run.data.params))
            and run.data.tags.get(contract.TAG_KIND) not in (contract.KIND_RECOMMENDATION,
                                                             contract.KIND_CANDIDATE))


def _is_measured(run, require_profile: bool = True) -> bool:
    return _is_tracked(run) and (not require_profile
                                 or contract.PARAM_FLOPS_PER_SAMPLE in run.data.params)


def measured_runs_in_experiment(name: str, client=None, *,
                                require_profile: bool = True) -> list[MeasuredRun]:
    """Measured runs of experiment ``name``, newest first (raises if none or no experiment).

    With ``require_profile`` False, every tracked run, with or without a FLOPs figure.
    """
    from mlflow import MlflowClient

    runs = experiment_runs(client or MlflowClient(), name, oldest_first=False,
                           error=MeasuredRunError)
    out = [_measured(r) for r in runs if _is_measured(r, require_profile)]
    if not out:
        raise MeasuredRunError(
            f"experiment {name!r} has no runs with gpuopt measurements; record one with "
            "`with gpuopt.track(model=..., optimizer=...):` around the training loop")
    return out


def measured_runs(run_ids: Sequence[str], client=None, *,
                  require_profile: bool = True) -> list[MeasuredRun]:
    """The measured runs ``run_ids`` (raises for an unknown id or a run without gpuopt data;
    with ``require_profile`` False, a tracked run without a FLOPs figure is read too)."""
    from mlflow import MlflowClient

    from mlflow_gpuopt.mlflow_io.runs import RunInputError, get_run

    client = client or MlflowClient()
    out = []
    for rid in run_ids:
        try:
            run = get_run(client, rid)
        except RunInputError as exc:  # unknown id, or a store that cannot be read: one line
            raise MeasuredRunError(str(exc)) from None
        if not _is_measured(run, require_profile):
            raise MeasuredRunError(
                f"run {rid} has no gpuopt measurements; record them with "
                "`with gpuopt.track(model=..., optimizer=...):` around the training loop")
        out.append(_measured(run))
    return out


def same_workload_run_ids(runs: Sequence[MeasuredRun]) -> list[str]:
    """Ids of the runs that measured the same workload as the newest one (params, FLOPs)."""
    newest = runs[0]
    key = (newest.params, newest.flops_per_sample)
    return [r.run_id for r in runs if (r.params, r.flops_per_sample) == key]
