"""The distributed half of tracking: what every rank of a torchrun job runs beside training.

:class:`JobTracking` owns the communication meter attached to the model (:mod:`.comm_meter`),
the :class:`~.rank_gather.RankGatherer` that brings every rank's
:class:`~.rank_rows.RankReport` to rank 0 once per interval, and — on rank 0 only — the
:class:`~.rank_rows.JobCombiner` whose metrics the tracker logs. Nothing here runs on the
training thread except the one-off gatherer creation (a collective, at ``track()`` start or at
the first step).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking.aggregate import StepAggregator, StepWindow
from mlflow_gpuopt.tracking.hw_reader import HardwareReading
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout
from mlflow_gpuopt.tracking.distributed.rank_gather import RankGatherer
from mlflow_gpuopt.tracking.distributed.rank_rows import (
    NAN,
    WIDTH,
    GpuReading,
    JobCombiner,
    RankReport,
    encode,
)

logger = logging.getLogger(__name__)



def _opt(v: float | None) -> float:
    return float(v) if v is not None else NAN


def _scaled(v: float | None, factor: float) -> float | None:
    return None if v is None else v * factor


@dataclass
class _Interval:
    """This rank's steps since its last report (several ticks may fall in one round)."""

    steps: int = 0
    samples: int = 0
    tokens: int = 0
    collectives: int = 0
    comm_bytes: int = 0
    step_time_sum_s: float = 0.0
    comm_time_s: float = 0.0
    exposed_comm_s: float = 0.0
    step_time_max_s: float = 0.0

    def add(self, w: StepWindow) -> None:
        self.steps += w.steps
        self.samples += w.samples
        self.tokens += w.tokens
        self.collectives += w.collectives
        self.comm_bytes += w.comm_bytes
        self.step_time_sum_s += w.duration_s
        self.comm_time_s += w.comm_time_s
        self.exposed_comm_s += w.exposed_comm_s
        self.step_time_max_s = max(self.step_time_max_s, w.step_time_max_s)


class JobTracking:
    """Per-rank state of a distributed job's tracking.

    Args:
        ctx: this process's place in the job.
        model: the model given to ``track()``; DDP / FSDP2 models get communication timing.
        strategy: ``TrackConfig.strategy`` (wins over what is detected), or ``None``.
        gpu_ids: node-local indices of the GPUs this rank samples (``gpu_<i>`` in the run).
        interval_s: seconds between gathering rounds.
        layout: the job's degrees of parallelism (:mod:`.mesh`); with a model-parallel
            degree above 1 the strategy becomes the compound layout (``tp2xfsdp``).
    """

    def __init__(self, ctx: DistributedContext, model: Any, strategy: str | None,
                 gpu_ids: list[int], interval_s: float,
                 layout: ParallelLayout | None = None) -> None:
        from mlflow_gpuopt.tracking.distributed.comm_meter import (
            CommMeter,
            instrument,
            meter_all_to_all,
        )

        self.ctx = ctx
        self.meter = CommMeter()
        detected = instrument(model, self.meter) if model is not None else "single"
        meter_all_to_all(self.meter)  # MoE dispatch / combine, until stop()
        self.strategy = strategy or (detected if detected != "single" else ctx.strategy)
        if layout is not None:
            self.strategy = layout.strategy(self.strategy)
        #: Ranks that share each sample (a data-parallel replica's tensor x pipeline x
        #: context-parallel group): each rank reports its share, so the job's sum over
        #: ranks counts every sample once.
        self.sample_share = 1.0 / (layout.tp * layout.pp * layout.cp) if layout else 1.0
        self.gpu_ids = list(gpu_ids)
        self.interval_s = interval_s
        self.combiner = JobCombiner() if ctx.is_logging_rank else None
        self.gatherer: RankGatherer | None = None
        self.pending = True  # the gatherer is still to be created
        # interval accumulation on this rank (several ticks may fall in one round)
        self._window = _Interval()
        self._hw = HardwareReading()
        self._cpu_t = (time.perf_counter(), time.process_time())
        self._cpu_pct = float("nan")  # this process's CPU %, all threads, last interval

    # -- the gatherer --------------------------------------------------------------------------
    def start_gatherer(self, collect: Callable[[bool], list[float]],
                       on_round: Callable[[list[list[float]]], None]) -> bool:
        """Create and start the gatherer (collective: every rank at the same point, main
        thread). Returns False when no process group is initialised."""
        import torch.distributed as dist

        self.pending = False
        if not (dist.is_available() and dist.is_initialized()):
            return False
        self.gatherer = RankGatherer(WIDTH, collect, on_round if self.combiner else None,
                                     interval_s=self.interval_s,
                                     timeout_s=max(120.0, 10 * self.interval_s))
        self.gatherer.start()
        return True

    def stop(self, timeout_s: float) -> bool:
        """Last round and join; False if peers did not answer in time (or no gatherer)."""
        from mlflow_gpuopt.tracking.distributed.comm_meter import release_all_to_all

        release_all_to_all(self.meter)
        if self.gatherer is None:
            return False
        return self.gatherer.stop(timeout_s)

    @property
    def gathered(self) -> bool:
        """At least one round reached rank 0."""
        return self.combiner is not None and self.combiner.rounds > 0

    # -- this rank's report --------------------------------------------------------------------
    def add(self, window: StepWindow | None, reading: HardwareReading | None) -> None:
        """One tick's step window and hardware reading, added to the current interval."""
        if window is not None:
            self._window.add(window)
        if reading is not None:
            self._hw = reading

    def report(self, agg: StepAggregator, energy_joules: float | None,
               peak_memory_bytes: float | None) -> RankReport:
        """This rank's report for the round; resets the interval."""
        steady = agg.steady_state()
        comm = agg.comm_summary()
        now = (time.perf_counter(), time.process_time())
        wall = now[0] - self._cpu_t[0]
        if wall >= 0.5 * self.interval_s:  # shorter (the last rounds): keep the last figure
            self._cpu_pct = 100.0 * (now[1] - self._cpu_t[1]) / wall
            self._cpu_t = now
        cpu = self._cpu_pct
        share = self.sample_share
        w, self._window = self._window, _Interval()
        hw = self._hw
        host = hw.host
        gpus = []
        for j, gpu_id in enumerate(self.gpu_ids):
            s = hw.gpus.get(j)
            gpus.append(GpuReading(gpu_id) if s is None else GpuReading(
                gpu_id, _opt(s.utilization_percent), _opt(s.memory_used_bytes),
                _opt(s.power_watts)))
        return RankReport(
            rank=self.ctx.rank, node_rank=self.ctx.node_rank, local_rank=self.ctx.local_rank,
            steps_total=agg.steps, steps=w.steps, samples=w.samples * share,
            tokens=w.tokens * share,
            step_time_sum_s=w.step_time_sum_s, step_time_max_s=w.step_time_max_s,
            collectives=w.collectives, comm_time_s=w.comm_time_s, comm_bytes=float(w.comm_bytes),
            exposed_comm_s=w.exposed_comm_s,
            steady_steps=steady.steps,
            steady_throughput_samples_per_s=_opt(_scaled(steady.throughput_samples_per_s,
                                                         share)),
            steady_throughput_tokens_per_s=_opt(_scaled(steady.throughput_tokens_per_s, share)),
            steady_throughput_steps_per_s=_opt(steady.throughput_steps_per_s),
            steady_step_time_mean_s=_opt(steady.step_time_mean_s),
            steady_step_time_p50_s=_opt(steady.step_time_p50_s),
            steady_step_time_p90_s=_opt(steady.step_time_p90_s),
            comm_steps=int(comm.steps), comm_step_time_s=float(comm.step_time_s),
            comm_collectives=int(comm.totals.collectives),
            comm_time_total_s=float(comm.totals.time_s),
            comm_bytes_total=float(comm.totals.bytes),
            comm_exposed_total_s=float(comm.totals.exposed_s),
            process_cpu_percent=cpu,
            process_rss_bytes=_opt(host.process_rss_bytes if host else None),
            cpu_utilization_percent=_opt(host.cpu_utilization_percent if host else None),
            host_memory_used_bytes=_opt(host.host_memory_used_bytes if host else None),
            peak_memory_bytes=_opt(peak_memory_bytes), energy_joules=_opt(energy_joules),
            gpus=tuple(gpus))

    def row(self, agg: StepAggregator, energy_joules: float | None,
            peak_memory_bytes: float | None) -> list[float]:
        return encode(self.report(agg, energy_joules, peak_memory_bytes))

    # -- layout params (rank 0) ----------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """The layout params from the gathered reports (the launcher's environment
        when no round has come back)."""
        layout = self.combiner.layout() if self.combiner is not None else None
        if layout is not None:
            world, nodes = layout.world_size, layout.nodes
            per_node, count = layout.gpus_per_node, layout.device_count
        else:
            world, nodes = self.ctx.world_size, self.ctx.nodes
            per_node = len(self.gpu_ids) * self.ctx.local_world_size
            count = per_node * nodes
        return {contract.PARAM_STRATEGY: self.strategy, contract.PARAM_WORLD_SIZE: world,
                contract.PARAM_NODES: nodes, contract.PARAM_GPUS_PER_NODE: per_node,
                contract.PARAM_DEVICE_COUNT: count, contract.PARAM_BACKEND: backend(),
                contract.PARAM_INTERCONNECT: interconnect(self.gpu_ids, per_node, nodes)}


def backend() -> str:
    """The default process group's backend (``nccl``, ``gloo``, …) or ``none``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception as exc:
        logger.debug("gpuopt: no process group backend: %s", exc)
    return "none"


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def interconnect(gpu_ids: list[int], gpus_per_node: int, nodes: int) -> str:
    """What links the ranks, as far as this process can see it.

    Inside a node: ``infinity_fabric`` when AMD SMI reports an xGMI link on this rank's GPU
    (AMD Instinct), ``nvlink`` when NVML reports an active NVLink on it, else
    ``pcie`` (several GPUs), or ``loopback`` (CPU ranks on one host). Between nodes:
    ``+network`` for GPU nodes (NCCL picks the fabric; not inspected), ``gloo-tcp`` for CPU
    nodes, with ``(loopback)`` when the rendezvous address is this host.
    """
    if gpus_per_node <= 0:  # CPU ranks
        if nodes <= 1:
            return "loopback"
        return "gloo-tcp (loopback)" if _loopback(os.environ.get("MASTER_ADDR")) else "gloo-tcp"
    if gpus_per_node == 1:
        intra = "single-gpu"
    elif _infinity_fabric_active(gpu_ids):
        intra = "infinity_fabric"
    else:
        intra = "nvlink" if _nvlink_active(gpu_ids) else "pcie"
    return intra if nodes <= 1 else f"{intra}+network"


def _infinity_fabric_active(gpu_ids: list[int]) -> bool:
    """Does AMD SMI report an Infinity Fabric (xGMI) link on any of ``gpu_ids``?"""
    from mlflow_gpuopt.devices.amd import infinity_fabric_active

    return infinity_fabric_active(gpu_ids)


def _nvlink_active(gpu_ids: list[int]) -> bool:
    """Does NVML report an active NVLink on any of ``gpu_ids`` (process-visible indices)?"""
    from mlflow_gpuopt.devices.nvml import NvmlGPUs

    try:
        gpus = NvmlGPUs()
    except Exception:  # no NVML: nothing seen
        return False
    try:
        return any(gpus.nvlink_active(i) for i in (gpu_ids or [0]) if i < len(gpus))
    finally:
        gpus.close()
