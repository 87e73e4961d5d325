"""Adapter from the catalog's records (``GpuSpec``, ``Offer``) to the models' ``Hardware``.

The only place that decides which link a GPU talks over: the offer's measured/declared
intra-node link when there is an offer, else the spec's NVLink (SXM parts) or its PCIe
generation; the node network from the offer, else a conservative default.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from mlflow_gpuopt.catalog.catalog import Catalog
from mlflow_gpuopt.catalog.schema import PRECISIONS, GpuSpec, Offer
from mlflow_gpuopt.perfmodel.fitting import is_cpu
from mlflow_gpuopt.perfmodel.types import Hardware, Observation

logger = logging.getLogger(__name__)

#: One direction of a x16 slot, GB/s, by PCIe generation (what GPU-to-GPU traffic gets
#: without NVLink).
PCIE_GB_PER_S = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}
#: Node network assumed without an offer to say better: 100 Gbit/s Ethernet.
DEFAULT_INTER_NODE_GBPS = 100.0


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


def peak_flops_by_precision(spec: GpuSpec) -> dict[str, float]:
    """Dense peak FLOP/s per precision, with the spec's own fallbacks (TF32 → FP32, ...)."""
    peaks = {p: spec.peak_tflops(p) for p in PRECISIONS}  # every one is known: no ValueError
    return {p: float(tflops) * 1e12 for p, tflops in peaks.items() if tflops}


def hardware_for_gpu(spec: GpuSpec, *, gpus_per_node: int, offer: Offer | None = None
                     ) -> Hardware:
    """The models' view of ``spec`` in a node of ``gpus_per_node`` GPUs (from ``offer`` if any).

    Intra-node bandwidth: the offer's link, else NVLink (SXM) or PCIe by generation.
    Inter-node: ``offer.inter_node_gbps`` (Gbit/s → bytes/s), else 100 Gbit/s.
    """
    inter_gbps = (offer.inter_node_gbps if offer is not None and offer.inter_node_gbps
                  else DEFAULT_INTER_NODE_GBPS)
    return Hardware(
        gpu=spec.name,
        memory_bytes=float(spec.memory_gb) * 1e9,
        memory_bandwidth_bytes_per_s=float(spec.memory_bandwidth_gb_per_s) * 1e9,
        peak_flops_per_s=peak_flops_by_precision(spec),
        intra_node_bytes_per_s=_intra_node_gb_per_s(spec, offer) * 1e9,
        inter_node_bytes_per_s=inter_gbps * 1e9 / 8.0,
        gpus_per_node=int(offer.gpu_count if offer is not None else gpus_per_node),
    )


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
        out[gpu] = hardware_for_gpu(catalog.gpu(gpu), gpus_per_node=per_node)
    return out
