"""What differs between GPU vendors at the same datasheet figures: AMD Instinct (ROCm, RCCL,
Infinity Fabric) against NVIDIA (CUDA, NCCL, NVLink/NVSwitch).

Data plus three lookups, pure and cheap, for the compute and communication models:

- :func:`gpu_vendor` — ``"amd"`` or ``"nvidia"`` from a catalog GPU name.
- :func:`attainable_fraction` — share of the dense tensor peak that real training GEMMs reach
  on an AMD GPU (``None`` for NVIDIA: the models' own NVIDIA-calibrated efficiency applies).
- :func:`intra_node_link` / :func:`collective_bus_efficiency` — the GPU-to-GPU fabric inside
  a node and the all-reduce bus bandwidth its collective library reaches on it, as a share of
  the fabric's one-direction aggregate (the comm model's ``BUS_EFFICIENCY``, per GPU model).

Sources (read 2026-11-30):

- MI300X Infinity Fabric: 7 links per GPU, 128 GB/s each (64 GB/s each way), fully connecting
  the 8 GPUs of a platform: 896 GB/s per GPU, 448 GB/s one way (AMD MI300X data sheet; ROCm
  docs "AMD Instinct MI300 series microarchitecture"). MI325X: the same seven links.
- RCCL all-reduce on 8 × MI300X: Azure's node health check passes a ND MI300X v5 node at
  **314 GB/s** bus bandwidth for a 16 GB all-reduce (Azure/azurehpc-health-checks
  ``conf/nd96isr_mi300x_v5.conf``: ``check_rccl_allreduce 314 1 16G``) → 314 / 448 = 0.70.
  The same checks pass NCCL on 8 × H100 SXM at **460 GB/s** (``conf/nd96isr_h100_v5.conf``)
  and on 8 × H200 at 431 GB/s (Azure HPC image build script), i.e. ~1.0 of NVLink 4's
  450 GB/s one way: NVSwitch reduces in the switch (NVLS), a full mesh cannot.
- GEMM efficiency: MI300X reaches about **45 %** of its theoretical peak FLOP/s on real AI
  workloads across FP8/BF16/FP16, and about 81 % of its 5.3 TB/s memory bandwidth, where H100
  and B200 sustain up to 93 % of theirs (peer-reviewed measurements as summarised by
  aiweekly.co "AMD MI300X hits only 45% of peak FLOPs in practice", via Yahoo Finance);
  SemiAnalysis "MI300X vs H100 vs H200 Benchmark Part 1: Training" (2024-12) found the same
  gap on public ROCm releases (its GEMM figures, ~620 of 1,307 BF16 TFLOP/s on MI300X, are
  recalled, not re-read). The models' NVIDIA prior is 60 % of the tensor peak
  (``compute.COMPUTE_EFFICIENCY_TENSOR``), so an AMD GPU at 45 % reaches 0.75 of what an NVIDIA
  GPU of the same datasheet would.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

#: Share of the dense tensor peak (BF16/FP16/FP8) real training GEMMs reach on AMD CDNA 3.
AMD_TENSOR_FRACTION_OF_PEAK = 0.45
#: Share of the datasheet HBM bandwidth streaming kernels reach on MI300X.
AMD_MEMORY_FRACTION_OF_PEAK = 0.81
#: RCCL all-reduce bus bandwidth over one-direction Infinity Fabric aggregate (314 / 448).
RCCL_INFINITY_FABRIC_BUS_EFFICIENCY = 314.0 / 448.0

_AMD_PREFIXES = ("MI",)


@dataclass(frozen=True)
class IntraNodeLink:
    """The GPU-to-GPU fabric of one GPU model inside a node."""

    kind: str  # "infinity_fabric" | "nvswitch" (catalog ``intra_node_link`` values)
    links_per_gpu: int
    link_gb_per_s_each_way: float  # one direction of one link
    collective: str  # "rccl" | "nccl"
    # measured all-reduce bus bandwidth / one-direction aggregate; None where not measured here
    bus_efficiency: float | None
    source: str

    @property
    def aggregate_gb_per_s_each_way(self) -> float:
        """Sum over the GPU's links, one direction (what a ring or mesh all-reduce can use)."""
        return self.links_per_gpu * self.link_gb_per_s_each_way


_MI300_FABRIC = IntraNodeLink(
    "infinity_fabric", 7, 64.0, "rccl", RCCL_INFINITY_FABRIC_BUS_EFFICIENCY,
    "AMD MI300X data sheet (7 x 128 GB/s); RCCL 314 GB/s busbw, azurehpc-health-checks "
    "conf/nd96isr_mi300x_v5.conf")

INTRA_NODE_LINKS: dict[str, IntraNodeLink] = {
    "MI300X": _MI300_FABRIC,
    "MI325X": IntraNodeLink(
        "infinity_fabric", 7, 64.0, "rccl", RCCL_INFINITY_FABRIC_BUS_EFFICIENCY,
        "seven 128 GB/s Infinity Fabric links as MI300X (AMD MI325X platform); RCCL bus "
        "efficiency taken equal to MI300X's (same fabric, not measured here)"),
    "MI250X": IntraNodeLink(
        "infinity_fabric", 8, 50.0, "rccl", None,
        "8 x 100 GB/s Infinity Fabric (AMD MI250X product page, recalled); bus efficiency "
        "not measured here"),
    "H100-SXM5-80GB": IntraNodeLink(
        "nvswitch", 18, 25.0, "nccl", 460.0 / 450.0,
        "NVLink 4 18 x 50 GB/s; NCCL 460 GB/s busbw, azurehpc-health-checks "
        "conf/nd96isr_h100_v5.conf"),
    "H200-SXM-141GB": IntraNodeLink(
        "nvswitch", 18, 25.0, "nccl", 431.0 / 450.0,
        "NVLink 4 18 x 50 GB/s; NCCL 431 GB/s busbw threshold for ND H200 v5 (Azure HPC "
        "image build's health-check settings)"),
}


@functools.lru_cache(maxsize=256)  # pure; asked several times for every plan of a search
def gpu_vendor(gpu: str) -> str:
    """``"amd"`` for AMD Instinct parts (catalog names ``MI…``), else ``"nvidia"``."""
    name = gpu.strip().upper()
    if name.startswith("AMD") or name.startswith(_AMD_PREFIXES):
        return "amd"
    return "nvidia"


def is_amd(gpu: str) -> bool:
    """Whether ``gpu`` (a catalog name) is an AMD GPU, run through ROCm/HIP and RCCL."""
    return gpu_vendor(gpu) == "amd"


def attainable_fraction(gpu: str) -> float | None:
    """Share of the dense tensor peak real training GEMMs reach on ``gpu``, where it differs
    from the NVIDIA-calibrated prior (``None``: use the prior's own efficiency)."""
    return AMD_TENSOR_FRACTION_OF_PEAK if is_amd(gpu) else None


def attainable_memory_fraction(gpu: str) -> float | None:
    """Share of datasheet memory bandwidth streaming kernels reach, where measured for this
    vendor (``None``: use the prior's own)."""
    return AMD_MEMORY_FRACTION_OF_PEAK if is_amd(gpu) else None


def relative_to_nvidia(gpu: str, nvidia_tensor_efficiency: float) -> float:
    """Factor on an NVIDIA-calibrated tensor efficiency for ``gpu``: 1 for NVIDIA, 0.45 / 0.6
    = 0.75 for AMD at the models' 0.6 prior. For carrying a measured compute scale from one
    vendor's GPU to the other's."""
    frac = attainable_fraction(gpu)
    return 1.0 if frac is None else frac / nvidia_tensor_efficiency


def intra_node_link(gpu: str) -> IntraNodeLink | None:
    """The GPU-to-GPU fabric of ``gpu`` inside a node, where known here."""
    return INTRA_NODE_LINKS.get(gpu)


def collective_bus_efficiency(gpu: str, default: float) -> float:
    """All-reduce bus bandwidth / one-direction link aggregate for ``gpu`` (measured, see
    module sources); ``default`` where not measured here. On AMD without a measurement the
    MI300X's RCCL figure applies (same library, same kind of mesh)."""
    link = intra_node_link(gpu)
    if link is not None and link.bus_efficiency is not None:
        return link.bus_efficiency
    if is_amd(gpu):
        return RCCL_INFINITY_FABRIC_BUS_EFFICIENCY
    return default
