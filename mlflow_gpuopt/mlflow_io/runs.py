"""Read what ``gpuopt.track()`` logged into runs and turn it into the models' inputs.

Names read (:mod:`mlflow_gpuopt.contract`, documented in ``docs/metrics.md``): the layout and
workload params, the summary throughput and exposed-communication metrics, and the profile
artifact.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.perfmodel.types import STRATEGIES, Observation, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

logger = logging.getLogger(__name__)

PROFILE_ARTIFACT = contract.PROFILE_ARTIFACT
THROUGHPUT_METRIC = contract.SUMMARY_THROUGHPUT_SAMPLES
EXPOSED_COMM_METRIC = contract.SUMMARY_EXPOSED_COMM_FRACTION  # distributed runs only
HOW_TO_TRACK = "run it under gpuopt.track() (e.g. `python examples/train_tiny_gpt.py`)"
#: Runs whose FLOPs per sample differ by more than this are not the same workload.
FLOPS_TOLERANCE = 0.15


class RunInputError(ValueError):
    """Runs that cannot feed the models; one line naming the run and what is missing."""


@dataclass(frozen=True)
class RunInputs:
    """The workload and measurements read from one or more runs of the same training."""

    workload: Workload
    observations: tuple[Observation, ...]
    run_ids: tuple[str, ...]


def _int(params: dict[str, str], key: str, default: int | None = None) -> int | None:
    """Param ``key`` as an int (``"8"``, ``"8.0"``), or ``default`` when it is missing,
    empty, ``"None"`` or not a finite number (MLflow stores every param as a string)."""
    value = _float(params, key)
    return default if value is None else int(value)


def _float(params: dict[str, str], key: str,
           default: float | None = None) -> float | None:
    """Param ``key`` as a finite float, or ``default`` when it is missing, empty, ``"None"``
    or not a finite number."""
    value = params.get(key)
    if value in (None, "", "None"):
        return default
    try:
        number = float(value)
    except ValueError:
        return default
    return number if math.isfinite(number) else default


def _read_profile(client: Any, run_id: str) -> dict | None:
    """``gpuopt/profile.json`` of a run, or None when the run has none."""
    try:
        listed = {f.path for f in client.list_artifacts(run_id, contract.ARTIFACT_DIR)}
    except Exception as exc:  # an unreachable artifact store: say so, fall back to params
        logger.warning("cannot list artifacts of run %s: %s", run_id, exc)
        return None
    if PROFILE_ARTIFACT not in listed:
        return None
    with tempfile.TemporaryDirectory(prefix="gpuopt-profile-") as tmp:
        local = client.download_artifacts(run_id, PROFILE_ARTIFACT, tmp)
        try:
            return json.loads(Path(local).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RunInputError(f"run {run_id}: {PROFILE_ARTIFACT} is unreadable: {exc}") from None


def _workload(run_id: str, params: dict[str, str], profile: dict | None) -> Workload:
    doc: dict[str, Any] = dict(profile or {})
    # Params fill what the profile lacks (the profile wins: it has the full-precision figures).
    for key, param in contract.WORKLOAD_PARAMS.items():
        if doc.get(key) in (None, "") and params.get(param) not in (None, "", "None"):
            doc[key] = params[param]
    try:
        return workload_from_dict(doc, where=f"run {run_id}")
    except WorkloadFileError as exc:
        raise RunInputError(f"{exc}; {HOW_TO_TRACK}") from None


def _observation(run_id: str, params: dict[str, str], metrics: dict[str, float],
                 workload: Workload, resolve_gpu: Callable[[str], str] | None) -> Observation:
    device = params.get(contract.PARAM_DEVICE, "cpu") or "cpu"
    gpu = "cpu"
    if device.strip().lower() != "cpu":
        gpu = device
        if resolve_gpu is not None:
            try:
                gpu = resolve_gpu(device)
            except ValueError as exc:
                raise RunInputError(f"run {run_id}: {exc}") from None
    throughput = metrics.get(THROUGHPUT_METRIC)
    if throughput is None or not math.isfinite(throughput) or throughput <= 0:
        raise RunInputError(
            f"run {run_id} has no {THROUGHPUT_METRIC} (did it finish a few steps?); "
            f"{HOW_TO_TRACK}")
    nodes = _int(params, contract.PARAM_NODES, 1) or 1
    world = _int(params, contract.PARAM_WORLD_SIZE)
    count = world or ((_int(params, contract.PARAM_DEVICE_COUNT, 1) or 1) * nodes if gpu != "cpu"
                      else 1)
    strategy = (params.get(contract.PARAM_STRATEGY) or "").lower() or (
        "single" if count == 1 else "ddp")
    if strategy not in STRATEGIES:
        raise RunInputError(f"run {run_id}: unknown {contract.PARAM_STRATEGY} {strategy!r}")
    return Observation(
        gpu=gpu, gpu_count=max(1, count), throughput_samples_per_s=float(throughput),
        nodes=nodes if count % nodes == 0 else 1,
        micro_batch=_int(params, contract.PARAM_MICRO_BATCH) or workload.micro_batch,
        strategy=strategy, precision=params.get(contract.PARAM_PRECISION) or workload.precision,
        grad_accum=_int(params, contract.PARAM_GRAD_ACCUM, 1) or 1,
        exposed_comm_fraction=_fraction(metrics.get(EXPOSED_COMM_METRIC)))


def _fraction(value: float | None) -> float | None:
    """A measured fraction in [0, 1], or None when absent or not a number."""
    if value is None or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


def _same_workload(a: Workload, b: Workload) -> str | None:
    """Why ``a`` and ``b`` are different workloads, or None."""
    if a.params != b.params:
        return f"{a.params} vs {b.params} parameters"
    if abs(a.flops_per_sample - b.flops_per_sample) > FLOPS_TOLERANCE * max(
            a.flops_per_sample, b.flops_per_sample):
        return f"{a.flops_per_sample:.3g} vs {b.flops_per_sample:.3g} FLOPs per sample"
    return None


def get_run(client: Any, run_id: str) -> Any:
    """``client.get_run(run_id)``; raises :class:`RunInputError` (one line) when the id is
    unknown or the store cannot be read, and says which of the two it was."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        code = getattr(exc, "error_code", "")
        if "NOT_EXIST" in str(code) or "not found" in str(exc).lower() \
                or "INVALID_PARAMETER" in str(code):
            raise RunInputError(f"unknown run id {run_id!r}") from None
        raise RunInputError(f"cannot read run {run_id!r}: {str(exc).splitlines()[0]}") \
            from None


def load_run_inputs(run_ids: Sequence[str], client: Any = None,
                    resolve_gpu: Callable[[str], str] | None = None) -> RunInputs:
    """Workload and observations from ``run_ids`` (the first run's profile is the workload).

    ``client`` is an ``mlflow.MlflowClient`` (default: one for the current tracking URI);
    ``resolve_gpu`` maps NVML names to canonical ones (default: the catalog's).

    Raises:
        RunInputError: an unknown run id, a run without gpuopt data, or runs of different
            workloads; the message is one line.
    """
    if not run_ids:
        raise RunInputError("no run id given")
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient()
    if resolve_gpu is None:
        from mlflow_gpuopt.catalog import resolve_gpu as _resolve

        resolve_gpu = _resolve
    workload: Workload | None = None
    first = ""
    observations: list[Observation] = []
    for run_id in dict.fromkeys(run_ids):  # keep order, drop repeats
        run = get_run(client, run_id)
        params = dict(run.data.params)
        if not any(k.startswith(contract.PARAM_PREFIX) for k in params):
            raise RunInputError(f"run {run_id} has no gpuopt data; {HOW_TO_TRACK}")
        profile = _read_profile(client, run_id)
        this = _workload(run_id, params, profile)
        if workload is None:
            workload, first = this, run_id
        else:
            why = _same_workload(workload, this)
            if why:
                raise RunInputError(
                    f"runs {first} and {run_id} are different workloads ({why}); "
                    "pass runs of the same training script")
        observations.append(_observation(run_id, params, dict(run.data.metrics), this,
                                         resolve_gpu))
    assert workload is not None
    return RunInputs(workload=workload, observations=tuple(observations),
                     run_ids=tuple(dict.fromkeys(run_ids)))
