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
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


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
    spot_price_per_hour_usd: float | None  # None where no spot/preemptible is sold
    billing_increment_s: int  # 1 = per-second billing
    billing_minimum_s: int  # e.g. 60 on AWS/GCP
    intra_node_link: str  # "nvswitch" | "nvlink" | "pcie3" | "pcie4" | "pcie5" | "none"
    intra_node_gb_per_s: float  # GPU-to-GPU bandwidth per GPU inside a node, GB/s
    inter_node_gbps: float  # node network, Gbit/s (0 where multi-node is not offered)
    inter_node_rdma: bool  # EFA / InfiniBand / GPUDirect-TCPX
    max_nodes: int  # 1 where the provider offers no multi-node (Colab)
    pricing: str  # "on_demand" | "compute_units"
    compute_units_per_hour: float | None  # Colab only
    usd_per_compute_unit: float | None  # Colab only
    max_session_hours: float | None  # Colab session cap; None = unlimited
    gpu_guaranteed: bool  # False on Colab
    as_of: str  # ISO date the price was read
    source: str  # where the price was read

    @property
    def price_per_gpu_hour_usd(self) -> float:
        """On-demand $ per GPU-hour."""
        return self.price_per_hour_usd / self.gpu_count
