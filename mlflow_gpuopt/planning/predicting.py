"""``predict``: throughput, interval, step time and memory of one configuration, and with a
target the time to train. The result is the ``predict --json`` object (``docs/cli.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.planning.inputs import RunOptions
from mlflow_gpuopt.planning.target import TrainingTarget

if TYPE_CHECKING:
    from mlflow_gpuopt.perfmodel.types import ParallelConfig, Workload


@dataclass(frozen=True)
class PredictRequest:
    """What ``predict`` was asked (new options become fields with a default)."""

    gpu: str
    gpus: int
    run_ids: tuple[str, ...] = ()
    workload_path: str | None = None
    observations_path: str | None = None
    #: workload.json of the smaller model the observations measured (a proxy)
    proxy_path: str | None = None
    #: a Hugging Face config.json's training sequence length (tokens)
    seq_len: int | None = None
    nodes: int | None = None
    strategy: str | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    precision: str | None = None
    recompute: str | None = None
    activation_checkpointing: bool = False
    virtual_stages: int | None = None
    #: how the job runs, over the workload's own (pipeline micro-batches, MoE dispatch and
    #: routing, expert tensor parallel, attention kernel, optimizer loop, mixed precision)
    run: RunOptions = RunOptions()
    instance_type: str | None = None
    inter_node_gbps: float | None = None
    #: the GPUs' power limit (W) for the target and the runs on its GPU type (None: TDP)
    power_limit_w: float | None = None
    target: TrainingTarget | None = None


def parse_strategy(text: str) -> tuple[str, int, int]:
    """``(data-parallel strategy, tp, pp)`` from ``ddp``, ``zero2``, ``tp``, ``tp4``,
    ``pp2``, ``tp2xpp2``, ``tp2xpp2xzero1`` (parts joined by ``x``, ``×``, ``+`` or ``,``);
    see :func:`mlflow_gpuopt.perfmodel.layout.parse_layout`."""
    from mlflow_gpuopt.perfmodel.layout import parse_layout

    dp, tp, pp, _vp, _dp = parse_layout(text)
    return dp, tp, pp


def _max_gpus_per_node(catalog: Any, gpu: str) -> int | None:
    """The most GPUs of this type one catalog instance holds (None when none sells it);
    the default node size of a prediction."""
    counts = [o.gpu_count for o in catalog.offers if o.gpu == gpu]
    return max(counts) if counts else None


def _offer(catalog: Any, name: str, gpu: str):
    """The catalog offer ``name`` (an instance type) of ``gpu``: its node is what is rented."""
    found = [o for o in catalog.offers if o.instance_type.lower() == name.strip().lower()]
    if not found:
        raise InputError(f"unknown --instance-type {name!r}; `mlflow gpuopt pricing show "
                         f"--gpu {gpu}` lists the offers of {gpu}")
    of_gpu = [o for o in found if o.gpu == gpu]
    if not of_gpu:
        raise InputError(f"--instance-type {name} holds {found[0].gpu}, not {gpu}")
    return max(of_gpu, key=lambda o: (o.max_nodes, o.inter_node_gbps))


def _network(catalog: Any, gpu: str, offer: Any, inter_node_gbps: float | None):
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


def predict(request: PredictRequest, catalog: Any = None) -> dict[str, Any]:
    """The prediction for the request's configuration (the ``predict --json`` object)."""
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import ParallelConfig, normalize_precision
    from mlflow_gpuopt.perfmodel.layout import context_degree, expert_degree, parse_layout
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_inputs

    r = request
    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    target = catalog.resolve_gpu(r.gpu)
    offer = _offer(catalog, r.instance_type, target) if r.instance_type else None
    inputs = read_inputs(run_ids=r.run_ids, workload_path=r.workload_path,
                         observations_path=r.observations_path, seq_len=r.seq_len,
                         proxy_path=r.proxy_path, catalog=catalog)
    workload, observations = inputs.workload, inputs.observations
    workload = r.run.applied_to(workload)

    # A node larger than any known machine is a typo more often than a machine: at most
    # 8 GPUs (the usual server), or more where the catalog sells or a run measured such a
    # node (a 16-GPU DGX-2).
    catalog_max = offer.gpu_count if offer is not None else _max_gpus_per_node(catalog, target)
    seen = [o.gpu_count // max(1, o.nodes) for o in observations if o.gpu == target]
    node_max = max([8, catalog_max or 0, *seen])
    gpus = r.gpus
    nodes = r.nodes if r.nodes is not None else max(1, math.ceil(gpus / (catalog_max or 8)))
    if gpus % nodes:
        raise InputError(f"--gpus {gpus} does not split evenly over --nodes {nodes}")
    per_node = gpus // nodes
    if offer is not None and nodes > 1 and (offer.inter_node_gbps <= 0
                                            or nodes > offer.max_nodes):
        raise InputError(f"--instance-type {offer.instance_type} runs on at most "
                         f"{offer.max_nodes if offer.inter_node_gbps > 0 else 1} node(s), "
                         f"not {nodes}")
    if per_node > node_max:
        raise InputError(f"--gpus {gpus} over --nodes {nodes} is {per_node} {target} per "
                         f"node; no {target} machine in the catalog or the runs has more "
                         f"than {node_max}")
    strategy = r.strategy or workload.strategy
    dp_strategy, tp, pp = parse_strategy(strategy or ("single" if gpus == 1 else "ddp"))
    vp = r.virtual_stages or parse_layout(strategy or "ddp")[3]
    ep = expert_degree(strategy or "ddp")
    cp = context_degree(strategy or "ddp")
    replicas = parse_layout(strategy or "ddp")[4]  # dpN: checked against the GPUs below
    if tp == 0:
        tp = per_node
    if pp == 0:
        pp = max(1, gpus // max(1, tp))
    etp = r.run.expert_tensor_parallel
    if etp is not None and tp % etp:
        raise InputError(f"--expert-tensor-parallel {etp} must divide the tensor-parallel "
                         f"degree tp{tp} of --strategy {strategy or 'ddp'} (the experts "
                         "split within the tensor-parallel group)")
    precision = normalize_precision(r.precision) if r.precision is not None else None
    used_precision = precision or normalize_precision(workload.precision)
    if used_precision == "fp8" and not catalog.gpus[target].fp8_tflops:
        raise InputError(f"{target} has no FP8 tensor cores (no fp8_tflops in the catalog); "
                         "use --precision bf16, fp16 or fp32, or an FP8 GPU (H100, L4, ...)")

    network = _network(catalog, target, offer, r.inter_node_gbps)
    target_hw = hardware_for_gpu(catalog.gpus[target], gpus_per_node=per_node, offer=offer,
                                 inter_node_gbps=network.inter_node_gbps)
    if r.power_limit_w:
        from mlflow_gpuopt.perfmodel.compute import power_capped

        target_hw = power_capped(target_hw, r.power_limit_w, catalog.gpus[target].tdp_w)
    config = ParallelConfig(
        gpus_per_node=per_node, nodes=nodes,
        strategy=_spelled(f"dp{replicas}" if replicas and dp_strategy == "ddp"
                          else dp_strategy, cp=cp, ep=ep),
        micro_batch=r.micro_batch or workload.micro_batch,
        grad_accum=r.grad_accum or workload.grad_accum or 1,
        precision=precision or workload.precision,
        activation_checkpointing=r.activation_checkpointing, tp=tp, pp=pp,
        recompute=r.recompute or ("full" if r.activation_checkpointing else None),
        virtual_stages=vp)
    def on_target_type(hardware: dict[str, Any]) -> None:
        """The runs on the target's GPU type ran on its network and power limit."""
        if target not in hardware:
            return
        if r.inter_node_gbps:
            hardware[target] = replace(hardware[target],
                                       inter_node_bytes_per_s=r.inter_node_gbps / 8e-9)
        if r.power_limit_w:
            from mlflow_gpuopt.perfmodel.compute import power_capped

            hardware[target] = power_capped(hardware[target], r.power_limit_w,
                                            catalog.gpus[target].tdp_w)

    predictor = fit_runs(workload, observations, catalog, proxy=inputs.proxy,
                         source=", ".join(r.run_ids) or r.proxy_path or "",
                         adjust_hardware=on_target_type)
    _check_a2a_overlap(workload, config)
    p = predictor.predict(config, target_hw)
    effects = predictor.default_effects(config, target_hw)

    m = p.memory
    result = {
        "gpu": target, "gpus": gpus, "nodes": nodes,
        "strategy": strategy or ("single" if gpus == 1 else "ddp"),
        "micro_batch": config.micro_batch, "grad_accum": config.grad_accum,
        "precision": config.precision, "tp": tp, "pp": pp, "virtual_stages": vp, "cp": cp,
        "recompute": config.recompute_mode(workload.recompute),
        "throughput_samples_per_s": p.throughput_samples_per_s, "low": p.low, "high": p.high,
        "step_time_s": p.step_time_s, "memory_per_gpu_bytes": m.total_bytes, "fits": p.fits,
        "p_fits": p.p_fits, "memory_usable_bytes": p.memory_usable_bytes,
        "memory_sigma_bytes": m.sigma_bytes,
        "memory_capacity_bytes": p.memory_capacity_bytes, "max_micro_batch": p.max_micro_batch,
        "tokens_per_s": p.tokens_per_s, "samples_per_step": p.samples_per_step,
        "log_sigma": p.log_sigma, "extrapolated": p.extrapolated, "basis": p.basis,
        "width_terms": [{"term": name, "log_sigma": v} for name, v in p.width_terms],
        "memory": {"weights_bytes": m.weights_bytes, "gradients_bytes": m.gradients_bytes,
                   "optimizer_bytes": m.optimizer_bytes, "activations_bytes": m.activations_bytes,
                   "workspace_bytes": m.workspace_bytes,
                   "cp_buffers_bytes": m.cp_buffers_bytes},
        "time_breakdown": {"compute_s": p.compute_s, "exposed_comm_s": p.exposed_comm_s,
                           "bubble_s": p.bubble_s, "alltoall_s": p.alltoall_s,
                           "cp_exchange_s": p.cp_exchange_s},
        "a2a_overlap": p.a2a_overlap,
        "observations_used": len(observations), "run_ids": list(r.run_ids),
        "assumptions": [*inputs.notes, *p.assumptions], "network": network.as_dict(),
        "instance_type": offer.instance_type if offer is not None else None,
        "operator_classes": predictor.transfer_classes(config, target_hw),
        "defaults": [{**d.as_dict(), "throughput_change": change} for d, change in effects]
        + [d.as_dict() | {"throughput_change": 0.0} for d in predictor.defaults
           if all(d is not e for e, _ in effects)],
    }
    if r.target is not None:
        from mlflow_gpuopt.perfmodel import time_to_train

        total = r.target.total_samples(tokens_per_sample=workload.tokens_per_sample,
                                       samples_per_step=p.samples_per_step)
        t = time_to_train(p, samples=total)
        result.update({
            "target_samples": t.samples, "target_steps": t.steps,
            "time_to_train_hours": t.hours, "time_to_train_hours_low": t.hours_low,
            "time_to_train_hours_high": t.hours_high,
            "time_breakdown_hours": {"compute": t.compute_hours,
                                     "exposed_comm": t.exposed_comm_hours,
                                     "bubble": t.bubble_hours}})
    return result


def _spelled(flavour: str, cp: int, ep: int) -> str:
    """The data-parallel part with the context- and expert-parallel degrees above 1, spelled
    as ``--strategy`` and ``gpuopt.strategy`` spell them (``cp4xep8xfsdp``)."""
    from mlflow_gpuopt.perfmodel.layout import with_degree

    for kind, degree in (("cp", cp), ("ep", ep)):
        if degree > 1:
            flavour = with_degree(flavour, kind, degree)
    return flavour


def _check_a2a_overlap(workload: Workload, config: ParallelConfig) -> None:
    """One line where the planned run asks for the 1F1B all-to-all overlap on a layout
    Megatron-core refuses it on (:func:`~mlflow_gpuopt.perfmodel.moe.a2a_overlap_blocker`)."""
    from mlflow_gpuopt.perfmodel import moe
    from mlflow_gpuopt.perfmodel.errors import PerfModelError
    from mlflow_gpuopt.perfmodel.layout import resolve_layout

    if moe.normalize_a2a_overlap(workload.moe_a2a_overlap) != "1f1b":
        return
    try:
        layout = resolve_layout(config)
    except PerfModelError:
        return  # the prediction says what is wrong with the layout
    why = moe.a2a_overlap_blocker(workload, layout)
    if why:
        raise InputError(f"moe_a2a_overlap 1f1b (--moe-a2a-overlap) cannot run here: {why}")
