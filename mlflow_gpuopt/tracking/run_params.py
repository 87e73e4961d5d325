"""The ``gpuopt.*`` params of a tracked run, and which source wins for each.

Layout params (device, count, nodes, world size, strategy) come from the process at start;
in a distributed job rank 0 logs the job's layout once the ranks have reported
(:meth:`~.distributed.job.JobTracking.params`). Workload params follow one precedence: the
profile measured on a real step, then what the user passed to ``track()``, then what the step
clock saw (samples of the last step), then defaults.
"""

from __future__ import annotations

from typing import Any, Callable

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout
from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile


def device_params(device: str, backend: str) -> dict[str, Any]:
    """What every tracked run says about its device at start."""
    return {contract.PARAM_DEVICE: device, contract.PARAM_GPU_BACKEND: backend}


def single_process_layout(ctx: DistributedContext, device_count: int) -> dict[str, Any]:
    """The layout params of a process that is not part of a job (logged at start)."""
    return {contract.PARAM_DEVICE_COUNT: device_count, contract.PARAM_NODES: ctx.nodes,
            contract.PARAM_WORLD_SIZE: ctx.world_size, contract.PARAM_STRATEGY: ctx.strategy}


def launcher_layout(ctx: DistributedContext, strategy: str) -> dict[str, Any]:
    """A job's layout as the launcher's environment says it (no rank has reported)."""
    return {contract.PARAM_STRATEGY: strategy, contract.PARAM_WORLD_SIZE: ctx.world_size,
            contract.PARAM_NODES: ctx.nodes}


def with_layout(start: dict[str, Any], layout: ParallelLayout | None) -> dict[str, Any]:
    """The start params with the degrees of parallelism added and a strategy among them
    turned into the compound layout the degrees make (``tp2xfsdp``); ``start`` unchanged
    when no degree is known. (A job's strategy is logged later, composed the same way by
    :class:`~.distributed.job.JobTracking`.)"""
    if layout is None:
        return start
    out = {**start, **layout.params()}
    if contract.PARAM_STRATEGY in start:
        out[contract.PARAM_STRATEGY] = layout.strategy(str(start[contract.PARAM_STRATEGY]))
    return out


def profile_overrides(config: TrackConfig) -> dict[str, Any]:
    """What the user told ``track()`` about the workload (wins over what is detected)."""
    return {"micro_batch": config.micro_batch, "grad_accum": config.grad_accum,
            "precision": config.precision, "tokens_per_sample": config.tokens_per_sample}


def workload_params(profile: WorkloadProfile | None, config: TrackConfig,
                    last_step_samples: int | None,
                    fallback_precision: Callable[[], str]) -> dict[str, Any]:
    """The workload params to log; unknown ones (``None``, ``""``, 0) are left out."""
    p, c = profile, config
    params: dict[str, Any] = {
        contract.PARAM_PRECISION: (p.precision if p else None) or c.precision
        or fallback_precision(),
        contract.PARAM_MICRO_BATCH: (p.micro_batch if p else None) or c.micro_batch
        or c.samples_per_step or last_step_samples,
        contract.PARAM_GRAD_ACCUM: (p.grad_accum if p else None) or c.grad_accum or 1,
    }
    if p is not None:
        params[contract.PARAM_PARAMS] = p.params
        params[contract.PARAM_TRAINABLE_PARAMS] = p.trainable_params
        params[contract.PARAM_ACTIVE_PARAMS] = p.active_params  # MoE only
        if p.flops_per_sample is not None:
            params[contract.PARAM_FLOPS_PER_SAMPLE] = f"{p.flops_per_sample:.6g}"
        if p.recompute_flops_per_sample:  # 0: nothing replayed (profile.json says 0.0)
            params[contract.PARAM_RECOMPUTE_FLOPS_PER_SAMPLE] = (
                f"{p.recompute_flops_per_sample:.6g}")
        if p.optimizer:
            params[contract.PARAM_OPTIMIZER] = p.optimizer
        if p.tokens_per_sample:
            params[contract.PARAM_TOKENS_PER_SAMPLE] = p.tokens_per_sample
        if p.sequence_split:  # context parallel: the rank's slice, as measured
            params[contract.PARAM_RANK_TOKENS_PER_SAMPLE] = p.rank_tokens_per_sample
            if p.rank_flops_per_sample is not None:
                params[contract.PARAM_RANK_FLOPS_PER_SAMPLE] = f"{p.rank_flops_per_sample:.6g}"
        if p.kernels_per_micro_step:
            params[contract.PARAM_KERNELS_PER_MICRO_STEP] = f"{p.kernels_per_micro_step:.10g}"
        params[contract.PARAM_ADAPTER] = p.adapter
        if p.padding_fraction is not None:
            params[contract.PARAM_PADDING_FRACTION] = f"{p.padding_fraction:.4g}"
        if p.compiled:
            params[contract.PARAM_COMPILED] = "true"
            if p.eager_kernels_per_micro_step:
                params[contract.PARAM_EAGER_KERNELS_PER_MICRO_STEP] = (
                    f"{p.eager_kernels_per_micro_step:.10g}")
        params[contract.PARAM_ATTENTION] = p.attention
        params[contract.PARAM_RECOMPUTE] = p.recompute
        params[contract.PARAM_FP8_RECIPE] = p.fp8_recipe
        params[contract.PARAM_MEMORY_FORMAT] = p.memory_format
        for key, param in contract.ARCHITECTURE_PARAMS.items():
            params[param] = getattr(p, key)
    return {k: v for k, v in params.items() if v not in (None, "", 0)}
