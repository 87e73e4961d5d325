"""``mlflow gpuopt advise``: what to change in the training script, ranked by what it saves.

The run's measurements go through the advice rules (:mod:`mlflow_gpuopt.advice`). With a
training target (the ``recommend`` flags) the run is fitted and searched as ``recommend``
does, and each finding is priced on the recommended plan: its predicted hours and expected
cost with and without the fix. Without a target the findings are listed unpriced. The
document is logged to the run as ``gpuopt/advice.json`` unless ``--no-log``; bad input is
one line and exit code 2, and nothing is written.
"""

from __future__ import annotations

import sys

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import LoggingFailed, UsageError, one_line_reason
from mlflow_gpuopt.cli.options import parse_target, reject_empty_values, target_options
from mlflow_gpuopt.validation import BOUNDS


def plan_summary(c) -> dict:
    """The plan a finding is priced on, as the advice document names it."""
    from mlflow_gpuopt.recommend.explain import strategy_label

    return {"provider": c.offer.provider, "instance_type": c.offer.instance_type,
            "nodes": c.nodes, "gpus": c.config.gpus, "gpu": c.offer.gpu,
            "strategy": strategy_label(c.config), "micro_batch": c.config.micro_batch,
            "grad_accum": c.config.grad_accum, "precision": c.config.precision,
            "pricing": c.pricing, "hours": c.hours, "cost_usd": c.cost_usd}


def price_on_plan(facts, rec, predictor, catalog):
    """(findings priced on ``rec``'s winner — else its cheapest plan —, the plan's summary),
    or ``None`` when the search found no plan."""
    from mlflow_gpuopt.advice import PlanContext, advise_plan
    from mlflow_gpuopt.cli.recommend import _hardware_for
    from mlflow_gpuopt.recommend import Costing

    plan = rec.winner or rec.cheapest
    if plan is None:
        return None
    from mlflow_gpuopt.hardware import hardware_for_gpu

    spec = catalog.gpus[plan.offer.gpu]
    measured = _measured_spec(facts.device)
    ctx = PlanContext(plan=plan, predictor=predictor, hardware=_hardware_for(spec, plan.offer),
                      spec=spec, target=rec.target, costing=Costing(),
                      measured_hardware=None if measured is None else hardware_for_gpu(
                          measured, gpus_per_node=max(1, facts.world_size)))
    return advise_plan(facts, ctx), plan_summary(plan)


def _search(run_id, training_target, deadline_h, confidence):
    """The recommendation for the run and target, as ``recommend`` computes it."""
    from mlflow_gpuopt.cli.recommend import _fit, _global_batch, _hardware_for, _load_inputs
    from mlflow_gpuopt.cli.options import load_catalog_or_fail
    from mlflow_gpuopt.recommend import SearchSpace, Target, recommend

    catalog = load_catalog_or_fail()
    workload, observations, _, _ = _load_inputs((run_id,), None)
    batch = _global_batch(workload, observations)
    total = training_target.total_samples(tokens_per_sample=workload.tokens_per_sample,
                                          samples_per_step=batch)
    predictor = _fit(workload, observations, catalog)
    target = Target(total_samples=total, deadline_hours=deadline_h, confidence=confidence,
                    per_rank_batch=(workload.micro_batch or 1) * (workload.grad_accum or 1),
                    description=training_target.description, global_batch=batch)
    max_nodes = max((o.max_nodes for o in catalog.offers), default=1)
    rec = recommend(predictor, workload, catalog.offers, catalog.gpus, target,
                    hardware_for=_hardware_for, space=SearchSpace(max_nodes=max_nodes),
                    with_scaling=False)
    return rec, predictor, catalog


def _money(x):
    from mlflow_gpuopt.recommend.explain import money

    return money(x)


def _print(doc, out) -> None:
    plan = doc["plan"]
    if plan:
        click.echo(f"Priced on the recommended plan: {plan['provider']} "
                   f"{plan['instance_type']} × {plan['nodes']} ({plan['gpus']} {plan['gpu']}, "
                   f"{plan['precision']}), {plan['hours']:,.1f} h, "
                   f"{_money(plan['cost_usd'])}", file=out)
    if not doc["findings"]:
        click.echo("No findings: no rule found anything to change in this run.", file=out)
    for i, f in enumerate(doc["findings"], 1):
        if f["usd_saved"] is not None:
            from mlflow_gpuopt.recommend.explain import hours_figure

            worth = f"saves {hours_figure(f['hours_saved'])} h, {_money(f['usd_saved'])}"
        else:
            worth = "not priced"
        click.echo(f"{i}. [{f['rule']}] {f['title']} — {worth}", file=out)
        for e in f["evidence"]:
            click.echo(f"   evidence: {e['name']} = {e['value']} ({e['text']})", file=out)
        click.echo(f"   fix: {f['fix']}", file=out)
        if f["worth_note"]:
            click.echo(f"   worth: {f['worth_note']}", file=out)
    for x in doc["not_evaluated"]:
        click.echo(f"Not evaluated [{x['rule']}]: {x['reason']}", file=out)
    for note in doc["notes"]:
        click.echo(f"Note: {note}", file=out)


@click.command(name="advise")
@click.option("--run-id", "run_id", required=True, metavar="ID", help="The tracked run.")
@target_options
@click.option("--deadline", metavar="DURATION", help="Wall-clock deadline: 24h, 90m, 2d.")
@click.option("--confidence", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=0.9, show_default=True,
              help="A plan meets the deadline when P(time <= deadline) is at least this.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a list.")
@click.option("--no-log", is_flag=True, help="Do not log gpuopt/advice.json to the run.")
def advise(run_id, samples, epochs, dataset_size, tokens, steps, deadline, confidence,
           as_json, no_log):
    """What to change in the training script: each finding with its evidence, the fix and,
    given a target, the hours and dollars it saves on the recommended plan."""
    from mlflow_gpuopt.quantities import QuantityError, parse_duration_hours

    reject_empty_values(click.get_current_context())
    if not 0.0 < confidence < 1.0:
        raise UsageError(f"--confidence must be a probability between 0 and 1 (exclusive), "
                         f"got {confidence}")
    try:
        deadline_h = parse_duration_hours(deadline, what="--deadline") if deadline else None
    except QuantityError as exc:
        raise UsageError(str(exc)) from None
    if deadline_h is not None and not BOUNDS["deadline_hours"].contains(deadline_h):
        raise UsageError(f"--deadline {deadline} is {deadline_h:.3g} hours; a deadline is "
                         f"{BOUNDS['deadline_hours'].text()} hours")
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=False)
    if deadline_h is not None and training_target is None:
        raise UsageError("--deadline needs a target: --samples N, --epochs E --dataset-size "
                         "N, --tokens T or --steps S")

    from mlflow_gpuopt.advice import advice_doc, cheap_findings
    from mlflow_gpuopt.mlflow_io.advice import RunInputError, load_run_facts

    try:
        facts = load_run_facts(run_id)
    except RunInputError as exc:
        raise UsageError(str(exc)) from None
    notes: list[str] = []
    plan = None
    if training_target is None:
        items = cheap_findings(facts, _measured_spec(facts.device))
        notes.append("not priced: give a target (--epochs E --dataset-size N, --samples, "
                     "--tokens or --steps) to price each finding on the recommended plan")
    else:
        rec, predictor, catalog = _search(run_id, training_target, deadline_h, confidence)
        priced = price_on_plan(facts, rec, predictor, catalog)
        if priced is None:
            items = cheap_findings(facts, _measured_spec(facts.device))
            notes.append("not priced: no plan fits this target (see `mlflow gpuopt "
                         "recommend`)")
        else:
            items, plan = priced
            if rec.winner is None:
                notes.append("no plan meets the deadline: priced on the cheapest plan")
            notes.append(f"target: {rec.target.description} "
                         f"({rec.target.total_samples:,.0f} samples)")
    doc = advice_doc(run_id, items, plan, notes)
    log_error = None
    if not no_log:
        from mlflow_gpuopt.mlflow_io.advice import log_advice

        try:
            log_advice(run_id, doc)
        except Exception as exc:  # a read-only store: print all the same
            log_error = one_line_reason(exc)
    out = sys.stdout
    if as_json:
        click.echo(_json.dumps(doc, indent=2), file=out)
    else:
        _print(doc, out)
    if log_error is not None:
        raise LoggingFailed(f"could not log {doc and 'gpuopt/advice.json'} to run {run_id} "
                            f"(the advice is printed above): {log_error}")


def _measured_spec(device: str):
    """The catalog's spec of the measured GPU, or ``None`` (a CPU, or a GPU it lacks)."""
    if device == "cpu":
        return None
    from mlflow_gpuopt.catalog import CatalogError, load_gpus, resolve_gpu

    try:
        return load_gpus().get(resolve_gpu(device))
    except (CatalogError, ValueError):
        return None
