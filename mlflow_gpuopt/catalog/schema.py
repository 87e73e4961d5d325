"""The catalog's record types: one GPU's datasheet figures and one rentable offer.

Declared once, with a version, so the shipped snapshot, a user's refreshed cache and every
refresher agree on the columns. Units are in the field names.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bump when a column is added, removed or changes meaning.
CATALOG_SCHEMA_VERSION = 1

#: Precisions the models and the catalog know, in the order a user would write them.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures for one GPU model (dense, not sparse, tensor throughput).

    ``name`` is the catalog's canonical name (e.g. ``A100-40GB-SXM4``); every other spelling
    goes through :func:`mlflow_gpuopt.catalog.resolve_gpu`.
    """

    name: str
    memory_gb: float  # per GPU, GB (1e9 bytes)
    memory_bandwidth_gb_per_s: float  # HBM/GDDR bandwidth, GB/s
    fp32_tflops: float  # dense non-tensor FP32
    tf32_tflops: float | None  # dense TF32 tensor; None where the GPU has no TF32
    fp16_tflops: float  # dense FP16 tensor (FP32 accumulate)
    bf16_tflops: float | None  # dense BF16 tensor; None where the GPU has no BF16
    fp8_tflops: float | None  # dense FP8 tensor; None where the GPU has no FP8
    nvlink_gb_per_s: float  # total NVLink bandwidth per GPU (GB/s), 0 without NVLink
    pcie_gen: int
    tdp_w: float
    source: str
    verification: str = ""  # how the figures were checked (which are recalled, derived, read)

    def peak_tflops(self, precision: str) -> float:
        """Dense peak TFLOP/s for ``precision``, falling back the way the hardware does.

        TF32 falls back to FP32 on GPUs without TF32 (V100, T4); BF16 to FP16 rate is not
        assumed: a GPU without BF16 runs bf16 autocast at FP32 rate.
        """
        p = precision.lower()
        if p == "fp32":
            return self.fp32_tflops
        if p == "tf32":
            return self.tf32_tflops or self.fp32_tflops
        if p == "fp16":
            return self.fp16_tflops
        if p == "bf16":
            return self.bf16_tflops or self.fp32_tflops
        if p == "fp8":
            return self.fp8_tflops or self.bf16_tflops or self.fp16_tflops
        raise ValueError(
            f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


@dataclass(frozen=True)
class Offer:
    """One rentable machine shape at one provider and region, priced per hour.

    Colab is modelled as an offer too: ``pricing == "compute_units"`` with
    ``compute_units_per_hour`` × ``usd_per_compute_unit`` giving ``price_per_hour_usd``,
    ``max_nodes == 1``, ``max_session_hours`` set and ``gpu_guaranteed`` false.
    """

    provider: str  # aws | gcp | lambda | azure | colab
    instance_type: str
    region: str
    gpu: str  # canonical GpuSpec.name
    gpu_count: int  # GPUs per node
    gpu_memory_gb: float  # per GPU
    vcpus: int
    memory_gb: float  # host RAM per node
    price_per_hour_usd: float  # on-demand, whole node
    spot_price_per_hour_usd: float | None  # None where no spot is sold or it was not read
    billing_increment_s: int  # 1 = per-second billing
    billing_minimum_s: int  # e.g. 60 on AWS/GCP
    # "nvswitch" | "nvlink" | "infinity_fabric" (AMD's xGMI GPU mesh) | "pcie3" | "pcie4" |
    # "pcie5" | "none"
    intra_node_link: str
    # GPU-to-GPU bandwidth per GPU inside a node, GB/s, total bidirectional (the convention of
    # NVIDIA's headline figures: A100 NVLink 600, H100 900; PCIe 4.0 x16 = 64); 0 on 1-GPU nodes.
    intra_node_gb_per_s: float
    inter_node_gbps: float  # node network, Gbit/s (0 where multi-node is not offered)
    inter_node_rdma: bool  # EFA / InfiniBand / GPUDirect-TCPX
    max_nodes: int  # 1 where the provider offers no multi-node (Colab)
    pricing: str  # "on_demand" | "compute_units"
    compute_units_per_hour: float | None  # Colab only
    usd_per_compute_unit: float | None  # Colab only
    max_session_hours: float | None  # Colab session cap; None = unlimited
    gpu_guaranteed: bool  # False on Colab
    as_of: str  # ISO date the price was read
    source: str  # where the price was read; starts with "estimated:" where not read from a source
    # Lambda: regions that had capacity when the price was fetched; None = not known (snapshot).
    regions_with_capacity: tuple[str, ...] | None = None
    subscription_usd_per_month: float | None = None  # Colab Pro/Pro+ monthly fee; None = PAYG
    compute_units_per_month: float | None = None  # compute units the subscription includes

    @property
    def price_per_gpu_hour_usd(self) -> float:
        """On-demand $ per GPU-hour."""
        return self.price_per_hour_usd / self.gpu_count

    @property
    def spot_price_per_gpu_hour_usd(self) -> float | None:
        """Spot $ per GPU-hour, None where no spot is sold."""
        if self.spot_price_per_hour_usd is None:
            return None
        return self.spot_price_per_hour_usd / self.gpu_count

    @property
    def total_gpu_memory_gb(self) -> float:
        """GPU memory of the whole node, GB (``gpu_count`` × ``gpu_memory_gb``; not host RAM)."""
        return self.gpu_count * self.gpu_memory_gb

    @property
    def is_estimate(self) -> bool:
        """True where the price was not read from a price source but estimated (see ``source``)."""
        return self.source.lower().startswith("estimated")


#: Providers the catalog knows, in display order.
PROVIDERS = ("aws", "gcp", "lambda", "azure", "colab")

#: Allowed values of ``Offer.intra_node_link``.
INTRA_NODE_LINKS = ("nvswitch", "nvlink", "pcie3", "pcie4", "pcie5", "none", "infinity_fabric")

#: Intra-node links that connect every GPU of a node to every other at NVLink-class speed
#: (what tensor parallelism inside a node needs).
FAST_INTRA_NODE_LINKS = ("nvswitch", "nvlink", "infinity_fabric")

#: Allowed values of ``Offer.pricing``.
PRICING_KINDS = ("on_demand", "compute_units")

#: Prices above this ($ per GPU-hour) are treated as a parsing error, not a price.
MAX_USD_PER_GPU_HOUR = 1000.0

#: Columns of ``pricing/gpus.csv``, in file order (the ``GpuSpec`` fields).
GPU_COLUMNS = (
    "name", "memory_gb", "memory_bandwidth_gb_per_s", "fp32_tflops", "tf32_tflops",
    "fp16_tflops", "bf16_tflops", "fp8_tflops", "nvlink_gb_per_s", "pcie_gen", "tdp_w",
    "source", "verification",
)

#: Columns of every ``pricing/<provider>.csv`` (the ``Offer`` fields plus
#: ``total_gpu_memory_gb``, which is checked against ``gpu_count`` × ``gpu_memory_gb``).
OFFER_COLUMNS = (
    "provider", "instance_type", "region", "gpu", "gpu_count", "gpu_memory_gb",
    "total_gpu_memory_gb", "vcpus", "memory_gb", "price_per_hour_usd", "spot_price_per_hour_usd",
    "billing_increment_s", "billing_minimum_s", "intra_node_link", "intra_node_gb_per_s",
    "inter_node_gbps", "inter_node_rdma", "max_nodes", "pricing", "compute_units_per_hour",
    "usd_per_compute_unit", "max_session_hours", "gpu_guaranteed", "subscription_usd_per_month",
    "compute_units_per_month", "regions_with_capacity", "as_of", "source",
)
