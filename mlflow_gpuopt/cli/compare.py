"""``mlflow gpuopt compare``: measured runs side by side, with what their hardware costs.

For each run: hardware, throughput (and, for runs launched as a plan, the plan's predicted
throughput), MFU, and the cost per million samples (and per epoch with
``--dataset-size``) at the cheapest catalog on-demand price for that GPU, counted per GPU the
run used. CPU runs have no catalog price and say so. Every tracked run is listed, profiled or
not: a figure the run lacks (FLOPs per sample, MFU, throughput) is a blank (``—``; ``null``
in JSON), never a reason to leave the run out.
"""

from __future__ import annotations

import sys

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli.options import (
    check_run_source,
    load_catalog_or_fail,
    reject_empty_values,
)


def _price_per_gpu_hour(device: str, catalog) -> tuple[float | None, str]:
    """(cheapest on-demand $ per GPU-hour, where) for an NVML device name."""
    from mlflow_gpuopt.catalog import UnknownGpuError
    from mlflow_gpuopt.perfmodel.fitting import is_cpu

    if is_cpu(device):
        return None, "CPU run: no catalog price"
    try:
        offers = catalog.query(gpu=device)  # cheapest $/GPU-h first
    except UnknownGpuError:
        return None, f"{device} is not in the catalog"
    best = next((o for o in offers if o.pricing == "on_demand"), offers[0] if offers else None)
    if best is None:
        return None, f"no catalog offer with {catalog.resolve_gpu(device)}"
    return best.price_per_gpu_hour_usd, f"{best.provider} {best.instance_type}"


def compare_rows(runs, catalog, dataset_size: float | None) -> list[dict]:
    """One JSON-ready row per measured run (pure over its inputs)."""
    from mlflow_gpuopt.perfmodel.fitting import is_cpu

    rows = []
    for r in runs:
        per_gpu, where = _price_per_gpu_hour(r.device, catalog)
        gpus = max(1, r.world_size, r.device_count * r.nodes if not is_cpu(r.device) else 1)
        thr = r.throughput_samples_per_s
        per_m = per_epoch = None
        if per_gpu is not None and thr:
            per_hour = per_gpu * gpus
            per_m = per_hour / (thr * 3600) * 1e6
            if dataset_size:
                per_epoch = per_hour * dataset_size / thr / 3600
        rows.append({
            "run_id": r.run_id, "run_name": r.run_name, "device": r.device,
            "gpus": gpus, "nodes": r.nodes, "strategy": r.strategy, "precision": r.precision,
            "micro_batch": r.micro_batch, "flops_per_sample": r.flops_per_sample,
            "throughput_samples_per_s": thr, "mfu": r.mfu,
            "step_time_p50_s": r.step_time_p50_s, "peak_memory_bytes": r.peak_memory_bytes,
            "price_per_gpu_hour_usd": per_gpu, "priced_as": where,
            "usd_per_million_samples": per_m, "usd_per_epoch": per_epoch,
            "plan_id": r.plan_id,
            "predicted_throughput_samples_per_s": r.predicted_throughput_samples_per_s,
        })
    return rows


def _fmt(v, spec: str, none: str = "—") -> str:
    return none if v is None else format(v, spec)


@click.command(name="compare")
@click.option("--experiment", metavar="NAME", help="All measured runs of this experiment.")
@click.option("--run-id", "run_ids", multiple=True, metavar="ID", help="Runs to compare.")
@click.option("--dataset-size", metavar="N", help="Samples per epoch, for cost per epoch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def compare(experiment, run_ids, dataset_size, as_json):
    """Measured runs side by side: hardware, throughput, MFU, cost per M samples / epoch."""
    from mlflow_gpuopt.quantities import parse_count

    reject_empty_values(click.get_current_context())
    check_run_source(run_ids, experiment)
    size = parse_count(dataset_size, what="--dataset-size") if dataset_size else None
    from mlflow_gpuopt.mlflow_io.measured import measured_runs, measured_runs_in_experiment

    runs = (measured_runs_in_experiment(experiment, require_profile=False) if experiment
            else measured_runs(run_ids, require_profile=False))
    catalog = load_catalog_or_fail()
    rows = compare_rows(runs, catalog, size)
    if as_json:
        click.echo(_json.dumps(rows, indent=2))
        return
    # runs launched as a plan: their plan's prediction next to what they measured
    planned = any(r["predicted_throughput_samples_per_s"] is not None for r in rows)
    head = ("run", "device", "GPUs", "strategy", "prec", "GFLOP/sample", "samples/s", "MFU",
            "step p50",
            "$/M samples", "$/epoch" if size else "", "priced as")
    if planned:
        head = (*head[:7], "predicted/s", *head[7:])
    table = [head]
    for r in rows:
        predicted = ((_fmt(r["predicted_throughput_samples_per_s"], ",.1f"),) if planned
                     else ())
        table.append((
            r["run_name"] or r["run_id"][:8], r["device"], str(r["gpus"]), r["strategy"] or "—",
            r["precision"] or "—",
            _fmt(r["flops_per_sample"] and r["flops_per_sample"] / 1e9, ",.3g"),
            _fmt(r["throughput_samples_per_s"], ",.1f"), *predicted,
            _fmt(r["mfu"], ".1%"), _fmt(r["step_time_p50_s"] and r["step_time_p50_s"] * 1e3,
                                        ".1f") + (" ms" if r["step_time_p50_s"] else ""),
            _fmt(r["usd_per_million_samples"], ",.3g"),
            _fmt(r["usd_per_epoch"], ",.2f") if size else "", r["priced_as"]))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
                   file=sys.stdout)
        if i == 0:
            click.echo("  ".join("-" * w for w in widths))
