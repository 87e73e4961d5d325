"""What a plan is made from: measured runs (read-only) or files → workload, observations,
notes and the measured global batch.

GPU names are resolved once, here, by the loaded catalog (``catalog.resolve_gpu``): an NVML
name a run recorded and a name in an observations CSV become the catalog's name, so the fit
and the search find the GPU's spec under it (:func:`mlflow_gpuopt.planning.fitting.fit_runs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.perfmodel.types import Observation, Workload


@dataclass(frozen=True)
class PlanInputs:
    """The workload and its measurements, with what was read of each run."""

    workload: Workload
    observations: tuple[Observation, ...]
    run_ids: tuple[str, ...] = ()
    #: What the reader had to do differently, in words (e.g. a run without its summary).
    notes: tuple[str, ...] = ()
    #: What was read of each run (``mlflow_io.runs.RunRecord``), in ``run_ids`` order.
    records: tuple[Any, ...] = ()
    #: The smaller model the observations measured, when they are a proxy of ``workload``
    #: (the model to plan: :func:`mlflow_gpuopt.perfmodel.transfer.fit_proxy`); else None.
    proxy: Workload | None = None

    @property
    def measured(self) -> Workload:
        """The workload the observations measured: the proxy, else the workload."""
        return self.proxy or self.workload

    @property
    def from_runs(self) -> bool:
        """True when the inputs are measured runs (a plan can be logged under them)."""
        return bool(self.run_ids)

    @property
    def measured_global_batch(self) -> int:
        """Samples per optimizer step of the measured run (the first run, whose profile is
        the measured workload): its micro-batch × accumulation × data-parallel ranks (its
        GPUs)."""
        first = self.observations[0] if self.observations else None
        mb = (first and first.micro_batch) or self.measured.micro_batch or 1
        accum = (first and first.grad_accum) or self.measured.grad_accum or 1
        ranks = first.gpu_count if first else 1
        return max(1, mb * accum * max(1, ranks))

    @property
    def per_rank_batch(self) -> int:
        """Samples one rank takes per optimizer step: micro-batch × accumulation."""
        return (self.workload.micro_batch or 1) * (self.workload.grad_accum or 1)

    def run_facts(self):
        """The first run's measurements for the advice rules, from what was already read
        (no second read of the run); ``None`` for file inputs."""
        if not self.records:
            return None
        from mlflow_gpuopt.mlflow_io.advice import facts_from_record

        return facts_from_record(self.records[0])

    def with_recompute(self, mode: str | None) -> PlanInputs:
        """The plans run with activation recomputation ``mode``; the runs ran as they were
        measured (their own mode, else the workload's, else none)."""
        if not mode:
            return self
        observations = tuple(dataclasses.replace(o, recompute=o.recompute or
                                                 self.measured.recompute or "none")
                             for o in self.observations)
        return dataclasses.replace(self, observations=observations,
                                   workload=dataclasses.replace(self.workload, recompute=mode))


@dataclass(frozen=True)
class RunOptions:
    """How the job runs, where the user says so over the workload's own (``None``: the
    workload's): the flags ``predict`` and ``recommend`` share (``cli.options.run_options``)."""

    #: micro-batches per run of the pipeline schedule
    pp_microbatches: int | None = None
    #: mixture of experts: the token dispatcher (alltoall, allgather, flex) and the routing
    moe_dispatcher: str | None = None
    moe_routing: str | None = None
    #: mixture of experts: the all-to-alls under another micro-batch's compute (1f1b, none)
    moe_a2a_overlap: str | None = None
    #: the routed experts' tensor-parallel degree (dividing tp)
    expert_tensor_parallel: int | None = None
    #: the fused attention kernel (fa2, fa3)
    attention_kernel: str | None = None
    #: how the optimizer step runs on the GPU: for-loop, foreach, fused
    optimizer_impl: str | None = None
    #: how a 16-bit job keeps its weights and casts: autocast, master_weights, apex_o1
    mixed_precision: str | None = None

    def applied_to(self, workload: Workload) -> Workload:
        """``workload`` with what the flags say, where given (one clear line for an unknown
        word, or an expert tensor parallel on a dense model)."""
        from mlflow_gpuopt.perfmodel.compute import (
            normalize_attention_kernel,
            normalize_mixed_precision,
            normalize_optimizer_impl,
        )
        from mlflow_gpuopt.perfmodel.moe import (
            normalize_a2a_overlap,
            normalize_dispatcher,
            normalize_routing,
        )

        for flag, value, normalize, key in (
                ("--moe-dispatcher", self.moe_dispatcher, normalize_dispatcher,
                 "moe_dispatcher"),
                ("--moe-routing", self.moe_routing, normalize_routing, "moe_routing"),
                ("--moe-a2a-overlap", self.moe_a2a_overlap, normalize_a2a_overlap,
                 "moe_a2a_overlap"),
                ("--attention-kernel", self.attention_kernel, normalize_attention_kernel,
                 "attention_kernel"),
                ("--optimizer-impl", self.optimizer_impl, normalize_optimizer_impl,
                 "optimizer_impl"),
                ("--mixed-precision", self.mixed_precision, normalize_mixed_precision,
                 "mixed_precision")):
            if value is None:
                continue
            try:
                workload = dataclasses.replace(workload, **{key: normalize(value)})
            except ValueError as exc:
                raise InputError(f"{flag}: {exc}") from None
        if self.pp_microbatches is not None:
            workload = dataclasses.replace(workload, pp_microbatches=int(self.pp_microbatches))
        etp = self.expert_tensor_parallel
        if etp is not None:
            from mlflow_gpuopt.perfmodel.moe import is_moe

            if not is_moe(workload):
                raise InputError(f"--expert-tensor-parallel {etp}: the experts' tensor "
                                 "parallel needs a mixture-of-experts workload (num_experts "
                                 "of 2 or more)")
            workload = dataclasses.replace(workload, expert_tensor_parallel=int(etp))
        return workload


def read_runs(run_ids: Sequence[str], catalog: Any, *, experiment: str | None = None,
              client: Any = None) -> PlanInputs:
    """The inputs from measured runs: ``run_ids``, or with ``experiment`` all measured runs
    of its newest run's workload. Raises an :class:`InputError` (one line)."""
    from mlflow_gpuopt.mlflow_io.runs import load_run_inputs

    if experiment:
        from mlflow_gpuopt.mlflow_io.measured import (
            measured_runs_in_experiment,
            same_workload_run_ids,
        )

        run_ids = same_workload_run_ids(measured_runs_in_experiment(experiment))
    inputs = load_run_inputs(list(run_ids), client=client, resolve_gpu=catalog.resolve_gpu)
    return PlanInputs(workload=inputs.workload, observations=tuple(inputs.observations),
                      run_ids=tuple(inputs.run_ids), notes=tuple(inputs.notes),
                      records=tuple(inputs.records))


def read_files(workload_path: str, observations_path: str | None, catalog: Any, *,
               seq_len: int | None = None, proxy_path: str | None = None) -> PlanInputs:
    """The inputs from ``workload.json`` (or a Hugging Face ``config.json`` trained at
    ``seq_len`` tokens) and an optional observations CSV (no run); with ``proxy_path``, the
    observations measured that smaller workload, a proxy of ``workload_path``."""
    from mlflow_gpuopt.workload_files import load_observations, read_workload

    read = read_workload(workload_path, seq_len=seq_len)
    observations = (load_observations(observations_path, resolve_gpu=catalog.resolve_gpu)
                    if observations_path else [])
    proxy = read_workload(proxy_path).workload if proxy_path else None
    return PlanInputs(workload=read.workload, observations=tuple(observations),
                      notes=tuple(read.notes), proxy=proxy)


def read_inputs(*, run_ids: Sequence[str] = (), experiment: str | None = None,
                workload_path: str | None = None, observations_path: str | None = None,
                seq_len: int | None = None, proxy_path: str | None = None,
                catalog: Any) -> PlanInputs:
    """Runs (``run_ids`` / ``experiment``) or files (``workload_path``), as the caller checked
    the flags. Runs with ``workload_path`` are a proxy of that workload, the one to plan."""
    if (run_ids or experiment) and workload_path:
        runs = read_runs(run_ids, catalog, experiment=experiment)
        read = read_files(workload_path, None, catalog, seq_len=seq_len)
        return dataclasses.replace(runs, workload=read.workload, proxy=runs.workload,
                                   notes=(*runs.notes, *read.notes))
    if workload_path:
        return read_files(workload_path, observations_path, catalog, seq_len=seq_len,
                          proxy_path=proxy_path)
    if not (run_ids or experiment):
        raise InputError("no run id given")
    return read_runs(run_ids, catalog, experiment=experiment)
