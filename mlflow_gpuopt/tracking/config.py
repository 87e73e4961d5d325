"""Options of ``track()`` / ``Tracker``: one frozen dataclass, every field with its unit."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

#: Shortest sampling period, seconds: each tick reads the hardware and takes the step
#: records; at 0.01 s that cost cut throughput 4-7x on CPU training.
MIN_INTERVAL_S = 0.1


@dataclass(frozen=True)
class TrackConfig:
    """How ``track()`` measures. Every field has a working default.

    Args:
        interval_s: seconds between hardware samples (the sampler thread's period); at least
            ``MIN_INTERVAL_S`` (0.1 s: a shorter one is raised to it, with a warning).
        warmup_steps: first training steps left out of the steady-state summary.
        profile: measure the workload profile (FLOPs, activations) once, on a real step.
        profile_step: 0-based training step whose forward+backward is profiled.
        run_id: log into this existing run (e.g. Lightning ``MLFlowLogger.run_id``) instead of
            the active one or a new one.
        run_name: name of the run when ``track()`` starts one.
        name: workload name in ``profile.json`` (default: the model's class name).
        micro_batch, grad_accum, samples_per_step, tokens_per_sample, precision, strategy:
            override what is inferred from the model's inputs and the optimizer.
        device_mesh: the job's ``torch.distributed.DeviceMesh``, whose named dimensions
            (``tp``, ``pp``, ``dp``/``dp_shard``/``dp_replicate``, ``cp``, ``ep``) give the
            degrees of parallelism (default: the mesh of the model's DTensor parameters, if
            any).
        tp, pp, dp, cp, ep: tensor / pipeline / data / context / expert-parallel degrees;
            each given one wins over the mesh.
        gpu_indices: process-visible GPU indices to sample (default: the model's CUDA devices,
            else every visible GPU when the model is not on CPU).
        print_summary: print a short summary at exit.
        max_step_records: bound of the queue between the step hook and the sampler thread.
        flush_timeout_s: at exit, how long to wait for MLflow to take the queued records
            (what is left stays in the writer's journal, to replay later).
        plan: the plan the job was launched as (``<recommendation_run_id>:<rank>``; default
            ``$GPUOPT_PLAN``): the run is tagged with it, logs its predictions and, at the
            end, measured / predicted ratios (``docs/launch.md``).
    """

    interval_s: float = 1.0
    warmup_steps: int = 3
    profile: bool = True
    profile_step: int = 1
    run_id: str | None = None
    run_name: str | None = None
    name: str | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    samples_per_step: int | None = None
    tokens_per_sample: int | None = None
    precision: str | None = None
    strategy: str | None = None
    device_mesh: Any = field(default=None, compare=False, repr=False)
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    gpu_indices: tuple[int, ...] | None = None
    print_summary: bool = True
    max_step_records: int = 1_000_000
    flush_timeout_s: float = 10.0
    plan: str | None = None

    def __post_init__(self) -> None:
        for name in ("interval_s", "flush_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, not {value!r}")
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if self.flush_timeout_s < 0:
            raise ValueError("flush_timeout_s must be >= 0")
        if self.max_step_records < 1:
            raise ValueError("max_step_records must be >= 1")
        if self.interval_s < MIN_INTERVAL_S:
            logging.getLogger(__name__).warning(
                "gpuopt: interval_s=%g is below %g s (sampling that often slows training); "
                "using %g s", self.interval_s, MIN_INTERVAL_S, MIN_INTERVAL_S)
            object.__setattr__(self, "interval_s", MIN_INTERVAL_S)
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if self.precision is not None and self.precision not in (
                "fp32", "tf32", "fp16", "bf16", "fp8"):
            raise ValueError("precision must be one of fp32, tf32, fp16, bf16, fp8")
        for name in ("tp", "pp", "dp", "cp", "ep"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1")

    @classmethod
    def from_kwargs(cls, config: TrackConfig | None, kwargs: dict) -> TrackConfig:
        """``config`` with ``kwargs`` applied on top; unknown names raise ``TypeError``."""
        names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown track() option(s): {', '.join(sorted(unknown))}")
        if kwargs.get("gpu_indices") is not None:
            kwargs = {**kwargs, "gpu_indices": tuple(kwargs["gpu_indices"])}
        return replace(config or cls(), **kwargs)
