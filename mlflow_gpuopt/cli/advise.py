"""``mlflow gpuopt advise``: what to change in the training script, ranked by what it saves.

The run's measurements go through the advice rules (:mod:`mlflow_gpuopt.advice`). With a
training target (the ``recommend`` flags) each finding is priced on the recommended plan: its
predicted hours and expected cost with and without the fix
(:mod:`mlflow_gpuopt.planning.advising`). Without a target the findings are listed unpriced.
The document is logged to the run as ``gpuopt/advice.json`` unless ``--no-log``; bad input is
one line and exit code 2, and nothing is written.
"""

from __future__ import annotations

import sys

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import LoggingFailed, UsageError
from mlflow_gpuopt.cli.options import (
    confidence_option,
    load_catalog_or_fail,
    parse_deadline,
    parse_target,
    reject_empty_values,
    target_options,
)


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
        base = plan.get("baseline")
        if base:
            click.echo(f"Savings are measured from the script as it runs now on that plan "
                       f"({base['precision']}, micro-batch {base['micro_batch']} × "
                       f"accumulation {base['grad_accum']}): {base['hours']:,.1f} h, "
                       f"{_money(base['cost_usd'])}", file=out)
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
@confidence_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a list.")
@click.option("--no-log", is_flag=True, help="Do not log gpuopt/advice.json to the run.")
def advise(run_id, samples, epochs, dataset_size, tokens, steps, deadline, confidence,
           as_json, no_log):
    """What to change in the training script: each finding with its evidence, the fix and,
    given a target, the hours and dollars it saves on the recommended plan."""
    from mlflow_gpuopt.planning.advising import AdviseRequest, advise as run_advise

    reject_empty_values(click.get_current_context())
    deadline_h = parse_deadline(deadline)
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=False)
    if deadline_h is not None and training_target is None:
        raise UsageError("--deadline needs a target: --samples N, --epochs E --dataset-size "
                         "N, --tokens T or --steps S")
    catalog = load_catalog_or_fail() if training_target is not None else None
    result = run_advise(AdviseRequest(run_id=run_id, target=training_target,
                                      deadline_hours=deadline_h, confidence=confidence,
                                      log=not no_log), catalog)
    doc = result.doc
    if as_json:
        click.echo(_json.dumps(doc, indent=2), file=sys.stdout)
    else:
        _print(doc, sys.stdout)
    if result.log_error is not None:
        raise LoggingFailed(f"could not log gpuopt/advice.json to run {run_id} "
                            f"(the advice is printed above): {result.log_error}")
