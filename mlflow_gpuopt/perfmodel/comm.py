"""Communication time: ring collectives (NCCL), per-strategy volumes, bus bandwidth per
fabric class (NVLink/NVSwitch, PCIe, Infinity Fabric), tensor-parallel all-reduces, pipeline
point-to-point and bubble, and the overlap with compute: data-parallel collectives bucket by
bucket under the backward as DDP and FSDP issue them (:func:`ddp_exposed_s`,
:func:`fsdp_exposed_s`), a pipeline's by Pollux's overlap (:func:`overlap_s`).

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

#: Bus bandwidth NCCL reaches as a share of the link's datasheet figure (nccl-tests busbw),
#: on NVLink / NVSwitch and on the node network.
BUS_EFFICIENCY = 0.75
#: The same share on GPUs that talk over PCIe (no NVLink: L4, A10G, RTX cards, PCIe
#: A100/H100 without bridges), by ring size: the traffic crosses the PCIe switches and the
#: CPUs' root complexes, and "on PCI systems, the performance you get is usually determined
#: by the bandwidth your CPU and memory can deliver" (NCCL's maintainer, NVIDIA/nccl#1639):
#: 8 × RTX 5090 on PCIe 5.0 x16 (64 GB/s each way) reach 28 GB/s all-reduce bus bandwidth
#: with 8 GPUs and 35 GB/s with 4 (same issue): 0.44 and 0.55 of the slot.
PCIE_BUS_EFFICIENCY = {4: 35.0 / 64.0, 8: 28.0 / 64.0}
#: Per ring step latency inside a node (NVLink/PCIe) and across nodes.
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 20e-6
#: Share of the SMs the overlapped tensor-parallel communication kernels hold while they run,
#: slowing the GEMMs beneath them: NeMo's H100 userbuffers configurations give the pipelined and
#: bulk overlaps 16-24 of the 132 SMs (``num_sm``, with ``set_sm_margin``) and the ring
#: exchanges one (NVIDIA/NeMo ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``,
#: e.g. ``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192``): 16 / 132.
TP_OVERLAP_SM_SHARE = 16.0 / 132.0
#: Pollux's overlap exponent prior (a pipeline's data-parallel traffic): 1 = communication
#: adds to compute, large = fully hidden.
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


def intra_bus_efficiency(hardware: Hardware, ranks: int | None = None) -> float:
    """All-reduce bus bandwidth over the intra-node fabric's datasheet figure for
    ``hardware``'s GPU, per fabric class (``Hardware.intra_node_link``): RCCL's measured share
    on AMD Infinity Fabric (:func:`.vendor.collective_bus_efficiency`, 0.70 on MI300X: a full
    mesh cannot reduce in a switch); on PCIe ``PCIE_BUS_EFFICIENCY`` for a ring of ``ranks``
    (default: the node's GPUs; 0.55 up to 4, 0.44 beyond); ``BUS_EFFICIENCY`` on NVLink /
    NVSwitch. The NCCL health-check figures vendor.py lists for H100/H200 NVSwitch (~1.0,
    NVLS) are not applied: the NVIDIA models were calibrated on 0.75."""
    if vendor.is_amd(hardware.gpu):
        return vendor.collective_bus_efficiency(hardware.gpu, BUS_EFFICIENCY)
    if hardware.intra_node_link.startswith("pcie"):
        n = ranks if ranks is not None else hardware.gpus_per_node
        return PCIE_BUS_EFFICIENCY[4] if n <= 4 else PCIE_BUS_EFFICIENCY[8]
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
    intra = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware, r)
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


#: The routed experts' share of a data-parallel synchronisation: (their bytes on one GPU, the
#: layout of the expert data-parallel group that reduces them, :func:`.moe.expert_sync`).
Experts = tuple[float, Layout]


def experts_allreduce_s(experts: Experts | None, hardware: Hardware) -> float:
    """All-reduce time of the routed experts' bytes over their own group
    (:func:`dp_allreduce_s` on its layout; 0 without them). A synchronisation adds it to the
    dense part's: both groups share the node's NICs, so they run one after the other."""
    return 0.0 if experts is None else dp_allreduce_s(experts[0], experts[1], hardware)


def _syncs(layout: Layout, nbytes: float, experts: Experts | None) -> bool:
    """Whether a synchronisation moves anything: dense bytes over two or more replicas, or
    experts over two or more expert data-parallel ranks."""
    return ((layout.dp > 1 and nbytes > 0)
            or (experts is not None and experts[1].dp > 1 and experts[0] > 0))


def dp_link(hardware: Hardware, layout: Layout) -> tuple[float, float]:
    """Effective (bandwidth, latency) of the data-parallel ring.

    Inside one node: the GPU's NVLink/NVSwitch or PCIe share. Spanning nodes: the slowest
    link bounds the ring, and a node's network is shared by the GPUs in it that run different
    rings at once (``gpus_per_node / dp_ranks_per_node`` of them).
    """
    intra = hardware.intra_node_bytes_per_s * intra_bus_efficiency(
        hardware, max(1, layout.dp_ranks_per_node))
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


def fp8_gather_scale(params: float, unsharded_fp8_params: float) -> float:
    """Bytes of a ZeRO-3/FSDP parameter all-gather relative to bf16 when the
    ``unsharded_fp8_params`` of ``params`` (the FP8 linear layers' weights) are gathered in
    FP8, 1 byte instead of 2 (torchao ``enable_fsdp_float8_all_gather``: each rank casts its
    shard before the gather); the rest (embeddings, the output projection torchtitan leaves
    out of float8, norms) stays bf16. The gradients' reduce-scatters are not scaled."""
    if params <= 0:
        return 1.0
    share = min(1.0, max(0.0, unsharded_fp8_params / params))
    return 1.0 - 0.5 * share


def dp_sync_s(params_per_replica: float, bytes_per_param: int, layout: Layout,
              hardware: Hardware, gather_scale: float = 1.0,
              experts: Experts | None = None) -> float:
    """One data-parallel synchronisation of the gradients of one model shard.

    DDP/ZeRO-1/2: an all-reduce's volume; ZeRO-3/FSDP: 1.5× (``STRATEGY_VOLUME``): a
    reduce-scatter (0.5) and two all-gathers (1.0, times ``gather_scale``,
    :func:`fp8_gather_scale`); the all-reduce as NCCL runs it (:func:`dp_allreduce_s`).
    ``experts``: the routed experts' bytes (their parameters are not in
    ``params_per_replica``) on their own group (:func:`experts_allreduce_s`; not gathered in
    FP8).
    """
    nbytes = params_per_replica * bytes_per_param
    if not _syncs(layout, nbytes, experts):
        return 0.0
    volume = STRATEGY_VOLUME.get(layout.dp_strategy, 1.0)
    dense = volume
    if layout.dp_strategy in SHARDED_PARAMS:
        dense = 0.5 + (volume - 0.5) * gather_scale
    return (dense * dp_allreduce_s(nbytes, layout, hardware)
            + volume * experts_allreduce_s(experts, hardware))


def sharded_params(layout: Layout) -> bool:
    """ZeRO-3/FSDP gather parameters on every micro-step, so accumulation does not hide it."""
    return layout.dp_strategy in SHARDED_PARAMS


#: torchao float8 recipes whose tensor-parallel all-gathers carry FP8 (1 byte per element):
#: torchtitan applies ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` /
#: ``PrepareFloat8ModuleInput`` (torchao ``float8/float8_tensor_parallel.py``) only for
#: tensor-wise scaling ("float8 all-gather with TP is only supported for tensorwise float8
#: scaling recipes. For rowwise recipes, we use regular TP and all-gather happens in high
#: precision", torchtitan ``parallelize.py``).
FP8_TP_GATHER_RECIPES = frozenset({"tensorwise"})


def tp_gather_element_bytes(precision: str, fp8_recipe: str, act_bytes: float) -> float:
    """Bytes per element of the sequence-parallel all-gathers (the forward's inputs of the
    column-parallel layers, the backward's output gradients of the row-parallel ones):
    1 under torchao tensor-wise FP8, which casts them before gathering; ``act_bytes``
    otherwise. ``fp8_recipe`` normalised (``compute.normalize_fp8_recipe``). The
    reduce-scatters (the row-parallel outputs, the column-parallel input gradients) sum
    partial results in high precision and stay at ``act_bytes``. Transformer Engine (``te``)
    is kept at ``act_bytes``: ``GENERATION_MFU``'s Hopper FP8 figure was derived on its rows
    with 16-bit collectives (docs/models.md#communication-commpy)."""
    if precision == "fp8" and fp8_recipe in FP8_TP_GATHER_RECIPES:
        return 1.0
    return act_bytes


def tp_allreduce_s(num_layers: int, micro_batch: float, seq_len: float, hidden: float,
                   act_bytes: float, tp: int, hardware: Hardware,
                   gather_bytes: float | None = None) -> float:
    """Megatron tensor parallel: 2 all-reduces of ``b·s·h`` activations per layer in forward
    and 2 in backward, over ``tp`` GPUs inside one node (exposed: they sit on the critical
    path between matmuls). Under sequence parallelism each is an all-gather and a
    reduce-scatter of equal volume; ``gather_bytes`` (default ``act_bytes``) is the
    all-gathers' element size (:func:`tp_gather_element_bytes`), so each all-reduce moves
    ``b·s·h·(gather_bytes + act_bytes)/2`` bytes' worth."""
    if tp <= 1:
        return 0.0
    gather = act_bytes if gather_bytes is None else gather_bytes
    nbytes = micro_batch * seq_len * hidden * 0.5 * (gather + act_bytes)
    bw = hardware.intra_node_bytes_per_s * intra_bus_efficiency(hardware, tp)
    return 4.0 * num_layers * ring_allreduce_s(nbytes, tp, bw, INTRA_NODE_LATENCY_S)


def alltoall_s(nbytes: float, ranks: int, ranks_in_node: int, hardware: Hardware) -> float:
    """One all-to-all in which each of ``ranks`` GPUs sends ``nbytes`` in all, an equal part
    to every other rank: the parts for the ``ranks_in_node − 1`` peers in its node go over
    NVLink-class links, the rest over the node's network (each GPU its NIC share), both at
    once; the slower sets the time, plus one latency per peer group. Expert parallelism's
    dispatch and combine (docs/models.md#mixture-of-experts)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    local = max(1, min(ranks, ranks_in_node))
    part = nbytes / (ranks - 1)
    intra = part * (local - 1) / (hardware.intra_node_bytes_per_s
                                  * intra_bus_efficiency(hardware))
    if local == ranks:
        return INTRA_NODE_LATENCY_S + intra
    inter = part * (ranks - local) / nic_bytes_per_s_per_gpu(hardware)
    return INTER_NODE_LATENCY_S + max(intra, inter)


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


#: Spellings of ``Workload.tp_overlap`` -> the canonical word: Transformer Engine's
#: userbuffers (Megatron / NeMo) or PyTorch's async TP over symmetric memory (torchtitan).
_TP_OVERLAP_ALIASES = {"userbuffers": "userbuffers", "ub": "userbuffers", "te": "userbuffers",
                       "transformer_engine": "userbuffers", "symm_mem": "symm_mem",
                       "symmetric_memory": "symm_mem", "async_tp": "symm_mem",
                       "asynctp": "symm_mem", "torch": "symm_mem"}


def normalize_tp_overlap(name: str | None) -> str:
    """``userbuffers`` or ``symm_mem`` from the usual spellings (None: userbuffers)."""
    if name is None or not str(name).strip():
        return "userbuffers"
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    if key not in _TP_OVERLAP_ALIASES:
        raise ValueError(f"unknown tp_overlap {name!r}; expected userbuffers (Transformer "
                         "Engine) or symm_mem (PyTorch async TP)")
    return _TP_OVERLAP_ALIASES[key]


def pipelined_exposed_s(comm_s: float, gemm_s: float, tp: int,
                        kind: str = "userbuffers") -> float:
    """Seconds one overlapped collective of ``comm_s`` adds next to the GEMM it is fused with
    (``gemm_s``), split into ``tp`` chunks. Only the collective's own GEMM covers it: an
    all-gather-matmul pipelines the gathered input's chunks into that matmul, a
    matmul-reduce-scatter the matmul's output chunks into the scatter.

    ``userbuffers`` (Transformer Engine): chunk i's transfer under chunk i−1's GEMM, the first
    chunk exposed, what the GEMM cannot cover adds, and the hidden part costs the GEMM
    ``TP_OVERLAP_SM_SHARE`` (the communication kernels' SMs):
    ``C − H + share·H``, ``H = min(C·(1 − 1/tp), G)``.

    ``symm_mem`` (PyTorch async TP, ``torch/distributed/_symmetric_memory``
    ``_pipelined_all_gather_and_consume`` / ``_pipelined_produce_and_all2all``): the local
    shard's GEMM chunk runs while the first remote shard is copied (the local output chunk
    last, under the last copy), and each peer's shard moves by ``copy_`` from its symmetric
    buffer, a copy-engine transfer that holds no SMs. The transfers end ``C`` after the
    first GEMM chunk (``G/tp``) at the latest, so ``max(0, C − G·(1 − 1/tp))`` adds."""
    if comm_s <= 0:
        return 0.0
    if tp <= 1:
        return comm_s
    gemm = max(0.0, gemm_s)
    if kind == "symm_mem":
        return max(0.0, comm_s - gemm * (1.0 - 1.0 / tp))
    hidden = min(comm_s * (1.0 - 1.0 / tp), gemm)
    return comm_s - hidden + TP_OVERLAP_SM_SHARE * hidden


def tp_layer_exposed_s(gather_s: float, scatter_s: float,
                       gemm_s: tuple[float, float, float, float], tp: int,
                       forward_passes: float = 1.0, kind: str = "userbuffers") -> float:
    """Seconds one transformer layer's overlapped sequence-parallel collectives add in one
    micro-step, each against the GEMM it is fused with (:func:`pipelined_exposed_s`).

    ``gather_s`` / ``scatter_s``: one all-gather / reduce-scatter of the layer's
    ``b·s·h`` activations; ``gemm_s``: the forward GEMM seconds of the QKV, attention-output,
    MLP-up (gate and up together: they share one gathered input) and MLP-down projections
    (``compute.linear_gemm_times_s``). Forward (``forward_passes`` times: 2 under full
    recomputation): the gathers into QKV and MLP-up, the scatters out of attention-output and
    MLP-down. Backward: the output gradients of attention-output and MLP-down are gathered
    into their input-gradient GEMMs, the input gradients of QKV and MLP-up leave theirs
    through a reduce-scatter; each input-gradient GEMM has its forward's FLOPs. Under
    ``symm_mem`` those two backward reduce-scatters wait in full: the input gradient is the
    sum of the Q, K, V (gate, up) projections' GEMMs, not one matmul, so PyTorch's
    micro-pipeline pass finds no matmul-reduce-scatter to fuse there (pytorch/pytorch#149946:
    the patterns are "only valid ... in the forward graph, but not in the backward graph")
    (docs/models.md#communication-commpy)."""
    qkv, out, up, down = gemm_s

    def x(c: float, g: float) -> float:
        return pipelined_exposed_s(c, g, tp, kind)

    fwd = x(gather_s, qkv) + x(scatter_s, out) + x(gather_s, up) + x(scatter_s, down)
    bwd = x(gather_s, out) + x(gather_s, down)
    if kind == "symm_mem":
        bwd += 2.0 * scatter_s
    else:
        bwd += x(scatter_s, qkv) + x(scatter_s, up)
    return forward_passes * fwd + bwd


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


def sync_overhead_s(micro_step_s: float, dp: int, scale: float = 1.0) -> float:
    """Time lost to stragglers and synchronisation once per step: a share of one micro-step
    per doubling of the replica count, ``SYNC_OVERHEAD_PER_DOUBLING`` (Pollux's
    retrogression).

    ``scale`` (the fitted communication scale) scales the first doubling's share: what a
    measured run loses beyond the prior once it runs distributed at all (DDP's bucket copies
    and hooks, collective kernels contending for the SMs and memory beneath the backward, the
    processes' synchronisation) is a per-step cost that does not grow with the ring; further
    doublings add the prior's share."""
    if dp <= 1:
        return 0.0
    return SYNC_OVERHEAD_PER_DOUBLING * (math.log2(dp) - 1.0 + scale) * micro_step_s


#: PyTorch DDP's gradient bucket: ``DistributedDataParallel(bucket_cap_mb=25)``, the default
#: (torch.nn.parallel.DistributedDataParallel docs). Parameters go into buckets in reverse
#: order of ``model.parameters()``, so the buckets fill as the backward produces their
#: gradients, and each bucket's all-reduce starts once its last gradient is ready.
DDP_BUCKET_BYTES = 25.0 * 1024 * 1024
#: Share of a micro-step's compute in the backward pass: 4 of the 6 FLOPs per weight and
#: token (the forward's one matmul per weight, the backward's two: Kaplan et al. 2020, 6·N).
BACKWARD_SHARE = 2.0 / 3.0


def bucketed_exposed_s(comm_s: float, window_s: float, buckets: int, last_s: float) -> float:
    """Seconds a sequence of per-bucket collectives runs past the compute it overlaps.

    ``buckets`` collectives of ``comm_s`` seconds in all run one after another on one NCCL
    stream; bucket i's starts when the compute (``window_s`` seconds, making the buckets ready
    evenly) has produced it and the previous one has finished. The last one can only start
    when the window ends, so its own time ``last_s`` is always exposed; the others run under
    the first ``1 − 1/n`` of the window and are exposed only where they take longer than it.
    """
    if comm_s <= 0:
        return 0.0
    n = max(1, int(buckets))
    last = min(last_s, comm_s)
    window = max(0.0, window_s) * (1.0 - 1.0 / n)
    return last + max(0.0, comm_s - last - window)


def ddp_exposed_s(grad_bytes: float, last_bucket_bytes: float, layout: Layout,
                  hardware: Hardware, backward_s: float, comm_scale: float = 1.0,
                  experts: Experts | None = None) -> float:
    """Exposed seconds of DDP's (and ZeRO-1/2's) gradient synchronisation after the last
    micro-step's backward (``backward_s``; accumulation steps run under ``no_sync``).

    ``grad_bytes`` go in ``DDP_BUCKET_BYTES`` buckets, each an all-reduce as NCCL runs it
    (:func:`dp_allreduce_s`, so each pays the collective's latency once); the last bucket
    (``last_bucket_bytes``: the first layers' gradients, at least the input embedding where it
    is a parameter larger than a bucket) is all-reduced after the backward. ZeRO-1/2 move the
    same volume as a reduce-scatter and an all-gather (``STRATEGY_VOLUME``). Overlap by
    :func:`bucketed_exposed_s`; ``comm_scale`` is the fitted communication scale.
    ``experts``: the routed experts' gradient bytes (not in ``grad_bytes``) on their own
    group (:func:`experts_allreduce_s`), their buckets reduced with the others."""
    if not _syncs(layout, grad_bytes, experts):
        return 0.0
    volume = STRATEGY_VOLUME.get(layout.dp_strategy, 1.0)
    everything = grad_bytes + (experts[0] if experts is not None else 0.0)
    buckets = max(1, math.ceil(everything / DDP_BUCKET_BYTES))
    last = min(grad_bytes, max(last_bucket_bytes, everything / buckets))
    latency = dp_allreduce_s(1.0, layout, hardware)  # one all-reduce's latency term
    total = comm_scale * volume * (dp_allreduce_s(grad_bytes, layout, hardware)
                                   + experts_allreduce_s(experts, hardware)
                                   + (buckets - 1) * latency)
    last_s = comm_scale * volume * dp_allreduce_s(last, layout, hardware)
    return bucketed_exposed_s(total, backward_s, buckets, last_s)


def fsdp_exposed_s(shard_bytes: float, unit_bytes: float, units: int, layout: Layout,
                   hardware: Hardware, forward_s: float, backward_s: float,
                   comm_scale: float = 1.0, gather_scale: float = 1.0,
                   unit_gather_scale: float = 1.0, experts: Experts | None = None) -> float:
    """Exposed seconds of one ZeRO-3/FSDP micro-step's parameter gathers and gradient
    reduce-scatters, per wrapped unit as FSDP runs them (each unit's all-gather prefetched
    under the previous unit's compute; each reduce-scatter issued when the unit's backward is
    done).

    Forward: the all-gathers (half an all-reduce's volume, :func:`dp_allreduce_s` / 2) over
    the forward; the first unit's cannot hide. Backward: the all-gathers again and the
    reduce-scatters (another half) over the backward; the last unit's reduce-scatter cannot
    hide. ``units``: the wrapped units (decoder blocks), the largest ``unit_bytes``; each
    pass by :func:`bucketed_exposed_s`. ``gather_scale`` / ``unit_gather_scale``: the
    all-gathers' bytes relative to ``shard_bytes`` / ``unit_bytes`` where FP8 weights are
    gathered in FP8 (:func:`fp8_gather_scale`); the reduce-scatters keep theirs.
    ``experts``: the routed experts' bytes (not in ``shard_bytes``), gathered and
    reduce-scattered over their own group (:func:`experts_allreduce_s`)."""
    if not _syncs(layout, shard_bytes, experts):
        return 0.0
    n = max(1, int(units))
    half = 0.5 * comm_scale
    latencies = (n - 1) * dp_allreduce_s(1.0, layout, hardware)
    routed = experts_allreduce_s(experts, hardware)
    gather = half * (dp_allreduce_s(shard_bytes * gather_scale, layout, hardware) + routed
                     + latencies)
    scatter = half * (dp_allreduce_s(shard_bytes, layout, hardware) + routed + latencies)
    last = min(shard_bytes + (experts[0] if experts is not None else 0.0), unit_bytes)
    unit_gather = half * dp_allreduce_s(last * unit_gather_scale, layout, hardware)
    unit_scatter = half * dp_allreduce_s(last, layout, hardware)
    forward = bucketed_exposed_s(gather, forward_s, n, unit_gather)
    backward = bucketed_exposed_s(gather + scatter, backward_s, n, unit_scatter)
    return forward + backward
