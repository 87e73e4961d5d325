"""``mlflow gpuopt recommend``: the cheapest offer × GPUs × parallelism for a deadline.

Everything the user typed is checked before anything is read or written: bad input is one
line on stderr and exit code 2, and nothing is logged to MLflow. When logging the computed
recommendation fails (a full disk, a store that refuses writes), it is printed all the same,
followed by one line saying why it was not logged, and the exit code is 1. The work itself is
:func:`mlflow_gpuopt.planning.recommending.plan`.
"""

from __future__ import annotations

import sys

import click

from mlflow_gpuopt.catalog.schema import PROVIDERS
from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli.emit import emit_options
from mlflow_gpuopt.cli._errors import LoggingFailed, UsageError
from mlflow_gpuopt.cli.options import (
    check_file_inputs,
    check_run_source,
    confidence_option,
    load_catalog_or_fail,
    parse_deadline,
    parse_target,
    reject_empty_values,
    run_options,
    target_options,
    workload_file_options,
)
from mlflow_gpuopt.perfmodel.activations import RECOMPUTE_MODES
from mlflow_gpuopt.validation import BOUNDS


@click.command(name="recommend")
@click.option("--run-id", "run_ids", multiple=True, metavar="ID",
              help="Measured run(s) to fit (repeat for several).")
@click.option("--experiment", metavar="NAME",
              help="Fit all measured runs of the newest run's workload in this experiment.")
@workload_file_options
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
@confidence_option
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
@run_options
@click.option("--recompute", type=click.Choice(list(RECOMPUTE_MODES)), default=None,
              help="Activation recomputation the plans run with (default: the run's own, else "
                   "none); plans that fit only with full recomputation still get it.")
@click.option("--activation-checkpointing", is_flag=True,
              help="Same as --recompute full.")
@click.option("--memory-headroom", type=click.FloatRange(0.0, 0.9), default=0.10,
              show_default=True, metavar="SHARE",
              help="Share of each GPU's usable memory a plan must leave free at its predicted "
                   "peak (0 keeps every plan likely to fit).")
@emit_options
def recommend(run_ids, experiment, workload_path, observations_path, proxy_path, samples, epochs,
              dataset_size, tokens, steps, deadline, providers, region, spot, max_gpus,
              max_nodes, confidence, top, global_batch, keep_micro_batch, as_json, no_log,
              recompute, activation_checkpointing, memory_headroom, emit, plan_rank, out_path,
              force, script, seq_len, run_flags):
    """Rank instance × GPU count × parallelism by expected cost for a target time-to-train.

    From measured runs (--run-id, --experiment), or before any run exists from a workload
    file (--workload, optionally --observations); the latter is not logged to MLflow (there
    is no run to nest it under)."""
    from mlflow_gpuopt.planning.emitting import check_request
    from mlflow_gpuopt.planning.recommending import RecommendRequest, plan

    # Everything that can be checked without reading anything.
    reject_empty_values(click.get_current_context())
    if activation_checkpointing and recompute not in (None, "full"):
        raise UsageError("--activation-checkpointing means --recompute full; give one of them")
    check_file_inputs(bool(run_ids or experiment), workload_path, observations_path, proxy_path,
                      seq_len, runs_hint="--run-id ID or --experiment NAME")
    if run_ids or experiment:
        check_run_source(run_ids, experiment)
    if global_batch is not None and keep_micro_batch:
        raise UsageError("give --global-batch N or --keep-micro-batch, not both")
    request = RecommendRequest(
        target=parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                            tokens=tokens, steps=steps, required=True),
        run_ids=tuple(run_ids), experiment=experiment, workload_path=workload_path,
        observations_path=observations_path, proxy_path=proxy_path, seq_len=seq_len,
        deadline_hours=parse_deadline(deadline),
        confidence=confidence, providers=tuple(providers), region=region, spot=spot,
        max_gpus=max_gpus, max_nodes=max_nodes, top=top, global_batch=global_batch,
        keep_micro_batch=keep_micro_batch,
        recompute=recompute or ("full" if activation_checkpointing else None),
        run=run_flags, memory_headroom=memory_headroom,
        log=not no_log,
        emit=check_request(emit, plan_rank, out_path, force, script, top))

    result = plan(request, load_catalog_or_fail())
    if as_json:
        click.echo(_json.dumps(result.doc, indent=2), file=sys.stdout)
    else:
        from mlflow_gpuopt.report.text import recommendation_lines

        for line in recommendation_lines(result.doc, result.logged):
            click.echo(line, file=sys.stdout)
    if result.log_error is not None:
        raise LoggingFailed(f"could not log the recommendation to MLflow (it is printed "
                            f"above): {result.log_error}")
