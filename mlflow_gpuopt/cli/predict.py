"""``mlflow gpuopt predict``: throughput, interval, step time and memory for one configuration.

    mlflow gpuopt predict --run-id ID --gpu A100-80GB-SXM4 --gpus 8
    mlflow gpuopt predict --workload w.json --observations o.csv --gpu "NVIDIA H100 80GB HBM3" \
        --gpus 16 --nodes 2 --strategy zero2 --micro-batch 8 --json
    mlflow gpuopt predict --run-id ID --gpu H100 --gpus 8 --tokens 2B     # + time to train
"""

from __future__ import annotations

import math

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.cli.options import (
    load_catalog_or_fail,
    parse_target,
    reject_empty_values,
    target_options,
)
from mlflow_gpuopt.perfmodel.activations import RECOMPUTE_MODES
from mlflow_gpuopt.validation import BOUNDS


def check_proxy_flags(run_ids, workload_path, observations_path, proxy_path) -> None:
    """The input flags' combinations: runs, a workload file (with observations), or a proxy
    (runs, or ``--proxy-workload`` with its ``--observations``) planning ``--workload``."""
    if run_ids and (observations_path or proxy_path):
        raise UsageError("give --run-id or --observations/--proxy-workload, not both (with "
                         "--run-id, --workload is the model to plan from that proxy run)")
    if not run_ids and not workload_path:
        raise UsageError("give --run-id ID, or --workload W.json [--observations O.csv]")
    if observations_path and not workload_path:
        raise UsageError("--observations needs --workload W.json")
    if proxy_path and not observations_path:
        raise UsageError("--proxy-workload needs --observations O.csv (the proxy's "
                         "measurements)")


def _fmt_hours(h: float) -> str:
    from mlflow_gpuopt.quantities import format_hours

    return format_hours(h) if math.isfinite(h) else "unbounded"


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _human(result: dict) -> str:
    lines = [
        f"{result['gpus']} x {result['gpu']} ({result['nodes']} node(s)), "
        f"{result['strategy']}, micro-batch {result['micro_batch']} x accumulation "
        f"{result['grad_accum']}, {result['precision']}"
        + (f", recompute {result['recompute']}" if result["recompute"] != "none" else ""),
        f"  throughput   {result['throughput_samples_per_s']:,.1f} samples/s  "
        f"(90% interval {result['low']:,.1f} - {result['high']:,.1f})",
    ]
    if result.get("tokens_per_s"):
        lines.append(f"  tokens       {result['tokens_per_s']:,.0f} tokens/s")
    t = result["time_breakdown"]
    lines.append(f"  step time    {result['step_time_s'] * 1e3:,.2f} ms  (compute "
                 f"{t['compute_s'] * 1e3:,.2f} ms, exposed communication "
                 f"{t['exposed_comm_s'] * 1e3:,.2f} ms, pipeline bubble "
                 f"{t['bubble_s'] * 1e3:,.2f} ms)")
    m = result["memory"]
    fits = ("fits" if result["fits"] else "DOES NOT FIT") + f", P(fits) {result['p_fits']:.0%}"
    lines.append(f"  memory/GPU   {_fmt_bytes(result['memory_per_gpu_bytes'])} of "
                 f"{_fmt_bytes(result['memory_usable_bytes'])} usable ({fits}; weights "
                 f"{_fmt_bytes(m['weights_bytes'])}, gradients {_fmt_bytes(m['gradients_bytes'])}"
                 f", optimizer {_fmt_bytes(m['optimizer_bytes'])}, activations "
                 f"{_fmt_bytes(m['activations_bytes'])}, workspace "
                 f"{_fmt_bytes(m['workspace_bytes'])}"
                 + (f", context-parallel K/V buffers {_fmt_bytes(m['cp_buffers_bytes'])}"
                    if m.get("cp_buffers_bytes") else "") + ")")
    lines.append(f"  largest micro-batch that fits: {result['max_micro_batch']}")
    net = result.get("network")
    if net and result["nodes"] > 1:
        lines.append(f"  network      {net['inter_node_gbps']:,.0f} Gbit/s per node "
                     f"({net['source']})")
    if "time_to_train_hours" in result:
        b = result["time_breakdown_hours"]
        total = result["time_to_train_hours"]
        lines.append(
            f"  time to train {_fmt_hours(total)} for {result['target_samples']:,.0f} samples "
            f"({result['target_steps']:,} steps; 90% interval "
            f"{_fmt_hours(result['time_to_train_hours_low'])} - "
            f"{_fmt_hours(result['time_to_train_hours_high'])})")
        share = (lambda x: 100.0 * x / total) if total > 0 else (lambda x: 0.0)
        lines.append(f"  where it goes compute {b['compute']:,.2f} h ({share(b['compute']):.0f}%), "
                     f"exposed communication {b['exposed_comm']:,.2f} h "
                     f"({share(b['exposed_comm']):.0f}%), pipeline bubble "
                     f"{b['bubble']:,.2f} h ({share(b['bubble']):.0f}%)")
    basis = (f"{result['observations_used']} measurement(s)"
             + ("; extrapolated to this GPU type" if result["extrapolated"] else ""))
    lines.append(f"  based on     {basis}")
    for note in result["assumptions"]:
        lines.append(f"  assumption   {note}")
    top = next((d for d in result.get("defaults", ()) if d["throughput_change"]), None)
    if top is not None:
        lines.append(f"  decided most by  {top['quantity']} ({top['source']}): moved by its "
                     f"own spread (x{math.exp(top['log_spread']):.2f}) it changes throughput "
                     f"{100 * top['throughput_change']:+.0f}%")
    return "\n".join(lines)


@click.command("predict")
@click.option("--run-id", "run_ids", multiple=True,
              help="Run tracked with gpuopt.track() (repeatable).")
@click.option("--workload", "workload_path", type=click.Path(dir_okay=False),
              help="workload.json (params, flops_per_sample, precision, ...) or a Hugging "
                   "Face config.json (with --seq-len).")
@click.option("--seq-len", "seq_len", type=click.IntRange(min=1), metavar="N", default=None,
              help="With a Hugging Face config.json: the training sequence length (tokens).")
@click.option("--observations", "observations_path", type=click.Path(dir_okay=False),
              help="CSV: gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,"
                   "precision.")
@click.option("--proxy-workload", "proxy_path", type=click.Path(dir_okay=False),
              help="workload.json of the smaller model --observations measured (a proxy); "
                   "--workload is the model to predict.")
@click.option("--gpu", required=True, help="GPU to predict on (NVML or catalog name).")
@click.option("--gpus", type=click.IntRange(min=1, max=int(BOUNDS["gpu_count"].high)),
              required=True, help="Total GPUs.")
@click.option("--nodes", type=click.IntRange(min=1, max=int(BOUNDS["nodes"].high)),
              default=None, help="Nodes (default: as few as the catalog's largest machine "
                                 "allows).")
@click.option("--strategy", default=None,
              help="single, ddp, zero1, zero2, zero3, fsdp, tp[N], pp[N] or e.g. tp2xpp2xddp.")
@click.option("--micro-batch", type=click.IntRange(min=1, max=int(BOUNDS["micro_batch"].high)),
              default=None, help="Per-GPU micro-batch (default: the measured one).")
@click.option("--grad-accum", type=click.IntRange(min=1, max=int(BOUNDS["grad_accum"].high)),
              default=None, help="Gradient-accumulation steps (default: the measured one).")
@click.option("--precision", default=None,
              help="fp32, tf32, fp16, bf16 or fp8 (default: measured).")
@click.option("--recompute", type=click.Choice(list(RECOMPUTE_MODES)), default=None,
              help="Activation recomputation (default: the workload's own, else none).")
@click.option("--activation-checkpointing", is_flag=True,
              help="Full activation recomputation (same as --recompute full).")
@click.option("--virtual-stages", type=click.IntRange(min=1), default=None,
              help="Interleaved pipeline schedule: model chunks per pipeline stage.")
@click.option("--instance-type", default=None,
              help="A catalog offer (e.g. p5.48xlarge): its GPUs per node, NVLink and network.")
@click.option("--inter-node-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Node network, Gbit/s per node (default: the catalog's multi-node offers).")
@click.option("--power-limit-w", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The GPUs' power limit (nvidia-smi -pl), W, for the target and the runs "
                   "on the same GPU type (default: the board's TDP).")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def predict(run_ids, workload_path, observations_path, proxy_path, gpu, gpus, nodes, strategy,
            micro_batch, grad_accum, precision, recompute, activation_checkpointing, virtual_stages,
            instance_type, inter_node_gbps, power_limit_w, samples, epochs, dataset_size, tokens,
            steps, as_json, seq_len) -> None:
    """Predict throughput, memory and step time for one configuration, and with a target
    (--samples, --epochs/--dataset-size, --tokens or --steps) the time to train."""
    from mlflow_gpuopt.planning.predicting import PredictRequest
    from mlflow_gpuopt.planning.predicting import predict as run_predict

    reject_empty_values(click.get_current_context())
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=False)
    check_proxy_flags(run_ids, workload_path, observations_path, proxy_path)
    if run_ids and seq_len is not None and not workload_path:
        raise UsageError("--seq-len goes with --workload CONFIG.json, not --run-id")
    if activation_checkpointing and recompute not in (None, "full"):
        raise UsageError("--activation-checkpointing means --recompute full; give one of them")
    result = run_predict(PredictRequest(
        gpu=gpu, gpus=gpus, run_ids=tuple(run_ids), workload_path=workload_path,
        observations_path=observations_path, proxy_path=proxy_path, seq_len=seq_len,
        nodes=nodes, strategy=strategy, micro_batch=micro_batch, grad_accum=grad_accum,
        precision=precision, recompute=recompute,
        activation_checkpointing=activation_checkpointing, virtual_stages=virtual_stages,
        instance_type=instance_type, inter_node_gbps=inter_node_gbps,
        power_limit_w=power_limit_w, target=training_target), load_catalog_or_fail())
    click.echo(_json.dumps(result) if as_json else _human(result))
