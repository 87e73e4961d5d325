"""Read what ``gpuopt.track()`` logged into runs and turn it into the models' inputs.

Names read (:mod:`mlflow_gpuopt.contract`, documented in ``docs/metrics.md``): the layout and
workload params, the summary throughput and exposed-communication metrics, and the profile
artifact.
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt import contract
from mlflow_gpuopt.perfmodel.activations import normalize_recompute
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import context_degree, parse_layout, with_degree
from mlflow_gpuopt.perfmodel.types import STRATEGIES, Observation, Workload
from mlflow_gpuopt.validation import OutOfRangeError, check, finite_float
from mlflow_gpuopt.workload_files import (
    WorkloadFileError,
    parse_json_document,
    workload_from_dict,
)

logger = logging.getLogger(__name__)

HOW_TO_TRACK = "run it under gpuopt.track() (e.g. `python examples/train_tiny_gpt.py`)"
#: Runs whose FLOPs per sample differ by more than this are not the same workload.
FLOPS_TOLERANCE = 0.15


class RunInputError(InputError):
    """Runs that cannot feed the models; one line naming the run and what is missing."""


@dataclass(frozen=True)
class RunRecord:
    """What was read of one run (plain values, no MLflow objects): kept so that a second
    reader of the same run (the advice rules) needs no second round trip to the store."""

    run_id: str
    params: dict[str, str]
    metrics: dict[str, float]
    profile: dict | None


@dataclass(frozen=True)
class RunInputs:
    """The workload and measurements read from one or more runs of the same training."""

    workload: Workload
    observations: tuple[Observation, ...]
    run_ids: tuple[str, ...]
    #: What the reader had to do differently, in words (e.g. a run without its summary).
    notes: tuple[str, ...] = ()
    #: What was read of each run, in ``run_ids`` order.
    records: tuple[RunRecord, ...] = ()


def param_int(params: dict[str, str], key: str, default: int | None = None) -> int | None:
    """Param ``key`` as an int (``"8"``, ``"8.0"``), or ``default`` when it is missing,
    empty, ``"None"`` or not a finite number (MLflow stores every param as a string)."""
    value = param_float(params, key)
    return default if value is None else int(value)


def param_float(params: dict[str, str], key: str,
                default: float | None = None) -> float | None:
    """Param ``key`` as a finite float, or ``default`` when it is missing, empty, ``"None"``
    or not a finite number."""
    value = finite_float(params.get(key))
    return default if value is None else value


def read_profile(client: Any, run: Any) -> dict | None:
    """``gpuopt/profile.json`` of ``run`` (an MLflow ``Run``), or None when the run has none;
    a profile that is not UTF-8 JSON holding one object is a :class:`RunInputError` (one
    line).

    Read through the repository of the run's own ``artifact_uri``: ``client.list_artifacts``
    and ``client.download_artifacts`` by run id each fetch the run again and search its
    logged models to resolve the same URI (four extra store queries per profile)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    run_id = run.info.run_id
    try:
        repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=client.tracking_uri)
        listed = {f.path for f in repo.list_artifacts(contract.ARTIFACT_DIR)}
    except Exception as exc:  # an unreachable artifact store: say so, fall back to params
        logger.warning("cannot list artifacts of run %s: %s", run_id, exc)
        return None
    if contract.PROFILE_ARTIFACT not in listed:
        return None
    with tempfile.TemporaryDirectory(prefix="gpuopt-profile-") as tmp:
        local = repo.download_artifacts(contract.PROFILE_ARTIFACT, tmp)
        where = f"run {run_id}: {contract.PROFILE_ARTIFACT}"
        try:
            text = Path(local).read_text(encoding="utf-8")
        except OSError as exc:
            raise RunInputError(f"{where} is unreadable: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise RunInputError(f"{where} is not UTF-8 text (a damaged upload?)") from None
        try:
            doc = parse_json_document(text, where)
        except WorkloadFileError as exc:
            raise RunInputError(str(exc)) from None
        if not isinstance(doc, dict):
            raise RunInputError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        return doc


def _workload(run_id: str, params: dict[str, str], profile: dict | None,
              notes: list[str] | None = None) -> Workload:
    """The run's workload: its profile, params filling what the profile lacks. The
    architecture fields are optional: one the workload checks refuse (a damaged or
    hand-edited run) is left out, said in ``notes``, and the rest of the run is used."""
    doc: dict[str, Any] = dict(profile or {})
    # Params fill what the profile lacks (the profile wins: it has the full-precision figures).
    for key, param in contract.WORKLOAD_PARAMS.items():
        if doc.get(key) in (None, "") and params.get(param) not in (None, "", "None"):
            doc[key] = params[param]
    where = f"run {run_id}"
    arch = {k: doc.pop(k) for k in contract.ARCHITECTURE_PARAMS if doc.get(k) not in (None, "")}
    try:
        workload = workload_from_dict(doc, where=where, tracked_profile=True)
    except WorkloadFileError as exc:
        raise RunInputError(f"{exc}; {HOW_TO_TRACK}") from None
    kept: dict[str, Any] = {}
    for key, value in arch.items():  # in contract order: num_heads before num_kv_heads
        try:
            workload = workload_from_dict({**doc, **kept, key: value}, where=where,
                                          tracked_profile=True)
        except WorkloadFileError as exc:
            if notes is not None:
                notes.append(f"{exc}; the architecture field {key} was left out")
            continue
        kept[key] = value
    return workload


#: Run params checked against :data:`mlflow_gpuopt.validation.BOUNDS` (name without prefix).
_RANGED_PARAMS = ("world_size", "device_count", "nodes", "micro_batch", "grad_accum")


def _check_params(run_id: str, params: dict[str, str]) -> None:
    """Counts no real job has (a negative world size, 1e9 nodes) are a damaged run."""
    for name in _RANGED_PARAMS:
        value = param_float(params, contract.PARAM_PREFIX + name)
        if value is None or (value == 0 and name in ("micro_batch", "grad_accum")):
            continue  # absent, or 0: not measured (the profile's value is used)
        try:
            check(name, value, where=f"run {run_id}", label=f"param {contract.PARAM_PREFIX}{name}")
        except OutOfRangeError as exc:
            raise RunInputError(str(exc)) from None


def _series_throughput(client: Any, run_id: str) -> float | None:
    """The steady throughput of a run without a summary (a trainer killed before it): the
    median of the last half of its per-interval series (the first half holds the warm-up),
    or None."""
    try:
        history = client.get_metric_history(run_id, contract.METRIC_THROUGHPUT_SAMPLES)
    except Exception as exc:  # a store that cannot be read: the run is unusable, say why
        raise RunInputError(f"cannot read {contract.METRIC_THROUGHPUT_SAMPLES} of run {run_id}: "
                            f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    values = [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))
              if math.isfinite(m.value) and m.value > 0]
    if not values:
        return None
    return float(statistics.median(values[len(values) // 2:]))


def _observation(run_id: str, params: dict[str, str], metrics: dict[str, float],
                 workload: Workload, resolve_gpu: Callable[[str], str] | None,
                 client: Any = None, notes: list[str] | None = None) -> Observation:
    device = params.get(contract.PARAM_DEVICE, "cpu") or "cpu"
    gpu = "cpu"
    if device.strip().lower() != "cpu":
        gpu = device
        if resolve_gpu is not None:
            try:
                gpu = resolve_gpu(device)
            except ValueError as exc:
                raise RunInputError(f"run {run_id}: {exc}") from None
    _check_params(run_id, params)
    throughput = metrics.get(contract.SUMMARY_THROUGHPUT_SAMPLES)
    if (throughput is None and client is not None
            and metrics.get(contract.METRIC_THROUGHPUT_SAMPLES) is not None):
        throughput = _series_throughput(client, run_id)
        if throughput is not None and notes is not None:
            notes.append(f"run {run_id} has no {contract.SUMMARY_THROUGHPUT_SAMPLES} (its "
                         f"trainer stopped before the summary); used the median of the last "
                         f"half of its {contract.METRIC_THROUGHPUT_SAMPLES} series, "
                         f"{throughput:,.1f} samples/s")
    if throughput is None or not math.isfinite(throughput) or throughput <= 0:
        raise RunInputError(
            f"run {run_id} has no {contract.SUMMARY_THROUGHPUT_SAMPLES} (did it finish a few "
            f"steps?); {HOW_TO_TRACK}")
    try:
        check("throughput_samples_per_s", throughput, where=f"run {run_id}",
              label=f"metric {contract.SUMMARY_THROUGHPUT_SAMPLES}")
    except OutOfRangeError as exc:
        raise RunInputError(str(exc)) from None
    nodes = param_int(params, contract.PARAM_NODES, 1) or 1
    world = param_int(params, contract.PARAM_WORLD_SIZE)
    count = world or ((param_int(params, contract.PARAM_DEVICE_COUNT, 1) or 1) * nodes
                      if gpu != "cpu" else 1)
    strategy, tp, pp = _layout(run_id, params, count)
    return Observation(
        gpu=gpu, gpu_count=max(1, count), throughput_samples_per_s=float(throughput),
        nodes=nodes if count % nodes == 0 else 1,
        micro_batch=param_int(params, contract.PARAM_MICRO_BATCH) or workload.micro_batch,
        strategy=strategy, precision=params.get(contract.PARAM_PRECISION) or workload.precision,
        grad_accum=param_int(params, contract.PARAM_GRAD_ACCUM, 1) or 1,
        exposed_comm_fraction=_fraction(metrics.get(contract.SUMMARY_EXPOSED_COMM_FRACTION)),
        tp=tp, pp=pp, recompute=_recompute(params.get(contract.PARAM_RECOMPUTE)))


def _layout(run_id: str, params: dict[str, str], count: int) -> tuple[str, int, int]:
    """``(strategy, tp, pp)`` of a run: its ``gpuopt.strategy`` (any layout ``--strategy``
    takes: ``ddp``, ``tp2xfsdp``, ``tp8xpp12xddp``), with the degrees ``gpuopt.tp`` /
    ``gpuopt.pp`` where logged, else those the strategy string names (1 when it names
    none, or only ``tp``/``pp`` without a number: the model then resolves them). A
    context-parallel degree ``gpuopt.cp`` the strategy does not spell is added to it
    (``fsdp`` with ``gpuopt.cp`` 2 is ``cp2xfsdp``)."""
    strategy = "".join((params.get(contract.PARAM_STRATEGY) or "").split()).lower() or (
        "single" if count == 1 else "ddp")
    try:
        name, tp_s, pp_s, _vp, _dp = parse_layout(strategy)
    except PerfModelError:
        raise RunInputError(f"run {run_id}: unknown {contract.PARAM_STRATEGY} {strategy!r}") \
            from None
    if name not in STRATEGIES:
        raise RunInputError(f"run {run_id}: unknown {contract.PARAM_STRATEGY} {strategy!r}")
    cp = param_int(params, contract.PARAM_CP) or 1
    if cp > 1 and context_degree(strategy) == 1 and name != "single":
        strategy = with_degree(strategy, "cp", cp)
    tp = param_int(params, contract.PARAM_TP) or max(1, tp_s)
    pp = param_int(params, contract.PARAM_PP) or max(1, pp_s)
    for degree, label in ((tp, contract.PARAM_TP), (pp, contract.PARAM_PP)):
        if degree < 1 or count % degree:
            raise RunInputError(f"run {run_id}: param {label} {degree} does not divide the "
                                f"run's {count} processes")
    if tp * pp > 1 and count % (tp * pp):
        raise RunInputError(f"run {run_id}: tp {tp} x pp {pp} does not divide the run's "
                            f"{count} processes")
    return strategy, tp, pp


def _recompute(value: str | None) -> str | None:
    """A run's recompute mode (the profile saw it), or None when not logged / not known."""
    if value in (None, "", "None"):
        return None
    try:
        return normalize_recompute(value)
    except ValueError:
        return None


def _fraction(value: float | None) -> float | None:
    """A measured fraction in [0, 1], or None when absent or not a number."""
    if value is None or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


def same_workload(a: Workload, b: Workload) -> str | None:
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


#: Runs read from one experiment at most (``compare``, ``accuracy``).
MAX_EXPERIMENT_RUNS = 1000


def experiment_runs(client: Any, name: str, *, oldest_first: bool,
                    error: type[Exception] = RunInputError) -> list[Any]:
    """The runs of experiment ``name`` by start time (at most
    :data:`MAX_EXPERIMENT_RUNS`); ``error`` (one line) when there is no such experiment or the
    store cannot be read (a tracking server down, say)."""
    from mlflow.exceptions import MlflowException

    try:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise error(f"no MLflow experiment named {name!r}")
        return client.search_runs(
            [exp.experiment_id], max_results=MAX_EXPERIMENT_RUNS,
            order_by=[f"attributes.start_time {'ASC' if oldest_first else 'DESC'}"])
    except MlflowException as exc:
        lines = str(exc).strip().splitlines()
        raise error(f"cannot read experiment {name!r}: "
                    f"{lines[0] if lines else type(exc).__name__}") from None


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
    notes: list[str] = []
    records: list[RunRecord] = []
    for run_id in dict.fromkeys(run_ids):  # keep order, drop repeats
        run = get_run(client, run_id)
        params = dict(run.data.params)
        if not any(k.startswith(contract.PARAM_PREFIX) for k in params):
            raise RunInputError(f"run {run_id} has no gpuopt data; {HOW_TO_TRACK}")
        profile = read_profile(client, run)
        records.append(RunRecord(run_id, params, dict(run.data.metrics), profile))
        this = _workload(run_id, params, profile, notes)
        if workload is None:
            workload, first = this, run_id
        else:
            why = same_workload(workload, this)
            if why:
                raise RunInputError(
                    f"runs {first} and {run_id} are different workloads ({why}); "
                    "pass runs of the same training script")
        observations.append(_observation(run_id, params, dict(run.data.metrics), this,
                                         resolve_gpu, client, notes))
    assert workload is not None
    return RunInputs(workload=workload, observations=tuple(observations),
                     run_ids=tuple(dict.fromkeys(run_ids)), notes=tuple(notes),
                     records=tuple(records))
