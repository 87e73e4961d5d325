"""``mlflow gpuopt accuracy --experiment NAME [--json]``: the prediction ledger.

Every run of the experiment launched as a plan (tag ``gpuopt.plan``) is paired with that
plan's predictions (its recommendation run's ``gpuopt/recommendation.json``): predicted vs
measured throughput, hours and cost, the error, whether the 90 % interval covered it, and the
totals (:mod:`mlflow_gpuopt.launch.ledger`). Then the same after refitting the model with the
measured runs included, leave-one-out: the refit that scores a run never saw that run.
Bad input (no such experiment, no pairs) is one line and exit code 2.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import UsageError


def _refit(plan, run_ids: tuple[str, ...], catalog, cache: dict) -> Any:
    """The plan's throughput predicted by a model fitted on ``run_ids``; a reason if none."""
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.hardware import hardware_for_gpu, measured_hardware
    from mlflow_gpuopt.launch.ledger import Refit
    from mlflow_gpuopt.mlflow_io.runs import RunInputError, load_run_inputs
    from mlflow_gpuopt.perfmodel import PerfModelError, fit
    from mlflow_gpuopt.perfmodel.types import ParallelConfig

    if not run_ids:
        return "no run to fit on"
    try:
        if run_ids not in cache:
            inputs = load_run_inputs(list(run_ids))
            cache[run_ids] = fit(inputs.workload, inputs.observations,
                                 measured_hardware(inputs.observations, catalog))
        predictor = cache[run_ids]
        spec = catalog.gpu(plan.gpu)
        offers = [o for o in catalog.offers if o.provider == plan.provider
                  and o.instance_type == plan.instance_type and o.gpu == spec.name]
        offer = next((o for o in offers if o.region == plan.region), offers[0] if offers
                     else None)
        per_node = plan.gpus_per_node or max(1, (plan.gpus or 1) // max(1, plan.nodes or 1))
        hardware = hardware_for_gpu(spec, gpus_per_node=offer.gpu_count if offer else per_node,
                                    offer=offer)
        config = ParallelConfig(gpus_per_node=per_node, nodes=plan.nodes or 1,
                                strategy=plan.strategy or "ddp", micro_batch=plan.micro_batch,
                                grad_accum=plan.grad_accum or 1, precision=plan.precision,
                                activation_checkpointing=plan.activation_checkpointing,
                                tp=plan.tp, pp=plan.pp)
        pred = predictor.predict(config, hardware)
    except (RunInputError, PerfModelError, UnknownGpuError, ValueError) as exc:
        return f"refit failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return Refit(pred.throughput_samples_per_s, pred.low, pred.high, run_ids)


def build_ledger(experiment: str) -> dict[str, Any]:
    """The ledger of ``experiment`` as JSON-ready dict; :class:`UsageError` if it has none."""
    from mlflow_gpuopt.launch.ledger import ledger_row, ledger_totals, refit_run_ids
    from mlflow_gpuopt.launch.plan_check import PlanPrediction
    from mlflow_gpuopt.mlflow_io.plans import PlanError, planned_runs_in_experiment, plans_for

    try:
        runs = planned_runs_in_experiment(experiment)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if not runs:
        raise UsageError(f"experiment {experiment!r} has no runs launched as a plan (tag "
                         f"{contract.TAG_PLAN}); launch one with `mlflow gpuopt recommend "
                         "... --emit torchrun`")
    plans = plans_for(runs)
    notes: list[str] = []
    pairs = []
    for r in runs:
        plan = plans[r.plan_id]
        measured = r.metrics.get(contract.SUMMARY_THROUGHPUT_SAMPLES)
        if not isinstance(plan, PlanPrediction):
            notes.append(f"run {r.run_id}: {plan}")
        elif not measured:
            notes.append(f"run {r.run_id}: no measured throughput "
                         f"({contract.SUMMARY_THROUGHPUT_SAMPLES}); did it finish?")
        else:
            pairs.append((r, plan, measured))
    if not pairs:
        raise UsageError(f"experiment {experiment!r} has no (plan, measured run) pairs: "
                         + "; ".join(notes))
    from mlflow_gpuopt.cli.options import load_catalog_or_fail

    catalog = load_catalog_or_fail()
    measured_ids = [r.run_id for r, _, _ in pairs
                    if contract.PARAM_FLOPS_PER_SAMPLE in r.params]
    cache: dict = {}
    rows = [ledger_row(r.run_id, r.run_name, plan, measured,
                       _refit(plan, refit_run_ids(plan, r.run_id, measured_ids), catalog, cache))
            for r, plan, measured in pairs]
    return {"experiment": experiment, "pairs": [row.to_dict() for row in rows],
            "totals": ledger_totals(rows), "notes": notes}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _num(x: float | None, fmt: str = "{:.4g}") -> str:
    return "-" if x is None else fmt.format(x)


def _print(doc: dict[str, Any], out) -> None:
    head = ("run", "plan", "GPUs", "predicted/s (90%)", "measured/s", "error", "covered",
            "hours pred→meas", "cost pred→meas", "refit/s", "refit err")
    rows = []
    for p in doc["pairs"]:
        interval = (f" ({_num(p['predicted_low_samples_per_s'])}–"
                    f"{_num(p['predicted_high_samples_per_s'])})"
                    if p["predicted_low_samples_per_s"] is not None else "")
        cov = {True: "yes", False: "no", None: "-"}[p["covered"]]
        rows.append((p["run_id"][:12], p["plan_id"].split(":")[-1] if ":" in p["plan_id"]
                     else p["plan_id"], f"{p['gpus'] or '-'} {p['gpu'] or ''}".strip(),
                     _num(p["predicted_throughput_samples_per_s"]) + interval,
                     _num(p["measured_throughput_samples_per_s"]), _pct(p["error"]), cov,
                     f"{_num(p['predicted_hours'])}→{_num(p['measured_hours'])}",
                     f"{_num(p['predicted_cost_usd'], '${:,.2f}')}→"
                     f"{_num(p['measured_cost_usd'], '${:,.2f}')}",
                     _num(p["refit_throughput_samples_per_s"]), _pct(p["refit_error"])))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
               file=out)
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(),
                   file=out)
    for label, key in (("Plans as predicted", "plan"), ("Refit with the measured runs "
                                                         "(leave-one-out)", "refit")):
        t = doc["totals"][key]
        if not t["pairs"]:
            click.echo(f"{label}: no pair could be refitted", file=out)
            continue
        cov = "-" if t["coverage"] is None else f"{t['coverage']:.0%}"
        click.echo(f"{label}: {t['pairs']} pair(s), median |error| "
                   f"{t['median_abs_error']:.1%}, p90 |error| {t['p90_abs_error']:.1%}, "
                   f"90% interval covered {cov}", file=out)
    for p in doc["pairs"]:
        if p["refit_note"]:
            click.echo(f"Note: run {p['run_id']}: {p['refit_note']}", file=out)
    for note in doc["notes"]:
        click.echo(f"Note: {note}", file=out)


@click.command(name="accuracy")
@click.option("--experiment", metavar="NAME", required=True,
              help="Experiment whose runs launched as a plan are held against it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def accuracy(experiment, as_json):
    """Predicted vs measured for every run launched as a plan, and after a refit."""
    from mlflow_gpuopt.cli.options import reject_empty_values

    reject_empty_values(click.get_current_context())
    doc = build_ledger(experiment)
    if as_json:
        click.echo(_json.dumps(doc, indent=2), file=sys.stdout)
    else:
        _print(doc, sys.stdout)
