"""The scaling chart's points (pure): predicted throughput vs GPU count per GPU type and
instance family, each point a machine shape the family is sold as."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Prediction, Workload
from mlflow_gpuopt.recommend.batching import largest_divisor_at_most
from mlflow_gpuopt.recommend.offers import DATA_PARALLEL_LADDER, allowed_precisions
from mlflow_gpuopt.recommend.types import HardwareFor, Predictor, ScalingPoint


def _scaling_point(predictor: Predictor, hw: Hardware, per_node: int, nodes: int,
                   batch: int, precision: str) -> Prediction | None:
    """The first data-parallel shape that fits (DDP, then ZeRO-1/2, FSDP; activation
    checkpointing last), with the per-GPU ``batch`` split so it fits in memory."""
    n = per_node * nodes
    for ac in (False, True):
        for strategy in (("single",) if n == 1 else DATA_PARALLEL_LADDER):
            base = ParallelConfig(gpus_per_node=per_node, nodes=nodes, strategy=strategy,
                                  micro_batch=1, grad_accum=batch, precision=precision,
                                  activation_checkpointing=ac)
            try:
                m_max = int(predictor.max_micro_batch(base, hw))
                if m_max < 1:
                    continue
                mb = largest_divisor_at_most(batch, m_max)
                p = predictor.predict(replace(base, micro_batch=mb, grad_accum=batch // mb), hw)
            except (ValueError, ArithmeticError):
                continue
            if p.fits:
                return p
    return None


def instance_family(offer: Offer) -> str:
    """The instance family an offer belongs to: its type without the size.

    ``p4d.24xlarge`` -> ``p4d``, ``a2-highgpu-8g`` -> ``a2-highgpu``, ``gpu_8x_a100`` ->
    ``gpu_Nx_a100``, ``Standard_ND96asr_v4`` -> ``Standard_NDasr_v4``; every Colab tier is
    ``colab`` (the same runtime, paid differently).
    """
    it = offer.instance_type
    if offer.provider == "aws":
        return it.split(".", 1)[0]
    if offer.provider == "gcp":
        return re.sub(r"-\d+g?$", "", it)
    if offer.provider == "lambda":
        return re.sub(r"_\d+x_", "_Nx_", it)
    if offer.provider == "azure":
        return re.sub(r"^(Standard_[A-Za-z]+?)\d+", r"\1", it)
    if offer.provider == "colab":
        return "colab"
    return it


def _family_shapes(offers: Sequence[Offer], max_gpus: int) -> list[tuple[int, Offer, int]]:
    """(GPUs, offer, nodes) a family can really be rented as: each node size it sells, then
    whole nodes of its largest networked size, doubling, up to ``max_gpus``."""
    by_count: dict[int, Offer] = {}
    for o in offers:
        prev = by_count.get(o.gpu_count)
        rank = (o.inter_node_gbps, o.max_nodes, o.intra_node_gb_per_s, o.instance_type, o.region)
        if prev is None or rank > (prev.inter_node_gbps, prev.max_nodes,
                                   prev.intra_node_gb_per_s, prev.instance_type, prev.region):
            by_count[o.gpu_count] = o
    shapes = {n: (o, 1) for n, o in by_count.items() if n <= max_gpus}
    multi = [o for o in by_count.values() if o.inter_node_gbps > 0 and o.max_nodes > 1]
    if multi:
        big = max(multi, key=lambda o: o.gpu_count)
        nodes = 2
        while nodes <= big.max_nodes and big.gpu_count * nodes <= max_gpus:
            shapes.setdefault(big.gpu_count * nodes, (big, nodes))
            nodes *= 2
    return [(n, o, nodes) for n, (o, nodes) in sorted(shapes.items())]


def scaling_points(predictor: Predictor, workload: Workload, offers: Sequence[Offer],
                   gpus: Mapping[str, GpuSpec], hardware_for: HardwareFor,
                   max_gpus: int = 64, global_batch: int | None = None,
                   ) -> tuple[ScalingPoint, ...]:
    """Predicted throughput vs GPU count per GPU type and instance family.

    Each point is a shape the family is sold as (one node of each size, then whole nodes of
    its largest networked size), so a line never joins points of different machines; data
    parallel with the least-sharded strategy that fits (so a model too big for DDP still
    gets a curve), at ``global_batch`` split over the GPUs (counts that do not divide it are
    left out) or, with it None, at the workload's per-GPU batch on every GPU.
    """
    families: dict[tuple[str, str, str], list[Offer]] = {}
    for o in offers:
        families.setdefault((o.gpu, o.provider, instance_family(o)), []).append(o)
    batch = max(1, (workload.micro_batch or 1) * (workload.grad_accum or 1))
    points = []
    hw_cache: dict[tuple, Hardware] = {}
    for (gpu, provider, family), members in sorted(families.items()):
        spec = gpus.get(gpu)
        if spec is None:
            continue
        precs = allowed_precisions(workload.precision, spec)
        if not precs:
            continue
        for n, o, nodes in _family_shapes(members, max_gpus):
            if global_batch is not None and global_batch % n:
                continue
            key = (o.instance_type, o.region, o.provider)
            hw = hw_cache.get(key)
            if hw is None:
                hw = hw_cache[key] = hardware_for(spec, o)
            p = _scaling_point(predictor, hw, o.gpu_count, nodes,
                               global_batch // n if global_batch is not None else batch,
                               precs[-1])
            if p is None:
                continue
            points.append(ScalingPoint(gpu=gpu, gpus=n,
                                       throughput_samples_per_s=p.throughput_samples_per_s,
                                       low=p.low, high=p.high, provider=provider,
                                       family=family, instance_type=o.instance_type,
                                       nodes=nodes))
    return tuple(points)
