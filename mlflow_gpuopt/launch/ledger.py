"""The accuracy ledger: every (plan, measured run) pair, its error, and the totals (pure).

For a job launched as a plan, with measured global throughput ``m`` and the plan's predicted
throughput ``p`` (90 % interval ``[low, high]``):

* error = ``m / p - 1`` (signed; -0.2 means the job ran 20 % slower than predicted);
* covered = ``low <= m <= high``;
* measured hours = the plan's start-up/overhead hours + ``total_samples / m / 3600`` (the
  recommendation's target at the measured speed), measured cost = predicted cost × measured
  hours / predicted hours (billing increments not re-applied).

Totals: median and 90th percentile of ``|error|`` (linear interpolation between order
statistics, as ``numpy.percentile``) and the coverage (share of pairs whose interval covered
the measurement). The same for the refit predictions when given (leave-one-out:
:func:`refit_run_ids` never includes the run being scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mlflow_gpuopt.launch.plan_check import PlanPrediction


@dataclass(frozen=True)
class Refit:
    """A plan's throughput predicted again by a model fitted with the measured runs."""

    throughput_samples_per_s: float
    low: float
    high: float
    run_ids: tuple[str, ...]  # the runs the model was fitted on


@dataclass(frozen=True)
class LedgerRow:
    """One (plan, measured run) pair. Throughputs in samples/s, hours, USD."""

    run_id: str
    run_name: str
    plan_id: str
    gpu: str | None
    gpus: int | None
    predicted_throughput_samples_per_s: float
    predicted_low_samples_per_s: float | None
    predicted_high_samples_per_s: float | None
    measured_throughput_samples_per_s: float
    predicted_hours: float | None
    measured_hours: float | None
    predicted_cost_usd: float | None
    measured_cost_usd: float | None
    error: float
    covered: bool | None
    refit_throughput_samples_per_s: float | None = None
    refit_low_samples_per_s: float | None = None
    refit_high_samples_per_s: float | None = None
    refit_error: float | None = None
    refit_covered: bool | None = None
    refit_note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _covered(m: float, low: float | None, high: float | None) -> bool | None:
    if low is None or high is None:
        return None
    return low <= m <= high


def ledger_row(run_id: str, run_name: str, plan: PlanPrediction, measured: float,
               refit: Refit | str | None = None) -> LedgerRow:
    """The row of one pair (``measured``: the run's global throughput, samples/s);
    ``refit`` is the refit prediction, or why there is none."""
    p = plan
    hours = cost = None
    if p.total_samples and measured > 0:
        hours = p.fixed_hours + p.total_samples / measured / 3600.0
        if p.cost_usd is not None and p.hours:
            cost = p.cost_usd * hours / p.hours
    extra: dict = {}
    if isinstance(refit, Refit):
        extra = dict(refit_throughput_samples_per_s=refit.throughput_samples_per_s,
                     refit_low_samples_per_s=refit.low, refit_high_samples_per_s=refit.high,
                     refit_error=measured / refit.throughput_samples_per_s - 1.0,
                     refit_covered=_covered(measured, refit.low, refit.high))
    elif isinstance(refit, str):
        extra = {"refit_note": refit}
    return LedgerRow(
        run_id=run_id, run_name=run_name, plan_id=p.plan_id, gpu=p.gpu, gpus=p.gpus,
        predicted_throughput_samples_per_s=p.throughput_samples_per_s,
        predicted_low_samples_per_s=p.throughput_low_samples_per_s,
        predicted_high_samples_per_s=p.throughput_high_samples_per_s,
        measured_throughput_samples_per_s=measured, predicted_hours=p.hours,
        measured_hours=hours, predicted_cost_usd=p.cost_usd, measured_cost_usd=cost,
        error=measured / p.throughput_samples_per_s - 1.0,
        covered=_covered(measured, p.throughput_low_samples_per_s,
                         p.throughput_high_samples_per_s), **extra)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def totals(errors: Sequence[float], covered: Sequence[bool | None]) -> dict:
    """``{"pairs", "median_abs_error", "p90_abs_error", "coverage"}`` (None where empty)."""
    abs_errors = [abs(e) for e in errors]
    known = [c for c in covered if c is not None]
    return {"pairs": len(abs_errors),
            "median_abs_error": percentile(abs_errors, 50) if abs_errors else None,
            "p90_abs_error": percentile(abs_errors, 90) if abs_errors else None,
            "coverage": sum(known) / len(known) if known else None}


def ledger_totals(rows: Sequence[LedgerRow]) -> dict:
    """``{"plan": totals of the plans' own predictions, "refit": totals of the refits}``."""
    refit = [r for r in rows if r.refit_error is not None]
    return {"plan": totals([r.error for r in rows], [r.covered for r in rows]),
            "refit": totals([r.refit_error for r in refit], [r.refit_covered for r in refit])}


def refit_run_ids(plan: PlanPrediction, scored_run_id: str,
                  measured_run_ids: Sequence[str]) -> tuple[str, ...]:
    """The runs a leave-one-out refit for ``scored_run_id`` fits on: the plan's source runs
    and every other measured run, never the scored one (order kept, no repeats)."""
    ids = [*plan.source_run_ids, *measured_run_ids]
    return tuple(i for i in dict.fromkeys(ids) if i != scored_run_id)
