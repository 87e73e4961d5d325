"""``mlflow gpuopt predict``: throughput, interval, step time and memory for one configuration.

    mlflow gpuopt predict --run-id ID --gpu A100-80GB-SXM4 --gpus 8
    mlflow gpuopt predict --workload w.json --observations o.csv --gpu "NVIDIA H100 80GB HBM3" \
        --gpus 16 --nodes 2 --strategy zero2 --micro-batch 8 --json
    mlflow gpuopt predict --run-id ID --gpu H100 --gpus 8 --tokens 2B     # + time to train
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import click

from mlflow_gpuopt.cli import _json
from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.perfmodel.activations import RECOMPUTE_MODES
from mlflow_gpuopt.cli.options import (
    load_catalog_or_fail,
    parse_target,
    reject_empty_values,
    resolve_gpu_or_fail,
    target_options,
)
from mlflow_gpuopt.validation import BOUNDS

logger = logging.getLogger(__name__)

def parse_strategy(text: str) -> tuple[str, int, int]:
    """``(data-parallel strategy, tp, pp)`` from ``ddp``, ``zero2``, ``tp``, ``tp4``,
    ``pp2``, ``tp2xpp2``, ``tp2xpp2xzero1`` (parts joined by ``x``, ``×``, ``+`` or ``,``);
    see :func:`mlflow_gpuopt.perfmodel.layout.parse_layout`."""
    from mlflow_gpuopt.perfmodel.errors import PerfModelError
    from mlflow_gpuopt.perfmodel.layout import parse_layout

    try:
        dp, tp, pp, _vp, _dp = parse_layout(text)
    except PerfModelError as exc:
        raise UsageError(str(exc)) from None
    return dp, tp, pp


def _max_gpus_per_node(catalog, gpu: str) -> int | None:
    """The most GPUs of this type one catalog instance holds (None when none sells it);
    the default node size of a prediction."""
    counts = [o.gpu_count for o in catalog.offers if o.gpu == gpu]
    return max(counts) if counts else None


def _offer(catalog, name: str, gpu: str):
    """The catalog offer ``name`` (an instance type) of ``gpu``: its node is what is rented."""
    found = [o for o in catalog.offers if o.instance_type.lower() == name.strip().lower()]
    if not found:
        raise UsageError(f"unknown --instance-type {name!r}; `mlflow gpuopt pricing show "
                         f"--gpu {gpu}` lists the offers of {gpu}")
    of_gpu = [o for o in found if o.gpu == gpu]
    if not of_gpu:
        raise UsageError(f"--instance-type {name} holds {found[0].gpu}, not {gpu}")
    return max(of_gpu, key=lambda o: (o.max_nodes, o.inter_node_gbps))


def _network(catalog, gpu: str, offer, inter_node_gbps):
    """The node network the prediction assumes, and where it comes from."""
    from mlflow_gpuopt.hardware import NetworkChoice, multi_node_network

    if inter_node_gbps is not None:
        return NetworkChoice(float(inter_node_gbps), "--inter-node-gbps", None)
    if offer is not None:
        if offer.max_nodes > 1 and offer.inter_node_gbps > 0:
            return NetworkChoice(offer.inter_node_gbps,
                                 f"instance type {offer.provider} {offer.instance_type}",
                                 offer.inter_node_rdma)
        return NetworkChoice(0.0, f"instance type {offer.provider} {offer.instance_type} "
                             "(single node only)", False)
    return multi_node_network(catalog.offers, gpu)


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


def _inputs(run_ids, workload_path, observations_path, catalog, seq_len=None, proxy_path=None):
    """(workload, observations, notes, proxy workload or None): a proxy's observations
    belong to the proxy workload, and the prediction is for ``--workload``."""
    from mlflow_gpuopt.workload_files import (
        WorkloadFileError,
        load_observations,
        read_workload,
    )

    check_proxy_flags(run_ids, workload_path, observations_path, proxy_path)
    if run_ids and seq_len is not None and not workload_path:
        raise UsageError("--seq-len goes with --workload CONFIG.json, not --run-id")
    try:
        read = read_workload(workload_path, seq_len=seq_len) if workload_path else None
        if proxy_path:
            observations = load_observations(observations_path,
                                             resolve_gpu=catalog.resolve_gpu)
            return (read.workload, observations, list(read.notes),
                    read_workload(proxy_path).workload)
    except WorkloadFileError as exc:
        raise UsageError(str(exc)) from None
    if run_ids:
        from mlflow_gpuopt.mlflow_io.runs import RunInputError, load_run_inputs

        try:
            inputs = load_run_inputs(run_ids, resolve_gpu=catalog.resolve_gpu)
        except RunInputError as exc:
            raise UsageError(str(exc)) from None
        if read is not None:  # the runs are a proxy of the model to predict
            return (read.workload, list(inputs.observations),
                    [*inputs.notes, *read.notes], inputs.workload)
        return inputs.workload, list(inputs.observations), list(inputs.notes), None
    try:
        observations = (load_observations(observations_path, resolve_gpu=catalog.resolve_gpu)
                        if observations_path else [])
    except WorkloadFileError as exc:
        raise UsageError(str(exc)) from None
    return read.workload, observations, list(read.notes), None


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
                 f"{_fmt_bytes(m['workspace_bytes'])})")
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
    from mlflow_gpuopt.hardware import hardware_for_gpu, measured_hardware
    from mlflow_gpuopt.perfmodel import ParallelConfig, PerfModelError, fit, normalize_precision
    from mlflow_gpuopt.perfmodel.transfer import fit_proxy

    reject_empty_values(click.get_current_context())
    training_target = parse_target(samples=samples, epochs=epochs, dataset_size=dataset_size,
                                   tokens=tokens, steps=steps, required=False)
    catalog = load_catalog_or_fail()
    target = resolve_gpu_or_fail(catalog, gpu)
    offer = _offer(catalog, instance_type, target) if instance_type else None
    workload, observations, input_notes, proxy = _inputs(
        run_ids, workload_path, observations_path, catalog, seq_len, proxy_path)

    # A node larger than any known machine is a typo more often than a machine: at most
    # 8 GPUs (the usual server), or more where the catalog sells or a run measured such a
    # node (a 16-GPU DGX-2).
    catalog_max = offer.gpu_count if offer is not None else _max_gpus_per_node(catalog, target)
    seen = [o.gpu_count // max(1, o.nodes) for o in observations if o.gpu == target]
    node_max = max([8, catalog_max or 0, *seen])
    if nodes is None:
        nodes = max(1, math.ceil(gpus / (catalog_max or 8)))
    if gpus % nodes:
        raise UsageError(f"--gpus {gpus} does not split evenly over --nodes {nodes}")
    per_node = gpus // nodes
    if offer is not None and nodes > 1 and (offer.inter_node_gbps <= 0
                                            or nodes > offer.max_nodes):
        raise UsageError(f"--instance-type {offer.instance_type} runs on at most "
                         f"{offer.max_nodes if offer.inter_node_gbps > 0 else 1} node(s), "
                         f"not {nodes}")
    if per_node > node_max:
        raise UsageError(f"--gpus {gpus} over --nodes {nodes} is {per_node} {target} per node; "
                         f"no {target} machine in the catalog or the runs has more than "
                         f"{node_max}")
    if activation_checkpointing and recompute not in (None, "full"):
        raise UsageError("--activation-checkpointing means --recompute full; give one of them")
    strategy = strategy or workload.strategy
    dp_strategy, tp, pp = parse_strategy(strategy or ("single" if gpus == 1 else "ddp"))
    from mlflow_gpuopt.perfmodel.layout import expert_degree, parse_layout

    vp = virtual_stages or parse_layout(strategy or "ddp")[3]
    ep = expert_degree(strategy or "ddp")
    if tp == 0:
        tp = per_node
    if pp == 0:
        pp = max(1, gpus // max(1, tp))
    if precision is not None:
        try:
            precision = normalize_precision(precision)
        except PerfModelError as exc:
            raise UsageError(str(exc)) from None
    used_precision = precision or normalize_precision(workload.precision)
    if used_precision == "fp8" and not catalog.gpus[target].fp8_tflops:
        raise UsageError(f"{target} has no FP8 tensor cores (no fp8_tflops in the catalog); "
                         "use --precision bf16, fp16 or fp32, or an FP8 GPU (H100, L4, ...)")

    hardware = measured_hardware(observations, catalog)
    network = _network(catalog, target, offer, inter_node_gbps)
    target_hw = hardware_for_gpu(catalog.gpus[target], gpus_per_node=per_node, offer=offer,
                                 inter_node_gbps=network.inter_node_gbps)
    if inter_node_gbps and target in hardware:  # the runs on the target's GPU type: its network
        hardware[target] = replace(hardware[target], inter_node_bytes_per_s=inter_node_gbps / 8e-9)
    if power_limit_w:
        from mlflow_gpuopt.perfmodel.compute import power_capped

        tdp = catalog.gpus[target].tdp_w
        target_hw = power_capped(target_hw, power_limit_w, tdp)
        if target in hardware:
            hardware[target] = power_capped(hardware[target], power_limit_w, tdp)
    config = ParallelConfig(
        gpus_per_node=per_node, nodes=nodes,
        strategy=dp_strategy if ep == 1 else f"{dp_strategy}xep{ep}",
        micro_batch=micro_batch or workload.micro_batch,
        grad_accum=grad_accum or workload.grad_accum or 1,
        precision=precision or workload.precision,
        activation_checkpointing=activation_checkpointing, tp=tp, pp=pp,
        recompute=recompute or ("full" if activation_checkpointing else None), virtual_stages=vp)
    try:
        predictor = (fit(workload, observations, hardware) if proxy is None else fit_proxy(
            proxy, observations, hardware, workload, source=", ".join(run_ids) or proxy_path))
        p = predictor.predict(config, target_hw)
        effects = predictor.default_effects(config, target_hw)
    except PerfModelError as exc:
        raise UsageError(str(exc)) from None

    shown_strategy = strategy or ("single" if gpus == 1 else "ddp")
    m = p.memory
    result = {
        "gpu": target, "gpus": gpus, "nodes": nodes, "strategy": shown_strategy,
        "micro_batch": config.micro_batch, "grad_accum": config.grad_accum,
        "precision": config.precision, "tp": tp, "pp": pp, "virtual_stages": vp,
        "recompute": config.recompute_mode(workload.recompute),
        "throughput_samples_per_s": p.throughput_samples_per_s, "low": p.low, "high": p.high,
        "step_time_s": p.step_time_s, "memory_per_gpu_bytes": m.total_bytes, "fits": p.fits,
        "p_fits": p.p_fits, "memory_usable_bytes": p.memory_usable_bytes,
        "memory_sigma_bytes": m.sigma_bytes,
        "memory_capacity_bytes": p.memory_capacity_bytes, "max_micro_batch": p.max_micro_batch,
        "tokens_per_s": p.tokens_per_s, "samples_per_step": p.samples_per_step,
        "log_sigma": p.log_sigma, "extrapolated": p.extrapolated, "basis": p.basis,
        "memory": {"weights_bytes": m.weights_bytes, "gradients_bytes": m.gradients_bytes,
                   "optimizer_bytes": m.optimizer_bytes, "activations_bytes": m.activations_bytes,
                   "workspace_bytes": m.workspace_bytes},
        "time_breakdown": {"compute_s": p.compute_s, "exposed_comm_s": p.exposed_comm_s,
                           "bubble_s": p.bubble_s, "alltoall_s": p.alltoall_s},
        "observations_used": len(observations), "run_ids": list(run_ids),
        "assumptions": [*input_notes, *p.assumptions], "network": network.as_dict(),
        "instance_type": offer.instance_type if offer is not None else None,
        "defaults": [{**d.as_dict(), "throughput_change": change} for d, change in effects]
        + [d.as_dict() | {"throughput_change": 0.0} for d in predictor.defaults
           if all(d is not e for e, _ in effects)],
    }
    if training_target is not None:
        from mlflow_gpuopt.perfmodel import time_to_train

        total = training_target.total_samples(tokens_per_sample=workload.tokens_per_sample,
                                              samples_per_step=p.samples_per_step)
        try:
            t = time_to_train(p, samples=total)
        except PerfModelError as exc:
            raise UsageError(str(exc)) from None
        result.update({
            "target_samples": t.samples, "target_steps": t.steps,
            "time_to_train_hours": t.hours, "time_to_train_hours_low": t.hours_low,
            "time_to_train_hours_high": t.hours_high,
            "time_breakdown_hours": {"compute": t.compute_hours,
                                     "exposed_comm": t.exposed_comm_hours,
                                     "bubble": t.bubble_hours}})
    click.echo(_json.dumps(result) if as_json else _human(result))
