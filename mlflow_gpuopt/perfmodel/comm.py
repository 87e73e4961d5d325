"""Communication time: ring collectives (NCCL), per-strategy volumes, tensor-parallel
all-reduces, pipeline point-to-point and bubble, and Pollux's overlap with compute.

All times are seconds; bandwidths bytes/s, one direction, per GPU unless named otherwise.

Across nodes, NCCL picks per call the fastest of its algorithms (its tuner); two are modelled
and the faster is taken (:func:`dp_allreduce_s`):

- a flat ring through every rank, NVLink inside a node and the network between nodes
  (``t = 2(n−1)/n·S/B + 2(n−1)·α``, nccl-tests ``doc/PERFORMANCE.md``;
  ``shared/reference/models.md`` 5.4);
- hierarchical, as NCCL runs it on NVLink + network systems (NCCL's ``CollNet``/``NVLS``
  tree and PXN paths, and Horovod/BlueConnect's hierarchical all-reduce): reduce-scatter
  inside the node over NVLink, an all-reduce of 1/r of the data between nodes (ring, or the
  double binary tree with ``2·⌈log2 n⌉`` latency steps, models.md 5.3), all-gather inside.

The network is multi-rail where the provider gives one NIC per GPU (AWS p5: 32 × 100 Gbit/s
EFA = 8 × 400; Azure ND H100 v5 and GCP a3-ultra: 8 × 400 Gbit/s): every GPU sends on its own
NIC, so a GPU's inter-node bandwidth is the node's network / GPUs per node while all GPUs of
the node communicate at once (as they do in a data-parallel step, one ring or sub-group per
GPU), and a single ring that crosses the network uses all of them as NCCL's channels.
"""

from __future__ import annotations

import math

from mlflow_gpuopt.perfmodel import vendor
from mlflow_gpuopt.perfmodel.layout import SHARDED_PARAMS, Layout
from mlflow_gpuopt.perfmodel.types import Hardware

#: Bus bandwidth NCCL reaches as a share of the link's datasheet figure (nccl-tests busbw).
BUS_EFFICIENCY = 0.75
#: Per ring step latency inside a node (NVLink/PCIe) and across nodes.
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 20e-6
#: Share of the SMs the overlapped tensor-parallel communication kernels hold while they run,
#: slowing the GEMMs beneath them: NeMo's H100 userbuffers configurations give the pipelined and
#: bulk overlaps 16-24 of the 132 SMs (``num_sm``, with ``set_sm_margin``) and the ring
#: exchanges one (NVIDIA/NeMo ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``,
#: e.g. ``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192``): 16 / 132.
TP_OVERLAP_SM_SHARE = 16.0 / 132.0
#: Pollux's overlap exponent prior: 1 = communication adds to compute, large = fully hidden.
GAMMA_PRIOR = 2.0
#: Compute time lost per doubling of data-parallel replicas to stragglers, synchronisation
#: jitter and input-pipeline contention (Pollux's "retrogression"); set from the spread of
#: NVIDIA's published 8-GPU weak-scaling efficiencies (84-99%, reference/models.md 5.5).
SYNC_OVERHEAD_PER_DOUBLING = 0.02
#: Volume of one data-parallel synchronisation relative to an all-reduce of the gradients:
#: DDP and ZeRO-1/2 move 2Ψ (reduce-scatter + all-gather); ZeRO-3/FSDP 3Ψ (parameters are
#: all-gathered again for the backward pass).
STRATEGY_VOLUME = {"single": 0.0, "ddp": 1.0, "zero1": 1.0, "zero2": 1.0, "zero3": 1.5,
                   "fsdp": 1.5}


def intra_bus_efficiency(hardware: Hardware) -> float:
    """All-reduce bus bandwidth over the intra-node fabric's datasheet figure for
    ``hardware``'s GPU: RCCL's measured share on AMD Infinity Fabric
    (:func:`.vendor.collective_bus_efficiency`, 0.70 on MI300X: a full mesh cannot reduce in
    a switch), ``BUS_EFFICIENCY`` on NVIDIA. The NCCL health-check figures vendor.py lists for
    H100/H200 NVSwitch (~1.0, NVLS) are not applied: the NVIDIA models were calibrated on 0.75.
    """
    if vendor.is_amd(hardware.gpu):
        return vendor.collective_bus_efficiency(hardware.gpu, BUS_EFFICIENCY)
    return BUS_EFFICIENCY


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth_bytes_per_s: float,
                     latency_s: float = INTRA_NODE_LATENCY_S) -> float:
    """Ring all-reduce: ``2(n−1)/n · bytes / bw + 2(n−1)·α`` (nccl-tests PERFORMANCE.md)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (2.0 * (ranks - 1) / ranks * nbytes / bandwidth_bytes_per_s
            + 2.0 * (ranks - 1) * latency_s)


def tree_allreduce_s(nbytes: float, ranks: int, bandwidth_bytes_per_s: float,
                     latency_s: float = INTER_NODE_LATENCY_S) -> float:
    """NCCL's double binary tree all-reduce: each half of the data goes up (reduce) and down
    (broadcast) one binary tree, so the bandwidth term equals the ring's ``2·S/B`` at large
    ``n`` while latency grows with ``2·⌈log2 n⌉·α`` instead of ``2(n−1)·α``."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * nbytes / bandwidth_bytes_per_s + 2.0 * math.ceil(math.log2(ranks)) * latency_s


def nic_bytes_per_s_per_gpu(hardware: Hardware) -> float:
    """One GPU's share of the node network when every GPU of the node communicates at once
    (multi-rail: its own NIC; one shared NIC: the same share of it)."""
    return hardware.inter_node_bytes_per_s / max(1, hardware.gpus_per_node)


def hierarchical_allreduce_s(nbytes: float, layout: Layout, hardware: Hardware) -> float:
    """Reduce-scatter over NVLink among the ``r`` ranks of the group in one node, all-reduce of
    ``S/r`` between the ``dp/r`` nodes (ring or tree, whichever is faster) on each GPU's share
    of the network, then all-gather over NVLink."""
    r = max(1, layout.dp_ranks_per_node)
    n_nodes = max(1, layout.dp // r)
    intra = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware)
    nic = nic_bytes_per_s_per_gpu(hardware) * BUS_EFFICIENCY
    inside = 0.0
    if r > 1:
        inside = 2.0 * ((r - 1) / r * nbytes / intra + (r - 1) * INTRA_NODE_LATENCY_S)
    part = nbytes / r
    between = min(ring_allreduce_s(part, n_nodes, nic, INTER_NODE_LATENCY_S),
                  tree_allreduce_s(part, n_nodes, nic, INTER_NODE_LATENCY_S))
    return inside + between


def dp_allreduce_s(nbytes: float, layout: Layout, hardware: Hardware) -> float:
    """All-reduce of ``nbytes`` over the data-parallel group: a ring inside one node; across
    nodes the faster of the flat ring and the hierarchical algorithm (NCCL's tuner)."""
    if layout.dp <= 1 or nbytes <= 0:
        return 0.0
    bw, lat = dp_link(hardware, layout)
    flat = ring_allreduce_s(nbytes, layout.dp, bw, lat)
    if not layout.dp_spans_nodes:
        return flat
    return min(flat, hierarchical_allreduce_s(nbytes, layout, hardware))


def dp_link(hardware: Hardware, layout: Layout) -> tuple[float, float]:
    """Effective (bandwidth, latency) of the data-parallel ring.

    Inside one node: the GPU's NVLink/NVSwitch or PCIe share. Spanning nodes: the slowest
    link bounds the ring, and a node's network is shared by the GPUs in it that run different
    rings at once (``gpus_per_node / dp_ranks_per_node`` of them).
    """
    intra = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware)
    if not layout.dp_spans_nodes:
        return intra, INTRA_NODE_LATENCY_S
    concurrent = max(1, hardware.gpus_per_node // max(1, layout.dp_ranks_per_node))
    inter = hardware.inter_node_bytes_per_s * BUS_EFFICIENCY / concurrent
    return min(intra, inter), INTER_NODE_LATENCY_S


def grad_comm_bytes_per_param(precision_mixed: bool, dp_strategy: str) -> int:
    """Bytes per gradient element on the wire: DeepSpeed/FSDP reduce 16-bit gradients in mixed
    precision; PyTorch DDP under autocast keeps fp32 parameters, so fp32 gradients."""
    if precision_mixed and dp_strategy in ("zero1", "zero2", "zero3", "fsdp"):
        return 2
    return 4


def dp_sync_s(params_per_replica: float, bytes_per_param: int, layout: Layout,
              hardware: Hardware) -> float:
    """One data-parallel synchronisation of the gradients of one model shard.

    DDP/ZeRO-1/2: an all-reduce's volume; ZeRO-3/FSDP: 1.5× (``STRATEGY_VOLUME``); the
    all-reduce as NCCL runs it (:func:`dp_allreduce_s`).
    """
    if layout.dp <= 1:
        return 0.0
    volume = STRATEGY_VOLUME.get(layout.dp_strategy, 1.0)
    return volume * dp_allreduce_s(params_per_replica * bytes_per_param, layout, hardware)


def sharded_params(layout: Layout) -> bool:
    """ZeRO-3/FSDP gather parameters on every micro-step, so accumulation does not hide it."""
    return layout.dp_strategy in SHARDED_PARAMS


def tp_allreduce_s(num_layers: int, micro_batch: float, seq_len: float, hidden: float,
                   act_bytes: int, tp: int, hardware: Hardware) -> float:
    """Megatron tensor parallel: 2 all-reduces of ``b·s·h`` activations per layer in forward
    and 2 in backward, over ``tp`` GPUs inside one node (exposed: they sit on the critical
    path between matmuls)."""
    if tp <= 1:
        return 0.0
    nbytes = micro_batch * seq_len * hidden * act_bytes
    bw = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware)
    return 4.0 * num_layers * ring_allreduce_s(nbytes, tp, bw, INTRA_NODE_LATENCY_S)


def tp_exposed_s(t_tp: float, t_compute: float, tp: int, overlap: bool | None) -> float:
    """Seconds a micro-step's tensor-parallel communication ``t_tp`` adds next to ``t_compute``
    seconds of its GEMMs.

    Without overlap all of it (each collective waits for its GEMM and the next GEMM waits for
    it). With overlap (Transformer Engine's userbuffers under Megatron / NeMo
    ``tp_comm_overlap``, torchtitan's async TP) each collective of sequence parallelism is
    split into ``tp`` chunks, chunk i's transfer running under chunk i−1's GEMM (ring exchange,
    pipelined all-gather-matmul / matmul-reduce-scatter): the first chunk stays exposed, and
    what the GEMMs cannot cover adds. The hidden part is not free: the communication kernels
    hold ``TP_OVERLAP_SM_SHARE`` of the SMs while they run, and the GEMMs under them slow by
    that share (docs/models.md#communication-commpy).
    """
    if t_tp <= 0:
        return 0.0
    if not overlap or tp <= 1:
        return t_tp
    hidden = min(t_tp * (1.0 - 1.0 / tp), t_compute)
    return t_tp - hidden + TP_OVERLAP_SM_SHARE * hidden


def pp_p2p_s(boundary_bytes: float, layout: Layout, hardware: Hardware) -> float:
    """One micro-batch crossing one stage boundary, forward activation plus backward
    gradient, on the node network when stages span nodes."""
    if layout.pp <= 1:
        return 0.0
    if layout.pp_spans_nodes:
        bw = nic_bytes_per_s_per_gpu(hardware) * BUS_EFFICIENCY
        lat = INTER_NODE_LATENCY_S
    else:
        bw = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware)
        lat = INTRA_NODE_LATENCY_S
    return 2.0 * (boundary_bytes / bw + lat)


def overlap_s(compute_s: float, comm_s: float, gamma: float) -> float:
    """Pollux: ``(T_grad^γ + T_comm^γ)^(1/γ)``; γ = 1 adds them, γ → ∞ takes the max."""
    if comm_s <= 0:
        return compute_s
    if compute_s <= 0:
        return comm_s
    hi = max(compute_s, comm_s)
    lo = min(compute_s, comm_s)
    return hi * (1.0 + (lo / hi) ** gamma) ** (1.0 / gamma)


def sync_overhead_s(micro_step_s: float, dp: int) -> float:
    """Time lost to stragglers and synchronisation once per step: a share of one micro-step
    per doubling of the replica count."""
    if dp <= 1:
        return 0.0
    return SYNC_OVERHEAD_PER_DOUBLING * math.log2(dp) * micro_step_s
