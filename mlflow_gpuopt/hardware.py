"""Adapter from the catalog's records (``GpuSpec``, ``Offer``) to the models' ``Hardware``.

The only place that decides which link a GPU talks over: the offer's measured/declared
intra-node link when there is an offer, else the spec's NVLink (SXM parts) or its PCIe
generation; the node network from the offer, or as given (``--inter-node-gbps``), else what
the catalog's multi-node offers of that GPU provide (:func:`multi_node_network`), and only
where the catalog has none a conservative default.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from mlflow_gpuopt.catalog.catalog import Catalog
from mlflow_gpuopt.catalog.schema import PRECISIONS, GpuSpec, Offer
from mlflow_gpuopt.perfmodel.fitting import is_cpu
from mlflow_gpuopt.perfmodel.types import Hardware, Observation

logger = logging.getLogger(__name__)

#: One direction of a x16 slot, GB/s, by PCIe generation (what GPU-to-GPU traffic gets
#: without NVLink).
PCIE_GB_PER_S = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}
#: Node network assumed where neither an offer, the user nor the catalog's multi-node offers
#: of the GPU say better: 100 Gbit/s Ethernet.
DEFAULT_INTER_NODE_GBPS = 100.0


@dataclass(frozen=True)
class NetworkChoice:
    """The node network a prediction assumes, and where it comes from (shown to the user)."""

    inter_node_gbps: float  # per node, one direction, Gbit/s
    source: str  # "instance-type p5.48xlarge", "--inter-node-gbps", "catalog: ...", "default: ..."
    rdma: bool | None = None  # None where unknown

    def as_dict(self) -> dict:
        """The ``network`` object of ``predict --json``."""
        return {"inter_node_gbps": self.inter_node_gbps, "source": self.source,
                "rdma": self.rdma}


def multi_node_network(offers: Iterable[Offer], gpu: str) -> NetworkChoice:
    """The node network the catalog's multi-node offers of ``gpu`` provide.

    Only offers that can span nodes (``max_nodes > 1``, a network) and hold the most GPUs of
    that type per node count: a multi-node job rents full nodes (an 8-GPU p5.48xlarge, not the
    1-GPU p5.4xlarge). The figure is the most common ``inter_node_gbps`` among them (ties: the
    median of the tied values), e.g. 3,200 Gbit/s for H100 (AWS p5, Azure ND H100 v5) over
    GCP a3-high's 1,000 and a3-mega's 1,800. Without any such offer: 100 Gbit/s Ethernet.
    """
    multi = [o for o in offers if o.gpu == gpu and o.max_nodes > 1 and o.inter_node_gbps > 0]
    if not multi:
        return NetworkChoice(DEFAULT_INTER_NODE_GBPS,
                             f"default: no multi-node offer of {gpu} in the catalog, "
                             f"{DEFAULT_INTER_NODE_GBPS:g} Gbit/s Ethernet assumed", None)
    biggest = max(o.gpu_count for o in multi)
    full = [o for o in multi if o.gpu_count == biggest]
    counts = Counter(o.inter_node_gbps for o in full)
    top = max(counts.values())
    gbps = float(statistics.median(sorted(v for v, c in counts.items() if c == top)))
    names = sorted({f"{o.provider} {o.instance_type}" for o in full
                    if o.inter_node_gbps == gbps})
    rdma = any(o.inter_node_rdma for o in full if o.inter_node_gbps == gbps)
    return NetworkChoice(gbps, f"catalog: most common among {len(full)} multi-node "
                         f"{biggest}-GPU offers of {gpu} ({', '.join(names)})", rdma)


def _intra_node_gb_per_s(spec: GpuSpec, offer: Offer | None) -> float:
    """GPU-to-GPU bandwidth per GPU, one direction, GB/s."""
    if offer is not None and offer.intra_node_gb_per_s:
        # Catalog figures are totals per GPU (both directions), as datasheets quote NVLink.
        return offer.intra_node_gb_per_s / 2.0
    if offer is not None and offer.intra_node_link.startswith("pcie"):
        gen = int(offer.intra_node_link[4:] or spec.pcie_gen)
        return PCIE_GB_PER_S.get(gen, 16.0)
    # Without an offer: NVLink for SXM parts only (PCIe cards' NVLink is a 2-GPU bridge).
    if spec.nvlink_gb_per_s and "PCIE" not in spec.name.upper():
        return spec.nvlink_gb_per_s / 2.0
    return PCIE_GB_PER_S.get(spec.pcie_gen, 16.0)


def _intra_node_link(spec: GpuSpec, offer: Offer | None) -> str:
    """The fabric :func:`_intra_node_gb_per_s` took its figure from: the offer's link, else
    ``nvlink`` for SXM parts with NVLink, else ``pcie<gen>``."""
    if offer is not None and offer.intra_node_link and offer.intra_node_link != "none":
        return offer.intra_node_link
    if spec.nvlink_gb_per_s and "PCIE" not in spec.name.upper():
        return "nvlink"
    return f"pcie{spec.pcie_gen}" if spec.pcie_gen else "pcie"


def peak_flops_by_precision(spec: GpuSpec) -> dict[str, float]:
    """Dense peak FLOP/s per precision, with the spec's own fallbacks (TF32 → FP32, ...)."""
    peaks = {p: spec.peak_tflops(p) for p in PRECISIONS}  # every one is known: no ValueError
    return {p: float(tflops) * 1e12 for p, tflops in peaks.items() if tflops}


def hardware_for_gpu(spec: GpuSpec, *, gpus_per_node: int, offer: Offer | None = None,
                     inter_node_gbps: float | None = None) -> Hardware:
    """The models' view of ``spec`` in a node of ``gpus_per_node`` GPUs (from ``offer`` if any).

    Intra-node bandwidth: the offer's link, else NVLink (SXM) or PCIe by generation.
    Inter-node: ``inter_node_gbps`` where given, else ``offer.inter_node_gbps`` (Gbit/s →
    bytes/s), else 100 Gbit/s (callers without an offer pass :func:`multi_node_network`'s).
    """
    if inter_node_gbps is not None and inter_node_gbps > 0:
        inter_gbps = float(inter_node_gbps)
    elif offer is not None and offer.inter_node_gbps:
        inter_gbps = offer.inter_node_gbps
    else:
        inter_gbps = DEFAULT_INTER_NODE_GBPS
    return Hardware(
        gpu=spec.name,
        memory_bytes=float(spec.memory_gb) * 1e9,
        memory_bandwidth_bytes_per_s=float(spec.memory_bandwidth_gb_per_s) * 1e9,
        peak_flops_per_s=peak_flops_by_precision(spec),
        intra_node_bytes_per_s=_intra_node_gb_per_s(spec, offer) * 1e9,
        inter_node_bytes_per_s=inter_gbps * 1e9 / 8.0,
        gpus_per_node=int(offer.gpu_count if offer is not None else gpus_per_node),
        tdp_w=float(spec.tdp_w) if spec.tdp_w else None,
        intra_node_link=_intra_node_link(spec, offer),
    )


def hardware_for_offer(spec: GpuSpec, offer: Offer) -> Hardware:
    """The models' view of a plan's node: ``offer``'s machine of ``spec`` GPUs (the
    ``hardware_for`` the search takes)."""
    return hardware_for_gpu(spec, gpus_per_node=offer.gpu_count, offer=offer)


def measured_hardware(observations: Iterable[Observation], catalog: Catalog
                      ) -> dict[str, Hardware]:
    """The models' view of each GPU the runs measured (keyed by the runs' GPU name), in a
    node as large as the largest one measured on that GPU (a smaller node could not hold the
    larger run). CPU runs need none.

    Raises:
        UnknownGpuError: a run measured a GPU the catalog does not know (the model cannot
            place its measurement without the GPU's peaks and links).
    """
    observations = list(observations)
    out: dict[str, Hardware] = {}
    for gpu in dict.fromkeys(o.gpu for o in observations if not is_cpu(o.gpu)):
        per_node = max(max(1, o.gpu_count // max(1, o.nodes))
                       for o in observations if o.gpu == gpu)
        spec = catalog.gpu(gpu)
        # A multi-node run talked over what the catalog's multi-node offers of its GPU give
        # (a run does not record its network).
        out[gpu] = hardware_for_gpu(
            spec, gpus_per_node=per_node,
            inter_node_gbps=multi_node_network(catalog.offers, spec.name).inter_node_gbps)
    return out
