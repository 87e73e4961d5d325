"""Read a tracked run's measurements as the advice rules' :class:`RunFacts`, and log the
advice document to the run (``gpuopt/advice.json``).

Names read (:mod:`mlflow_gpuopt.contract`): the layout and workload params, the model
wrapper param, the summary's input-wait, step-time, utilisation and exposed-communication
metrics, and the profile artifact (precision, micro-batch, matmul shapes, kernel count).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.advice.types import RunFacts
from mlflow_gpuopt.mlflow_io.runs import (
    RunInputError,
    RunRecord,
    get_run,
    param_int,
    read_profile,
)
from mlflow_gpuopt.validation import finite_float


def _metric(metrics: Mapping[str, float], name: str) -> float | None:
    return finite_float(metrics.get(name))


def _shapes(profile: Mapping[str, Any] | None) -> tuple[tuple[int, int, int], ...] | None:
    raw = (profile or {}).get("gemm_shapes")
    if not isinstance(raw, list):
        return None
    out = []
    for s in raw:
        if (isinstance(s, list) and len(s) == 3
                and all(isinstance(d, int) and d > 0 for d in s)):
            out.append((s[0], s[1], s[2]))
    return tuple(out) or None


def load_run_facts(run_id: str, client: Any = None) -> RunFacts:
    """The measurements of ``run_id`` the advice rules read.

    Raises:
        RunInputError: an unknown run, or a run without gpuopt data (one line).
    """
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    run = get_run(client, run_id)
    params = dict(run.data.params)
    if not any(k.startswith(contract.PARAM_PREFIX) for k in params):
        raise RunInputError(f"run {run_id} has no gpuopt data; run it under gpuopt.track()")
    return facts_from_record(RunRecord(run_id, params, dict(run.data.metrics),
                                       read_profile(client, run)))


def facts_from_record(record: RunRecord) -> RunFacts:
    """The advice rules' :class:`RunFacts` from what was already read of a run (no store
    round trip): ``load_run_inputs(...).records`` holds it."""
    run_id, params, metrics = record.run_id, record.params, record.metrics
    profile = record.profile or {}

    def field(key: str) -> Any:
        value = profile.get(key)
        if value in (None, ""):
            value = params.get(contract.WORKLOAD_PARAMS.get(key, ""))
        return None if value in (None, "", "None") else value

    def num(key: str) -> float | None:
        return finite_float(field(key))

    device = params.get(contract.PARAM_DEVICE) or "cpu"
    mb, accum, n_params = num("micro_batch"), num("grad_accum"), num("params")
    return RunFacts(
        run_id=run_id, device=device,
        device_count=param_int(params, contract.PARAM_DEVICE_COUNT, 0) or 0,
        precision=str(field("precision") or "fp32").lower(),
        params=int(n_params) if n_params else None,
        micro_batch=int(mb) if mb else None, grad_accum=max(1, int(accum or 1)),
        step_time_mean_s=_metric(metrics, contract.SUMMARY_STEP_TIME_MEAN_S),
        input_wait_mean_s=_metric(metrics, contract.SUMMARY_INPUT_WAIT_MEAN_S),
        input_wait_fraction=_metric(metrics, contract.SUMMARY_INPUT_WAIT_FRACTION),
        gpu_utilization_mean_percent=_metric(metrics, contract.SUMMARY_GPU_UTILIZATION),
        cpu_utilization_mean_percent=_metric(metrics, contract.SUMMARY_CPU_UTILIZATION),
        gemm_shapes=_shapes(profile),
        model_wrapper=params.get(contract.PARAM_MODEL_WRAPPER) or None,
        compiled=params.get(contract.PARAM_COMPILED) == "true",
        kernels_per_micro_step=num("kernels_per_micro_step"),
        exposed_comm_fraction=_metric(metrics, contract.SUMMARY_EXPOSED_COMM_FRACTION),
        world_size=param_int(params, contract.PARAM_WORLD_SIZE, 1) or 1,
        strategy=params.get(contract.PARAM_STRATEGY) or None,
        recompute=profile.get("recompute") if isinstance(profile.get("recompute"), str)
        else None,
    )


def log_advice(run_id: str, doc: Mapping[str, Any], client: Any = None) -> None:
    """Write ``doc`` to ``gpuopt/advice.json`` of ``run_id`` (replacing an earlier advice;
    nothing else of the run is touched)."""
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    from mlflow_gpuopt.mlflow_io.recommendation import log_files

    log_files(client, run_id,
               {contract.ADVICE_JSON: json.dumps(doc, indent=2, default=str)})


__all__ = ["RunInputError", "facts_from_record", "load_run_facts", "log_advice"]
