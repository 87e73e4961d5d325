"""``mlflow gpuopt recommend``: the cheapest offer × GPUs × parallelism for a deadline.

Everything the user typed is checked before anything is read or written: bad input is one
line on stderr and exit code 2, and nothing is logged to MLflow. When logging the computed
recommendation fails (a full disk, a store that refuses writes), it is printed all the same,
followed by one line saying why it was not logged, and the exit code is 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import click

from mlflow_gpuopt.catalog.schema import PROVIDERS
from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli import emit as launch_emit
from mlflow_gpuopt.cli._errors import LoggingFailed, UsageError, one_line_reason
from mlflow_gpuopt.perfmodel.activations import RECOMPUTE_MODES
from mlflow_gpuopt.cli.options import (
    check_run_source,
    load_catalog_or_fail,
    parse_target,
    reject_empty_values,
    target_options,
)
from mlflow_gpuopt.validation import BOUNDS

def _global_batch(workload, observations) -> int:
    """Samples per optimizer step of the measured run (the first run, whose profile is the
    workload): its micro-batch × accumulation × data-parallel ranks (its GPUs)."""
    first = observations[0] if observations else None
    mb = (first and first.micro_batch) or workload.micro_batch or 1
    accum = (first and first.grad_accum) or workload.grad_accum or 1
    ranks = first.gpu_count if first else 1
    return max(1, mb * accum * max(1, ranks))


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
@click.option("--workload", "workload_path", type=click.Path(dir_okay=False),
              help="Plan before a run exists: workload.json or a Hugging Face config.json "
                   "(as predict takes); not logged.")
@click.option("--seq-len", "seq_len", type=click.IntRange(min=1), metavar="N", default=None,
              help="With a Hugging Face config.json: the training sequence length (tokens).")
@click.option("--observations", "observations_path", type=click.Path(dir_okay=False),
              help="With --workload: measured throughputs CSV (as predict takes).")
@click.option("--proxy-workload", "proxy_path", type=click.Path(dir_okay=False),
              help="workload.json of the smaller model --observations measured (a proxy); "
                   "--workload is the model to plan.")
@target_options
@click.option("--deadline", metavar="DURATION", help="Wall-clock deadline: 24h, 90m, 2d, 1d12h.")
@click.option("--provider", "providers", multiple=True,
              type=click.Choice(PROVIDERS, case_sensitive=False),
              help="Only these providers (repeat for several).")
@click.option("--region", metavar="R", help="Only offers in this region.")
@click.option("--spot/--no-spot", default=None,
              help="Spot only / on-demand only (default: consider both).")
@click.option("--max-gpus", type=click.IntRange(min=1, max=int(BOUNDS["gpu_count"].high)),
              help="At most this many GPUs in total.")
@click.option("--max-nodes", type=click.IntRange(min=1, max=int(BOUNDS["nodes"].high)),
              default=None,
              help="At most this many nodes (default: what the catalog's largest clusters "
                   "allow, 64).")
@click.option("--confidence", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              default=0.9, show_default=True,
              help="A plan meets the deadline when P(time <= deadline) is at least this.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many ranked plans to show / return.")
@click.option("--global-batch", "global_batch", type=click.IntRange(min=1), metavar="N",
              help="Samples per optimizer step every plan keeps (default: the measured "
                   "run's micro-batch × accumulation × GPUs; for a language model's "
                   "workload file, LLM pre-training practice: docs/metrics.md).")
@click.option("--keep-micro-batch", is_flag=True,
              help="Keep the measured per-GPU batch on every GPU instead, so the global "
                   "batch grows with the GPU count.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--no-log", is_flag=True, help="Do not log the recommendation to MLflow.")
@click.option("--recompute", type=click.Choice(list(RECOMPUTE_MODES)), default=None,
              help="Activation recomputation the plans run with (default: the run's own, else "
                   "none); plans that fit only with full recomputation still get it.")
@click.option("--activation-checkpointing", is_flag=True,
              help="Same as --recompute full.")
@click.option("--memory-headroom", type=click.FloatRange(0.0, 0.9), default=0.10,
              show_default=True, metavar="SHARE",
              help="Share of each GPU's usable memory a plan must leave free at its predicted "
                   "peak (0 keeps every plan likely to fit).")
@launch_emit.emit_options
def recommend(run_ids, experiment, workload_path, observations_path, proxy_path, samples, epochs,
              dataset_size, tokens, steps, deadline, providers, region, spot, max_gpus,
              max_nodes, confidence, top, global_batch, keep_micro_batch, as_json, no_log,
              recompute, activation_checkpointing, memory_headroom, emit, plan_rank, out_path,
              force, script, seq_len):
    """Rank instance × GPU count × parallelism by expected cost for a target time-to-train.

    From measured runs (--run-id, --experiment), or before any run exists from a workload
    file (--workload, optionally --observations); the latter is not logged to MLflow (there
    is no run to nest it under)."""
    from mlflow_gpuopt.quantities import QuantityError, parse_duration_hours

    # 1. Everything that can be checked without reading anything.
    reject_empty_values(click.get_current_context())
    if not 0.0 < confidence < 1.0:  # click's range lets NaN through (NaN compares false)
        raise UsageError(f"--confidence must be a probability between 0 and 1 (exclusive), "
                         f"got {confidence}")
    if activation_checkpointing and recompute not in (None, "full"):
        raise UsageError("--activation-checkpointing means --recompute full; give one of them")
    recompute = recompute or ("full" if activation_checkpointing else None)
    if observations_path and not workload_path:
        raise UsageError("--observations needs --workload W.json")
    if not (run_ids or experiment or workload_path):
        raise UsageError("give --run-id ID or --experiment NAME (or --workload W.json before "
                         "any run exists)")
    if proxy_path and (run_ids or experiment or not observations_path):
        raise UsageError("--proxy-workload goes with --observations O.csv (the proxy's "
                         "measurements) and --workload, not with --run-id / --experiment")
    if (run_ids or experiment) and observations_path:
        raise UsageError("give --run-id / --experiment or --observations, not both (with "
                         "runs, --workload is the model to plan from those proxy runs)")
    if run_ids or experiment or not workload_path:
        check_run_source(run_ids, experiment)
        if seq_len is not None and not workload_path:
            raise UsageError("--seq-len goes with --workload CONFIG.json (a Hugging Face "
                             "config), not measured runs")
    if global_batch is not None and keep_micro_batch:
        raise UsageError("give --global-batch N or --keep-micro-batch, not both")
    try:
        deadline_h = parse_duration_hours(deadline, what="--deadline") if deadline else None
    except QuantityError as exc:
        raise UsageError(str(exc)) from None
    if deadline_h is not None and not BOUNDS["deadline_hours"].contains(deadline_h):
        bound = BOUNDS["deadline_hours"]
        raise UsageError(f"--deadline {deadline} is {deadline_h:.3g} hours; a deadline is "
                         f"{bound.text()} hours ({bound.why})")
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=True)
    emit_req = launch_emit.check_request(emit, plan_rank, out_path, force, script, top)

    from mlflow_gpuopt.recommend import NoOffersError, SearchSpace, filter_offers

    catalog = load_catalog_or_fail()
    if max_nodes is None:
        max_nodes = max((o.max_nodes for o in catalog.offers), default=1)
    space = SearchSpace(providers=tuple(p.lower() for p in providers) or None, region=region,
                        spot=spot, max_gpus=max_gpus, max_nodes=max_nodes,
                        memory_headroom=memory_headroom)
    try:
        filter_offers(catalog.offers, space, catalog.gpus)
    except NoOffersError as exc:
        raise UsageError(str(exc)) from None

    # 2. Read the runs (read-only).
    proxy = None
    if run_ids or experiment:
        workload, observations, run_ids, input_notes = _load_inputs(run_ids, experiment)
        if workload_path:  # the runs are a proxy of the model to plan
            proxy = workload
            workload, _, _, file_notes = _load_files(workload_path, None, catalog, seq_len)
            input_notes = [*input_notes, *file_notes]
    else:
        workload, observations, run_ids, input_notes = _load_files(
            workload_path, observations_path, catalog, seq_len)
        if proxy_path:
            proxy = _load_files(proxy_path, None, catalog)[0]
    if recompute:
        # The runs ran as they were measured; only the plans change mode.
        measured = proxy or workload
        observations = [dataclasses.replace(o, recompute=o.recompute or measured.recompute
                                            or "none") for o in observations]
        workload = dataclasses.replace(workload, recompute=recompute)
    logged_row = launch_emit.check_logged_plan(emit_req, workload)
    measured_batch = _global_batch(proxy or workload, observations)
    from mlflow_gpuopt.recommend.llm_batch import pretraining_global_batch

    # A workload file states no global batch: a language model's pre-training gets one (a
    # proxy's measured batch is the proxy's, not the bigger model's).
    derived = (pretraining_global_batch(workload)
               if workload_path and (not observations or proxy is not None)
               and global_batch is None and not keep_micro_batch else None)
    plan_batch = global_batch or (derived.samples if derived else measured_batch)
    total = training_target.total_samples(
        tokens_per_sample=workload.tokens_per_sample, samples_per_step=plan_batch)

    # 3. Fit and search (pure).
    from mlflow_gpuopt.recommend import Target, recommend as run_search, recommendation_dict

    predictor = _fit(workload, observations, catalog, proxy,
                     ", ".join(run_ids) or str(proxy_path))
    target = Target(total_samples=total, deadline_hours=deadline_h, confidence=confidence,
                    per_rank_batch=(workload.micro_batch or 1) * (workload.grad_accum or 1),
                    description=training_target.description,
                    global_batch=None if keep_micro_batch else plan_batch,
                    global_batch_asked=global_batch is not None,
                    global_batch_why=derived.why if derived else "")
    rec = run_search(predictor, workload, catalog.offers, catalog.gpus, target,
                     hardware_for=_hardware_for, space=space)
    doc = recommendation_dict(rec, top=top)
    if rec.winner is None and rec.candidates and deadline_h is not None:
        from mlflow_gpuopt.recommend.llm_batch import larger_global_batch
        from mlflow_gpuopt.recommend.shortfall import alternatives

        alts = alternatives(
            lambda t, s: run_search(predictor, workload, catalog.offers, catalog.gpus, t,
                                    hardware_for=_hardware_for, space=s, with_scaling=False),
            target, space, max_nodes=max((o.max_nodes for o in catalog.offers), default=1),
            larger_batch=larger_global_batch(workload, target.global_batch),
            batch_may_change=training_target.steps is None)
        doc["deadline_alternatives"] = [a.as_dict() for a in alts]
        doc["notes"] = [*doc["notes"], *(a.line() for a in alts)]
    doc["source_run_ids"] = list(run_ids)
    if workload_path and not run_ids and not no_log:
        doc.setdefault("notes", []).append(
            "not logged to MLflow: planned from --workload, there is no run to nest it under")
    doc["model_assumptions"] = list(getattr(predictor, "assumptions", ()) or ())
    doc["notes"] = [*input_notes, *doc["notes"]]
    if proxy is not None:  # say where the speed came from, in the printed notes too
        doc["notes"][:0] = [a for a in doc["model_assumptions"]
                            if a.startswith("transferred from proxy")]
    if run_ids and rec.candidates and proxy is None:
        doc["advice"] = _advice(run_ids[0], rec, predictor, catalog)
    launch_emit.check_plan(emit_req, doc, logged_row)
    found_rank = launch_emit.find_logged_plan(emit_req, rec, logged_row)

    # 4. Log (unless --no-log), then print. The recommendation is printed even when logging
    # fails: it cost the user a search, and the printout is all they need to act on it.
    logged = log_error = None
    if not no_log and rec.candidates and run_ids:
        try:
            logged = _log(doc, rec, observations if proxy is None else [], run_ids,
                          workload)
        except Exception as exc:  # a full disk, a read-only store, a refused write
            log_error = one_line_reason(exc)
        else:
            doc["mlflow_run_id"] = logged.run_id
    launch_emit.emit(emit_req, rec, doc, logged, run_ids, found_rank)
    out = sys.stdout
    if as_json:
        click.echo(_json.dumps(doc, indent=2), file=out)
    else:
        _print_human(doc, out, logged)
    if log_error is not None:
        raise LoggingFailed(f"could not log the recommendation to MLflow (it is printed "
                            f"above): {log_error}")


def _advice(run_id, rec, predictor, catalog):
    """The measured run's advice findings priced on this recommendation's plan (the
    report's advice section), or ``None`` when the run's measurements cannot be read."""
    from mlflow_gpuopt.advice import advice_doc
    from mlflow_gpuopt.cli.advise import price_on_plan
    from mlflow_gpuopt.mlflow_io.advice import RunInputError, load_run_facts

    try:
        priced = price_on_plan(load_run_facts(run_id), rec, predictor, catalog)
    except (RunInputError, ValueError, ArithmeticError):
        return None
    if priced is None:
        return None
    items, plan = priced
    return advice_doc(run_id, items, plan)


def _hardware_for(spec, offer):
    from mlflow_gpuopt.hardware import hardware_for_gpu

    return hardware_for_gpu(spec, gpus_per_node=offer.gpu_count, offer=offer)


def _load_files(workload_path, observations_path, catalog, seq_len=None):
    """(workload, observations, no run ids, notes) from files, as ``predict`` reads them."""
    from mlflow_gpuopt.workload_files import (
        WorkloadFileError,
        load_observations,
        read_workload,
    )

    try:
        read = read_workload(workload_path, seq_len=seq_len)
        observations = (load_observations(observations_path, resolve_gpu=catalog.resolve_gpu)
                        if observations_path else [])
    except WorkloadFileError as exc:
        raise UsageError(str(exc)) from None
    return read.workload, list(observations), [], list(read.notes)


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
    return (inputs.workload, list(inputs.observations), list(inputs.run_ids),
            list(inputs.notes))


def _fit(workload, observations, catalog, proxy=None, source=""):
    """The fitted predictor; with a ``proxy`` workload (the one ``observations`` measured),
    fitted to it and carried to ``workload`` (:func:`mlflow_gpuopt.perfmodel.transfer`)."""
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.hardware import measured_hardware
    from mlflow_gpuopt.perfmodel import PerfModelError, fit
    from mlflow_gpuopt.perfmodel.transfer import fit_proxy

    try:
        hardware = measured_hardware(observations, catalog)
        if proxy is not None:
            return fit_proxy(proxy, observations, hardware, workload, source=source)
        return fit(workload, observations, hardware)
    except (PerfModelError, UnknownGpuError) as exc:
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
        # the search's note already starts with "no plan fits: "; say it once
        click.echo("No plan fits: " + "; ".join(
            n.removeprefix("no plan fits: ") for n in doc["notes"]), file=out)
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
    for assumed in doc.get("model_assumptions") or ():
        click.echo(f"Assumed: {assumed}", file=out)
    if logged is not None:
        click.echo(f"Logged to MLflow run {logged.run_id} (experiment {logged.experiment_id}) "
                   f"with {len(logged.child_run_ids)} candidate runs; open it with "
                   "`mlflow ui` → the source run → its nested recommendation run → "
                   "Artifacts → gpuopt/report.html", file=out)
    launch_emit.print_lines(doc, out)
