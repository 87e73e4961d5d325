"""``mlflow gpuopt recommend``: the cheapest offer × GPUs × parallelism for a deadline.

Everything the user typed is checked before anything is read or written: bad input is one
line on stderr and exit code 2, and nothing is logged to MLflow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys

import click

from mlflow_gpuopt.cli import emit as launch_emit
from mlflow_gpuopt.cli._errors import UsageError

logger = logging.getLogger(__name__)

PROVIDER_CHOICES = ("aws", "gcp", "lambda", "colab", "azure")


def _target_samples(workload, samples_per_step, *, samples, epochs, dataset_size, tokens,
                    steps):
    """(total samples, description) from whichever target form was given.

    The flags are checked here, each with its own message; the arithmetic is
    :func:`mlflow_gpuopt.perfmodel.samples_for_target`. ``samples_per_step`` is the measured
    global batch (samples per optimizer step, for ``--steps``). With ``workload`` None (before
    any run is read) only the flags are checked and the total is None.
    """
    from mlflow_gpuopt.perfmodel import PerfModelError, samples_for_target
    from mlflow_gpuopt.quantities import format_count, parse_count

    forms = [name for name, v in (("--samples", samples), ("--epochs", epochs),
                                  ("--tokens", tokens), ("--steps", steps)) if v is not None]
    if dataset_size is not None and epochs is None:
        raise UsageError("--dataset-size goes with --epochs (e.g. --epochs 90 "
                         "--dataset-size 1281167)")
    if len(forms) != 1:
        raise UsageError("give exactly one target: --samples N, --epochs E --dataset-size N, "
                         f"--tokens T or --steps S (got {', '.join(forms) or 'none'})")
    if samples is not None:
        n = parse_count(samples, what="--samples")
        target, description = {"samples": n}, f"{format_count(n)} samples"
    elif epochs is not None:
        if dataset_size is None:
            raise UsageError("--epochs needs --dataset-size N (samples per epoch)")
        e = parse_count(epochs, what="--epochs")
        d = parse_count(dataset_size, what="--dataset-size")
        target = {"epochs": e, "dataset_size": d}
        description = f"{e:g} epochs × {format_count(d)} samples"
    elif tokens is not None:
        t = parse_count(tokens, what="--tokens")
        if workload is not None and not workload.tokens_per_sample:
            raise UsageError("--tokens needs a run whose profile has tokens_per_sample "
                             "(sequence length); use --samples or --steps instead")
        target = {"tokens": t,
                  "tokens_per_sample": workload.tokens_per_sample if workload else None}
        description = f"{format_count(t)} tokens"
    else:
        s = parse_count(steps, what="--steps")
        target = {"steps": s, "samples_per_step": samples_per_step}
        description = f"{format_count(s)} optimizer steps"
    if workload is None:
        return None, description
    try:
        return samples_for_target(**target), description
    except PerfModelError as exc:
        raise UsageError(str(exc)) from None


def _global_batch(workload, observations) -> int:
    mb = workload.micro_batch or 1
    accum = workload.grad_accum or 1
    ranks = max((o.gpu_count for o in observations), default=1)
    return max(1, mb * accum * ranks)


def _print_table(doc, out) -> None:
    from mlflow_gpuopt.recommend.explain import hours_figure as hours
    from mlflow_gpuopt.recommend.explain import money

    head = ("#", "provider", "instance × nodes", "GPUs", "strategy", "mb × accum", "prec",
            "pricing", "hours (low–high)", "cost (low–high)", "P(deadline)")
    rows = []
    for c in doc["candidates"]:
        rows.append((
            str(c["rank"]), c["provider"], f'{c["instance_type"]} × {c["nodes"]}',
            f'{c["gpus"]} {c["gpu"]}', c["strategy_label"],
            f'{c["micro_batch"]} × {c["grad_accum"]}', c["precision"],
            c["pricing"].replace("_", "-"),
            f'{hours(c["predicted_hours"])} ({hours(c["predicted_hours_low"])}–'
            f'{hours(c["predicted_hours_high"])})',
            f'{money(c["predicted_cost_usd"])} ({money(c["cost_low_usd"])}–'
            f'{money(c["cost_high_usd"])})',
            f'{c["p_meets_deadline"]:.0%}' + ("" if c["meets_deadline"] else " ✗"),
        ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    right = {0, 3, 8, 9, 10}

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    click.echo(fmt(head), file=out)
    click.echo("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        click.echo(fmt(r), file=out)


@click.command(name="recommend")
@click.option("--run-id", "run_ids", multiple=True, metavar="ID",
              help="Measured run(s) to fit (repeat for several).")
@click.option("--experiment", metavar="NAME",
              help="Fit all measured runs of the newest run's workload in this experiment.")
@click.option("--samples", metavar="N", help="Total samples to train on (2e9, 2B, 1.5M).")
@click.option("--epochs", metavar="E", help="Epochs (with --dataset-size).")
@click.option("--dataset-size", metavar="N", help="Samples per epoch (with --epochs).")
@click.option("--tokens", metavar="T", help="Total tokens (needs the run's sequence length).")
@click.option("--steps", metavar="S",
              help="Optimizer steps at the measured run's global batch.")
@click.option("--deadline", metavar="DURATION", help="Wall-clock deadline: 24h, 90m, 2d, 1d12h.")
@click.option("--provider", "providers", multiple=True,
              type=click.Choice(PROVIDER_CHOICES, case_sensitive=False),
              help="Only these providers (repeat for several).")
@click.option("--region", metavar="R", help="Only offers in this region.")
@click.option("--spot/--no-spot", default=None,
              help="Spot only / on-demand only (default: consider both).")
@click.option("--max-gpus", type=click.IntRange(min=1), help="At most this many GPUs in total.")
@click.option("--max-nodes", type=click.IntRange(min=1), default=16, show_default=True,
              help="At most this many nodes.")
@click.option("--confidence", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=0.9, show_default=True,
              help="A plan meets the deadline when P(time <= deadline) is at least this.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many ranked plans to show / return.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--no-log", is_flag=True, help="Do not log the recommendation to MLflow.")
@launch_emit.emit_options
def recommend(run_ids, experiment, samples, epochs, dataset_size, tokens, steps, deadline,
              providers, region, spot, max_gpus, max_nodes, confidence, top, as_json, no_log,
              emit, plan_rank, out_path, force, script):
    """Rank instance × GPU count × parallelism by expected cost for a target time-to-train."""
    from mlflow_gpuopt.quantities import QuantityError, parse_duration_hours

    # 1. Everything that can be checked without reading anything.
    if bool(run_ids) == bool(experiment):
        raise UsageError("give --run-id ID (one or more) or --experiment NAME, not both"
                         if run_ids else "give --run-id ID or --experiment NAME")
    try:
        deadline_h = parse_duration_hours(deadline, what="--deadline") if deadline else None
        _target_samples(None, None, samples=samples, epochs=epochs,
                        dataset_size=dataset_size, tokens=tokens, steps=steps)
    except QuantityError as exc:
        raise UsageError(str(exc)) from None
    emit_req = launch_emit.check_request(emit, plan_rank, out_path, force, script, top)

    from mlflow_gpuopt.catalog import CatalogError, load_catalog
    from mlflow_gpuopt.recommend import NoOffersError, SearchSpace, filter_offers

    try:
        catalog = load_catalog()
    except CatalogError as exc:
        raise UsageError(f"cannot load the price catalog: {exc}") from None
    space = SearchSpace(providers=tuple(p.lower() for p in providers) or None, region=region,
                        spot=spot, max_gpus=max_gpus, max_nodes=max_nodes)
    try:
        filter_offers(catalog.offers, space)
    except NoOffersError as exc:
        raise UsageError(str(exc)) from None

    # 2. Read the runs (read-only).
    workload, observations, run_ids = _load_inputs(run_ids, experiment)
    try:
        total, description = _target_samples(
            workload, _global_batch(workload, observations), samples=samples, epochs=epochs,
            dataset_size=dataset_size, tokens=tokens, steps=steps)
    except QuantityError as exc:
        raise UsageError(str(exc)) from None

    # 3. Fit and search (pure).
    from mlflow_gpuopt.recommend import Target, recommend as run_search, recommendation_dict

    predictor = _fit(workload, observations, catalog)
    target = Target(total_samples=total, deadline_hours=deadline_h, confidence=confidence,
                    per_rank_batch=(workload.micro_batch or 1) * (workload.grad_accum or 1),
                    description=description)
    rec = run_search(predictor, workload, catalog.offers, catalog.gpus, target,
                     hardware_for=_hardware_for, space=space)
    doc = recommendation_dict(rec, top=top)
    doc["source_run_ids"] = list(run_ids)
    doc["model_assumptions"] = list(getattr(predictor, "assumptions", ()) or ())
    launch_emit.check_plan(emit_req, doc)

    # 4. Log (unless --no-log), then print.
    logged = None
    if not no_log and rec.candidates:
        logged = _log(doc, rec, observations, run_ids, workload)
        doc["mlflow_run_id"] = logged.run_id
    launch_emit.emit(emit_req, rec, doc, logged, run_ids)
    out = sys.stdout
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=_json_default), file=out)
        return
    _print_human(doc, out, logged)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _hardware_for(spec, offer):
    from mlflow_gpuopt.hardware import hardware_for_gpu

    return hardware_for_gpu(spec, gpus_per_node=offer.gpu_count, offer=offer)


def _load_inputs(run_ids, experiment):
    from mlflow_gpuopt.mlflow_io.measured import (
        MeasuredRunError,
        measured_runs_in_experiment,
        same_workload_run_ids,
    )

    if experiment:
        try:
            run_ids = same_workload_run_ids(measured_runs_in_experiment(experiment))
        except MeasuredRunError as exc:
            raise UsageError(str(exc)) from None
    from mlflow_gpuopt.mlflow_io.runs import RunInputError, load_run_inputs

    try:
        inputs = load_run_inputs(list(run_ids))
    except RunInputError as exc:
        raise UsageError(str(exc)) from None
    return inputs.workload, list(inputs.observations), list(inputs.run_ids)


def _fit(workload, observations, catalog):
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import PerfModelError, fit
    from mlflow_gpuopt.perfmodel.fitting import is_cpu

    hardware = {}
    for o in observations:
        if is_cpu(o.gpu) or o.gpu in hardware:
            continue
        try:
            spec = catalog.gpu(o.gpu)
        except UnknownGpuError:
            logger.warning("measured GPU %s is not in the catalog; its run is used as CPU-less "
                           "prior only", o.gpu)
            continue
        hardware[o.gpu] = hardware_for_gpu(spec, gpus_per_node=max(1, o.gpu_count // o.nodes))
    try:
        return fit(workload, observations, hardware)
    except PerfModelError as exc:
        raise UsageError(f"cannot fit the scaling model to these runs: {exc}") from None


def _log(doc, rec, observations, run_ids, workload):
    from mlflow_gpuopt.mlflow_io.recommendation import log_recommendation
    from mlflow_gpuopt.report import pareto_png, render_html, scaling_png

    charts = {"pareto": pareto_png(rec),
              "scaling": scaling_png(rec.scaling, [o for o in observations
                                                   if o.gpu in {p.gpu for p in rec.scaling}])}
    html = render_html(doc, charts, title=f"GPU recommendation for {workload.name}",
                       source="Measured runs: " + ", ".join(run_ids))
    # MLflow prints "View run … at: <url>" on stdout for HTTP stores; stdout is ours (--json).
    with contextlib.redirect_stdout(sys.stderr):
        return log_recommendation(doc, source_run_ids=run_ids, charts=charts,
                                  report_html=html)


def _print_human(doc, out, logged) -> None:
    from mlflow_gpuopt.recommend.explain import hours_text, money

    t = doc["target"]
    deadline = (f"deadline {hours_text(t['deadline_hours'])}" if t["deadline_hours"]
                else "no deadline")
    click.echo(f"Target: {t['description']} ({t['total_samples']:,.0f} samples), {deadline}, "
               f"confidence {t['confidence']:.0%}", file=out)
    if not doc["candidates"]:
        click.echo("No plan fits: " + "; ".join(doc["notes"]), file=out)
        return
    _print_table(doc, out)
    click.echo("", file=out)
    if doc["winner"]:
        for line in doc["explanation"]:
            click.echo(line, file=out)
    else:
        for label in ("fastest", "cheapest"):
            c = doc[label]
            click.echo(f"{label.title()}: {c['provider']} {c['instance_type']} × {c['nodes']}, "
                       f"{hours_text(c['predicted_hours'])}, {money(c['predicted_cost_usd'])}; "
                       f"launch: {c['launch']}", file=out)
    for note in doc["notes"]:
        click.echo(f"Note: {note}", file=out)
    if logged is not None:
        click.echo(f"Logged to MLflow run {logged.run_id} (experiment {logged.experiment_id}) "
                   f"with {len(logged.child_run_ids)} candidate runs; open it with "
                   "`mlflow ui` → the source run → its nested recommendation run → "
                   "Artifacts → gpuopt/report.html", file=out)
    launch_emit.print_lines(doc, out)
