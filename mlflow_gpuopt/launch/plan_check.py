"""A plan's predictions held against what the job launched as it measured (pure).

* :class:`PlanPrediction`: what ``gpuopt/recommendation.json`` predicted for one plan.
* :func:`prediction_metrics`: those predictions as ``gpuopt/predicted/*`` metrics.
* :func:`prediction_ratios`: measured / predicted throughput, step time and memory.
* :func:`outlier_line`: one line when the job fell outside the plan's interval, with the
  likely causes its measurements point to; ``None`` when it did not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.validation import finite_float

#: Memory may exceed the prediction by this share before it is called out: the model's own
#: allowance for allocator fragmentation and temporary buffers
#: (:data:`mlflow_gpuopt.perfmodel.memory.ALLOCATOR_OVERHEAD` and its spread).
MEMORY_MARGIN = 0.10
#: GPU utilisation (mean %) below which, with a busy host, the input pipeline is suspect.
LOW_GPU_UTILIZATION_PERCENT = 70.0
#: Host CPU utilisation (mean %) above which the host counts as busy.
HIGH_CPU_UTILIZATION_PERCENT = 80.0
#: Exposed communication beyond the model's share by more than this (fraction of a step).
EXPOSED_COMM_SLACK = 0.10


@dataclass(frozen=True)
class PlanPrediction:
    """One ranked plan's predictions (global throughput of the whole job, per-GPU memory).

    ``throughput_low``/``_high`` bound the throughput at the fit's ~90 % interval;
    ``hours`` (``_low``/``_high``) and ``cost_usd`` are for the recommendation's target.
    ``plan_run_id`` is the plan's child run, where one was logged.
    """

    plan_id: str
    recommendation_run_id: str | None
    rank: int
    throughput_samples_per_s: float
    throughput_low_samples_per_s: float | None
    throughput_high_samples_per_s: float | None
    step_time_s: float | None
    memory_per_gpu_bytes: float | None
    hours: float | None
    hours_low: float | None
    hours_high: float | None
    cost_usd: float | None
    total_samples: float | None = None
    fixed_hours: float = 0.0  # start-up and restart overhead inside ``hours``
    micro_batch: int | None = None
    grad_accum: int | None = None
    precision: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    nodes: int | None = None
    strategy: str | None = None
    exposed_comm_fraction: float | None = None
    plan_run_id: str | None = None
    source_run_ids: tuple[str, ...] = ()
    provider: str | None = None
    instance_type: str | None = None
    region: str | None = None
    gpus_per_node: int | None = None
    tp: int = 1
    pp: int = 1
    activation_checkpointing: bool = False


def _num(row: Mapping[str, Any], key: str) -> float | None:
    return finite_float(row.get(key))


def plan_from_candidate(row: Mapping[str, Any], *, plan_id: str,
                        recommendation_run_id: str | None, target: Mapping[str, Any] | None = None,
                        source_run_ids: tuple[str, ...] = (),
                        plan_run_id: str | None = None) -> PlanPrediction:
    """A :class:`PlanPrediction` from one row of ``recommendation.json``'s ``candidates``.

    Rows written before the throughput interval and step time were recorded get them from
    the hours interval (compute hours scale as 1 / throughput) and the global batch."""
    thr = float(row["throughput_samples_per_s"])
    low = _num(row, "throughput_low_samples_per_s")
    high = _num(row, "throughput_high_samples_per_s")
    hours, h_low, h_high = (_num(row, "predicted_hours"), _num(row, "predicted_hours_low"),
                            _num(row, "predicted_hours_high"))
    fixed = (_num(row, "startup_hours") or 0.0) + (_num(row, "overhead_hours") or 0.0)
    if low is None and hours and h_high and h_high - fixed > 0:
        low = thr * (hours - fixed) / (h_high - fixed)
    if high is None and hours and h_low and h_low - fixed > 0:
        high = thr * (hours - fixed) / (h_low - fixed)
    step = _num(row, "step_time_s")
    if step is None and _num(row, "global_batch") and thr > 0:
        step = float(row["global_batch"]) / thr
    return PlanPrediction(
        plan_id=plan_id, recommendation_run_id=recommendation_run_id, rank=int(row["rank"]),
        throughput_samples_per_s=thr, throughput_low_samples_per_s=low,
        throughput_high_samples_per_s=high, step_time_s=step,
        memory_per_gpu_bytes=_num(row, "memory_per_gpu_bytes"), hours=hours, hours_low=h_low,
        hours_high=h_high, cost_usd=_num(row, "predicted_cost_usd"),
        total_samples=_num(target or {}, "total_samples"), fixed_hours=fixed,
        micro_batch=row.get("micro_batch"), grad_accum=row.get("grad_accum"),
        precision=row.get("precision"), gpu=row.get("gpu"), gpus=row.get("gpus"),
        nodes=row.get("nodes"), strategy=row.get("strategy"),
        exposed_comm_fraction=_num(row, "exposed_comm_fraction"), plan_run_id=plan_run_id,
        source_run_ids=tuple(source_run_ids), provider=row.get("provider"),
        instance_type=row.get("instance_type"), region=row.get("region"),
        gpus_per_node=row.get("gpus_per_node"), tp=int(row.get("tp") or 1),
        pp=int(row.get("pp") or 1),
        activation_checkpointing=bool(row.get("activation_checkpointing")))


def prediction_metrics(p: PlanPrediction) -> dict[str, float]:
    """The plan's predictions as ``gpuopt/predicted/*`` metrics (unknown ones left out)."""
    values = {
        contract.PREDICTED_THROUGHPUT_SAMPLES: p.throughput_samples_per_s,
        contract.PREDICTED_THROUGHPUT_LOW: p.throughput_low_samples_per_s,
        contract.PREDICTED_THROUGHPUT_HIGH: p.throughput_high_samples_per_s,
        contract.PREDICTED_STEP_TIME_S: p.step_time_s,
        contract.PREDICTED_MEMORY_PER_GPU_BYTES: p.memory_per_gpu_bytes,
        contract.PREDICTED_HOURS: p.hours, contract.PREDICTED_HOURS_LOW: p.hours_low,
        contract.PREDICTED_HOURS_HIGH: p.hours_high, contract.PREDICTED_COST_USD: p.cost_usd,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Measured:
    """What a job measured, as the plan check needs it.

    ``peak_memory_per_gpu_bytes`` only on a GPU (a CPU run's peak is its process RSS, which
    the per-GPU prediction does not describe). Utilisations are means in percent.
    """

    throughput_samples_per_s: float | None = None
    step_time_s: float | None = None  # mean optimizer-step time, steady state
    peak_memory_per_gpu_bytes: float | None = None
    gpu_utilization_percent: float | None = None
    cpu_utilization_percent: float | None = None
    exposed_comm_fraction: float | None = None
    micro_batch: int | None = None
    precision: str | None = None


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted or predicted <= 0:
        return None
    return measured / predicted


def prediction_ratios(m: Measured, p: PlanPrediction) -> dict[str, float]:
    """``gpuopt/summary/prediction_ratio_*``: measured / predicted, where both are known."""
    values = {
        contract.SUMMARY_PREDICTION_RATIO_THROUGHPUT: _ratio(m.throughput_samples_per_s,
                                                             p.throughput_samples_per_s),
        contract.SUMMARY_PREDICTION_RATIO_STEP_TIME: _ratio(m.step_time_s, p.step_time_s),
        contract.SUMMARY_PREDICTION_RATIO_MEMORY: _ratio(m.peak_memory_per_gpu_bytes,
                                                         p.memory_per_gpu_bytes),
    }
    return {k: v for k, v in values.items() if v is not None}


def likely_causes(m: Measured, p: PlanPrediction) -> list[str]:
    """What the measurements point to when a job misses its plan, most specific first."""
    causes = []
    if p.micro_batch and m.micro_batch and int(m.micro_batch) != int(p.micro_batch):
        causes.append(f"micro-batch {m.micro_batch}, the plan's is {p.micro_batch}")
    if p.precision and m.precision and m.precision != p.precision:
        causes.append(f"precision {m.precision}, the plan's is {p.precision}")
    if (m.gpu_utilization_percent is not None and m.cpu_utilization_percent is not None
            and m.gpu_utilization_percent < LOW_GPU_UTILIZATION_PERCENT
            and m.cpu_utilization_percent > HIGH_CPU_UTILIZATION_PERCENT):
        causes.append(f"input pipeline starving the GPU (GPU {m.gpu_utilization_percent:.0f}% "
                      f"busy, CPU {m.cpu_utilization_percent:.0f}%)")
    if m.exposed_comm_fraction is not None:
        planned = p.exposed_comm_fraction or 0.0
        if m.exposed_comm_fraction > planned + EXPOSED_COMM_SLACK:
            causes.append(f"communication exposed for {m.exposed_comm_fraction:.0%} of a step, "
                          f"the model's share is {planned:.0%}")
    return causes


def outlier_line(m: Measured, p: PlanPrediction) -> str | None:
    """One line when measured throughput is outside the plan's interval or memory exceeds the
    prediction by more than :data:`MEMORY_MARGIN`; ``None`` when the job is as planned."""
    misses = []
    thr = m.throughput_samples_per_s
    low, high = p.throughput_low_samples_per_s, p.throughput_high_samples_per_s
    if thr is not None and low is not None and thr < low:
        misses.append(f"throughput {thr:.4g} samples/s is below plan {p.plan_id}'s 90% interval "
                      f"({low:.4g}-{high:.4g})" if high is not None else
                      f"throughput {thr:.4g} samples/s is below plan {p.plan_id}'s {low:.4g}")
    elif thr is not None and high is not None and thr > high:
        misses.append(f"throughput {thr:.4g} samples/s is above plan {p.plan_id}'s 90% interval "
                      f"({low if low is not None else 0:.4g}-{high:.4g})")
    mem, pmem = m.peak_memory_per_gpu_bytes, p.memory_per_gpu_bytes
    if mem is not None and pmem and mem > pmem * (1 + MEMORY_MARGIN):
        misses.append(f"peak memory {mem / 2**30:.2f} GiB per GPU is over the predicted "
                      f"{pmem / 2**30:.2f} GiB by more than {MEMORY_MARGIN:.0%}")
    if not misses:
        return None
    causes = likely_causes(m, p)
    why = ("; likely: " + ", ".join(causes) if causes
           else "; no cause stands out in the measurements")
    return "gpuopt: off plan: " + "; ".join(misses) + why
