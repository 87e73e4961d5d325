"""``mlflow gpuopt accuracy --experiment NAME [--json]``: the prediction ledger.

Every run of the experiment launched as a plan (tag ``gpuopt.plan``) is paired with that
plan's predictions (its recommendation run's ``gpuopt/recommendation.json``): predicted vs
measured throughput, hours and cost, the error, whether the 90 % interval covered it, and the
totals (:mod:`mlflow_gpuopt.launch.ledger`). Then the same after refitting the model with the
measured runs included, leave-one-out: the refit that scores a run never saw that run
(:mod:`mlflow_gpuopt.planning.ledger`).
Bad input (no such experiment, no pairs) is one line and exit code 2.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli.options import load_catalog_or_fail, reject_empty_values


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
    from mlflow_gpuopt.planning.ledger import build_ledger

    reject_empty_values(click.get_current_context())
    doc = build_ledger(experiment, load_catalog_or_fail())
    if as_json:
        click.echo(_json.dumps(doc, indent=2), file=sys.stdout)
    else:
        _print(doc, sys.stdout)
