"""The distributed half of tracking: what every rank of a torchrun job runs beside training.

:class:`JobTracking` owns the communication meter attached to the model (:mod:`.comm_meter`),
the :class:`~.rank_gather.RankGatherer` that brings every rank's row
(:class:`~.rank_rows.RankReport`, built by :mod:`mlflow_gpuopt.tracking.rank_report`) to rank 0
once per interval, and — on rank 0 only — the :class:`~.rank_rows.JobCombiner` whose metrics
the tracker logs. Nothing here runs on the training thread except the one-off gatherer
creation (a collective, at ``track()`` start or at the first step).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from typing import Any, Callable

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout
from mlflow_gpuopt.tracking.distributed.rank_gather import RankGatherer
from mlflow_gpuopt.tracking.distributed.rank_rows import WIDTH, JobCombiner

logger = logging.getLogger(__name__)


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
