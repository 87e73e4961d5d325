"""Mixture of experts: which parameters expert parallelism shards, and the all-to-all
dispatch and combine it costs (docs/models.md#mixture-of-experts).

A MoE layer sends each token's hidden vector to the ``experts_per_token`` ranks holding its
experts and back: with ``ep`` expert-parallel ranks, 2 all-to-alls in forward (dispatch,
combine) and 2 in backward, each moving ``tokens × hidden × top-k × element bytes`` per
GPU, of which ``(ep − 1)/ep`` leaves the GPU. A capacity factor lets the busiest rank take
that many times its even share, and every rank waits for it. They are not overlapped.

Each MoE layer also costs, per micro-step, what a dense MLP does not (:func:`layer_time_s`):
the permutation traffic (the routed copies of the hidden states read and written by the
permute, local sort, unsort and unpermute kernels), the expert GEMMs' lower efficiency at
``M`` = the tokens one expert takes, under FP8 the casts of the experts' inputs and output
gradients (:func:`expert_cast_bytes`), the host-side launches of the router, the dispatcher
and each local expert's GEMMs, and in a dropless layer the device-to-host sync of the
per-expert token counts (docs/models.md#mixture-of-experts).

What the dispatcher (``Workload.moe_dispatcher``) changes: ``alltoall`` sends every routed
copy through NCCL's all-to-all; ``flex`` (DeepEP / HybridEP) sends a token once to each rank
holding one of its experts, once per node over the network, at the rates DeepEP's README
measured, and skips the permute before the dispatch and its inverse after the combine;
``allgather`` gathers every rank's tokens and permutes only the local experts' share.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from mlflow_gpuopt.perfmodel import comm
from mlflow_gpuopt.perfmodel.compute import (
    KERNEL_DISPATCH_S,
    latency_rate_flops_per_s,
    matmul_efficiency,
    memory_efficiency,
)
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import Layout
from mlflow_gpuopt.perfmodel.precision import COMM_ELEMENT_BYTES, peak_flops_per_s
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

#: all-to-alls per MoE layer per micro-step: dispatch and combine, forward and backward
ALLTOALLS_PER_LAYER = 4
#: Passes over the routed copies (tokens × top-k × hidden) per MoE layer per micro-step:
#: Megatron-core's alltoall dispatcher permutes the tokens into expert order before the
#: all-to-all, sorts the received chunks by local expert after it (omitted where ``ep`` equals
#: the experts: Megatron-core MoE README, "Performance Best Practice"), and undoes both after
#: the experts: 4 memory-bound kernels, each reading and writing every routed copy (2
#: passes), in the forward and again in the backward: 4 × 2 × 2.
PERMUTE_PASSES = 16
#: Rows of a GEMM at which it reaches half its large-``M`` efficiency: about one 128-row
#: tile (Hopper's ``wgmma`` kernels tile ``M`` by 64-128). From DeepGEMM's README
#: performance tables (deepseek-ai/DeepGEMM, first release, FP8 on H800, NVCC 12.8), the
#: same N × K at M = 64, 128, 256, 512, 1024 against M = 4096: N 4096 × K 7168 reaches 287,
#: 533, 932, 1040, 1233 of 1304 TFLOP/s, N 7168 × K 2048 295, 510, 815, 916, 925 of 1025;
#: solving ``M / (M + M0)`` for each gives M0 of 60-230, median about 120.
GEMM_HALF_EFFICIENCY_M = 128.0
#: Reduction depth ``K`` at which a GEMM's main loop reaches half its large-``K`` rate, at the
#: tensor rate per SM and clock of DeepGEMM's measurement (H800 FP8): each output tile pays
#: a fixed prologue (filling the operand pipeline) and epilogue (converting and storing the
#: accumulators) against a main loop that grows with ``K``, so a GEMM reaches
#: ``K / (K + K0)`` of its large-``K`` rate. From the same README table (first release, FP8
#: on H800) at M = 4096, the shapes whose ``N`` fills whole waves: K 512, 1536, 2048, 7168,
#: 16384 reach 590, 990, 1025, 1304, 1358 TFLOP/s; ``1/rate`` is linear in ``1/K`` (least
#: squares: large-``K`` rate ~1,420 TFLOP/s, ``K0`` ~720, every row within 3 %).
GEMM_HALF_EFFICIENCY_K = 720.0
#: The tensor rate per SM and clock of that measurement: the H800's (H100 SXM's) dense FP8
#: peak over its SM count × clock as ``compute.latency_rate_flops_per_s`` counts them
#: (1,978.9 TFLOP/s over 66.9 TFLOP/s × 64 / 128). The fixed part of a tile is cycles, and a
#: GPU or precision that does more FLOPs per SM and cycle (Blackwell; FP8 against 16-bit)
#: runs the same ``K`` loop in fewer of them, so ``K0`` scales with this rate
#: (:func:`half_efficiency_k`).
GEMM_HALF_EFFICIENCY_K_RATE = 1978.9e12 / (66.9e12 * 64 / 128)
#: ``K`` of the GEMMs ``compute.GENERATION_MFU`` was derived on, the share of it the dense
#: layers of any model are timed at: the median hidden size of bench_llm's 26 derivation rows
#: (2,048-18,432: Megatron-LM's GPT 1.7B-462B, NeMo 24.07's GPT-3 / Llama 2 / Llama 3 /
#: Nemotron, torchtitan's Llama 2 13B and 70B), the ``K`` of their column-parallel
#: projections (QKV, the MLP's up and gate), which hold most of their FLOPs.
GEMM_REFERENCE_K = 6656.0
#: Host-side launches of one MoE layer beyond its dense part (``compute.KERNELS_PER_LAYER_STEP``
#: counts the dense layer): the router (its linear layer, score function, top-k, the
#: normalisation and load-balancing loss: ~12 operators), the dispatcher (the token counts,
#: their copy to the host, the permutation and its index, 2 all-to-alls each way, the local
#: sort and unsort, the unpermute and the probability product: ~12): ~24 in the forward and
#: about twice that in the backward, counted from how Megatron-core's alltoall dispatcher
#: runs: ~70.
ROUTER_KERNELS_PER_LAYER_STEP = 70
#: GEMM launches per local expert per micro-step: Transformer Engine's GroupedLinear (what
#: Megatron-core's ``--moe-grouped-gemm`` runs) "launch[es] multiple local GEMM kernels in
#: multiple streams" (Megatron-core MoE README, arguments table), one per local expert; an
#: expert has 2 linear layers (the gate and up projections fused, the down projection),
#: each 1 GEMM forward and 2 backward (input and weight gradients).
GEMMS_PER_EXPERT_STEP = 6
#: FP8's casts per local expert per micro-step: each linear layer's input quantised in the
#: forward and its output gradient in the backward, per expert (the expert's token slice).
FP8_CASTS_PER_EXPERT_STEP = 4
#: DRAM bytes per element of FP8's casts of an expert linear layer's input (forward) and
#: output gradient (backward): Transformer Engine's GroupedLinear, what Megatron-core's grouped
#: GEMM runs, quantises each expert's slice in a kernel of its own
#: (``tex.fused_multi_quantize`` over the input and, in the backward, over the output
#: gradient: NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/grouped_linear.py``),
#: reading it at 16 bit (2) and writing it row-wise for one GEMM and column-wise for the weight
#: gradient's (1 + 1): 4. Its weights are cast on the first micro-batch of a step only
#: (``is_first_microbatch``), so per micro-step they are not counted; a current-scaling
#: recipe's amax pass (2 more) is not counted either. The dense layers' casts (fused with
#: their LayerNorm and activation, :data:`.compute.FP8_CAST_BYTES_PER_ELEMENT` ``te``) are in
#: ``compute.GENERATION_MFU``; the experts' are timed beyond the same casts of dense GEMMs
#: of the same FLOPs (``GEMM_REFERENCE_K`` deep and wide, :func:`layer_parts_s`).
FP8_CAST_BYTES_PER_EXPERT_ELEMENT = 4.0
#: A dropless layer's host sync: the per-expert token counts are copied to the host once per
#: forward (the all-to-all's split sizes and the GEMMs' ``M``; the backward reuses them), the
#: CPU waits for the queue to drain (the copy's launch) and the GPU then idles until the
#: next kernel is launched: 2 launches' worth (``compute.KERNEL_DISPATCH_S``).
SYNC_STALL_S = 2 * KERNEL_DISPATCH_S

#: Token dispatchers, in Megatron-Core's ``moe_token_dispatcher_type`` words.
DISPATCHERS = ("alltoall", "allgather", "flex")
_DISPATCHER_ALIASES = {"alltoall": "alltoall", "all_to_all": "alltoall",
                       "all-to-all": "alltoall", "a2a": "alltoall", "standard": "alltoall",
                       "allgather": "allgather", "all_gather": "allgather",
                       "all-gather": "allgather", "flex": "flex", "deepep": "flex",
                       "hybridep": "flex"}
#: Spellings of ``Workload.moe_a2a_overlap`` -> "1f1b" or "none".
_A2A_OVERLAP_ALIASES = {"1f1b": "1f1b", "true": "1f1b", "on": "1f1b", "yes": "1f1b",
                        "1": "1f1b", "overlap_moe_expert_parallel_comm": "1f1b",
                        "ep_a2a_overlap": "1f1b", "none": "none", "off": "none",
                        "false": "none", "no": "none", "0": "none", "auto": "auto"}
#: GEMM efficiency the paired micro-steps lose under the 1F1B all-to-all overlap
#: (:func:`overlapped_alltoall_s`): Megatron-Core's MoE report (arXiv 2603.07685, Sec. 4.2.3,
#: as Megatron-LM ``docs/user-guide/features/moe_a2a_overlap.md`` quotes it) reserves 20 SMs
#: per GPU for DeepEP's kernels and "observes about a 20% GEMM-efficiency cost". It is charged
#: to the whole paired phase, the compute beside the communication stream, not only to the
#: seconds an all-to-all kernel runs: read that narrower way (the SM share of the hidden
#: seconds), the one end-to-end A/B published (Megatron-MoE-ModelZoo
#: ``best_practice/qwen3/readme.md``: Qwen3-235B-A22B on 256 H100, DeepEP, tp2 x pp8 x vp4 x
#: ep32, 19.7 s a step without the overlap, 17.6 s with it, 1.12x) is predicted 1.26x; read
#: over the paired compute, 1.11x (22.2 s -> 20.0 s). Two A/Bs found after, which did not
#: take part in the choice, agree: Qwen3-30B-A3B on 16 H100 with NCCL's all-to-all across two
#: nodes (Megatron-Bridge's ``skills/perf-moe-comm-overlap``: 43.1 s -> 32.6 s, 1.32x) is
#: predicted 42.4 s -> 32.3 s (1.32x; 1.52x with 16 SMs charged to the hidden seconds), and a
#: 14-layer DeepSeek-V3 proxy on 64 H100 under full recompute (Megatron-LM PR #6311: 1.08x)
#: 1.05x (1.14x). ``bench_llm.py --moe`` prints all three. NCCL's all-to-all channels and
#: DeepEP's 20 SMs are not told apart.
A2A_OVERLAP_GEMM_COST = 0.2
#: Where a token's experts lie (see ``Workload.moe_routing``).
ROUTINGS = ("random", "round_robin")
_ROUTING_ALIASES = {"random": "random", "learned": "random", "round_robin": "round_robin",
                    "round-robin": "round_robin", "roundrobin": "round_robin"}
#: Passes over the routed copies with the ``flex`` and ``allgather`` dispatchers: DeepEP's
#: dispatch reads the hidden states where they lie and its combine writes them back
#: (torchtitan ``distributed/deepep/deepep.py``: ``_permute_tokens`` after the dispatch and
#: ``_unpermute_tokens`` before the combine are the only copies); the all-gather dispatcher
#: permutes the local experts' tokens out of the gathered ones and un-permutes them before
#: the reduce-scatter: 2 memory-bound kernels of 2 passes, forward and backward: 2 × 2 × 2.
PERMUTE_PASSES_FUSED = 8
#: Share of the link DeepEP's normal (training) kernels reach, from its README (V1, H800 with
#: ~160 GB/s NVLink and a 400 Gbit/s CX7 NIC, ~50 GB/s, DeepSeek-V3's pretraining shape):
#: 153 and 158 GB/s over NVLink (dispatch, combine at EP 8), 43 GB/s over RDMA at EP 16 (the
#: figures of larger groups count forwarded traffic and exceed the NIC).
FLEX_NVLINK_EFFICIENCY = 153.0 / 160.0
FLEX_RDMA_EFFICIENCY = 43.0 / 50.0


def normalize_dispatcher(name: str | None) -> str:
    """``alltoall``, ``allgather`` or ``flex`` from Megatron's and torchtitan's words
    (``deepep`` and ``hybridep`` are ``flex``; None: ``alltoall``)."""
    if name is None:
        return "alltoall"
    key = name.strip().lower()
    if key not in _DISPATCHER_ALIASES:
        raise ValueError(f"unknown moe_dispatcher {name!r}; expected alltoall, allgather or "
                         "flex (deepep, hybridep)")
    return _DISPATCHER_ALIASES[key]


def normalize_routing(name: str | None) -> str:
    """``random`` or ``round_robin`` (None: ``random``)."""
    if name is None:
        return "random"
    key = name.strip().lower()
    if key not in _ROUTING_ALIASES:
        raise ValueError(f"unknown moe_routing {name!r}; expected random or round_robin")
    return _ROUTING_ALIASES[key]


def normalize_a2a_overlap(name: str | bool | None) -> str:
    """``1f1b``, ``none`` or ``auto`` from the usual spellings (``true``, Megatron-core's
    ``overlap_moe_expert_parallel_comm``; None: ``none``). ``auto``: the planned run can turn
    the overlap on or off, and each layout runs it where Megatron can and it pays."""
    if name is None:
        return "none"
    key = str(name).strip().lower().replace("-", "_")
    if key not in _A2A_OVERLAP_ALIASES:
        raise ValueError(f"unknown moe_a2a_overlap {name!r}; expected 1f1b (Megatron-core's "
                         "overlap_moe_expert_parallel_comm), none or auto")
    return _A2A_OVERLAP_ALIASES[key]


def a2a_overlap_blocker(workload: Workload, layout: Layout) -> str | None:
    """Why the 1F1B all-to-all overlap cannot run on ``layout`` (Megatron-core refuses it at
    start), or None: it needs expert parallelism, the ``alltoall`` or ``flex`` dispatcher, and
    under pipeline parallelism the interleaved schedule (``transformer_config.py``: "virtual
    pipeline model parallel size must be specified when pipeline model parallel size > 1")."""
    if layout.ep <= 1 or not is_moe(workload):
        return "it needs expert parallelism (ep of 2 or more)"
    if normalize_dispatcher(workload.moe_dispatcher) == "allgather":
        return "it runs with the alltoall or flex dispatcher, not allgather"
    if layout.pp > 1 and layout.vp < 2:
        return (f"with pipeline parallel pp{layout.pp} it needs the interleaved schedule "
                "(virtual stages of 2 or more)")
    return None


def attention_share(workload: Workload, seq_len: float) -> float:
    """Share of a MoE decoder layer's compute in its attention block (Q, K, V and output
    projections; the scores over ``seq_len / 2`` keys on average, causal) against its MoE
    block (the router, the top-k and shared experts): what the 1F1B overlap hides the
    all-to-alls under, slot by slot. 0.5 where the shape is not known."""
    h, width = workload.hidden_size, workload.expert_ffn_hidden_size
    if not h or not width or not is_moe(workload):
        return 0.5
    heads = workload.num_heads or 1
    kv = workload.num_kv_heads or heads
    q = (workload.qkv_width * heads / (heads + 2 * kv) if workload.qkv_width else float(h))
    kv_dim = q * kv / heads
    attention = 2.0 * (h * (q + 2 * kv_dim) + q * h) + 4.0 * (seq_len / 2.0) * q
    matrices = 2 if (workload.mlp or "swiglu") == "gelu" else 3
    experts = (workload.experts_per_token or 1) + (workload.num_shared_experts or 0)
    mlp = 2.0 * experts * matrices * h * width + 2.0 * h * (workload.num_experts or 1)
    return attention / (attention + mlp)


def paired_layers_s(chunks: tuple[float, float, float, float], alltoall_s: float,
                    layers: int) -> float:
    """Seconds ``layers`` paired forward/backward layers take on the 1F1B overlap's two
    streams (Megatron-LM ``docs/user-guide/features/moe_a2a_overlap.md``). ``chunks`` are a
    layer's compute ``(F.attn, B.expert, F.expert, B.attn)``, run in that order on the
    compute stream; its four all-to-alls of ``alltoall_s`` each (B.combine, F.dispatch,
    B.dispatch, F.combine) run in that order on the communication stream; the schedule's
    events make F.dispatch wait for F.attn, B.expert for B.combine, B.dispatch for B.expert,
    F.expert for F.dispatch, F.combine for F.expert and B.attn for B.dispatch, and the next
    layer's F.attn for this one's F.combine, its B.combine for this one's B.attn (forward
    runs up the layers, backward down)."""
    fa, be, fe, ba = chunks
    c = alltoall_s
    compute = comm = forward_ready = backward_ready = 0.0
    for _ in range(max(1, int(layers))):
        fa_end = max(compute, forward_ready) + fa
        bc_end = max(comm, backward_ready) + c
        fd_end = max(bc_end, fa_end) + c
        be_end = max(fa_end, bc_end) + be
        bd_end = max(fd_end, be_end) + c
        fe_end = max(be_end, fd_end) + fe
        fc_end = max(bd_end, fe_end) + c
        ba_end = max(fe_end, bd_end) + ba
        compute, comm, forward_ready, backward_ready = ba_end, fc_end, fc_end, ba_end
    return max(compute, comm)


def overlapped_alltoall_s(workload: Workload, layout: Layout, alltoall_s: float,
                          compute_s: float, unpaired: float, seq_len: float) -> float:
    """Seconds the 1F1B overlap adds to a micro-step's ``compute_s`` in place of its
    ``alltoall_s``: the forward of micro-batch i+1 runs with the backward of i, a layer at a
    time, the communication on its own stream (:func:`paired_layers_s`), each of a MoE layer's
    4 all-to-alls a quarter of its share. A layer's compute is ``compute_s`` over the stage's
    layers, a third forward and two thirds backward, split between attention and the experts
    by :func:`attention_share`, each chunk slowed by ``A2A_OVERLAP_GEMM_COST`` (the SMs the
    communication holds). What the two streams take beyond the plain compute is the result:
    the all-to-alls left exposed and the slower GEMMs beside the hidden ones, so a small
    all-to-all can cost more paired than alone (Megatron-LM's guide: the overlap "can leave
    iteration time unchanged or make it worse" where little communication is exposed).
    ``unpaired``: the share of the micro-steps' forwards and backwards that run alone (the
    pipeline's warm-up and cool-down, the first forward and the last backward), whose
    all-to-alls stay exposed and whose GEMMs keep their speed."""
    if alltoall_s <= 0:
        return 0.0
    layers = max(1, moe_layers(workload) // layout.pp)
    part = alltoall_s / layers / ALLTOALLS_PER_LAYER
    layer = compute_s / max(1, (workload.num_layers or layers) // layout.pp)
    a = attention_share(workload, seq_len)
    slow = layer / (1.0 - A2A_OVERLAP_GEMM_COST)
    fwd, bwd = slow / 3.0, 2.0 * slow / 3.0
    chunks = (a * fwd, (1 - a) * bwd, (1 - a) * fwd, a * bwd)
    paired = max(0.0, paired_layers_s(chunks, part, layers) - layers * layer)
    share = min(1.0, max(0.0, unpaired))
    return share * alltoall_s + (1.0 - share) * paired


@functools.lru_cache(maxsize=256)
def distinct_groups(num_experts: int, k: int, groups: int, routing: str = "random",
                    expert_groups: int = 1, groups_per_token: int = 0) -> float:
    """Expected number of the ``groups`` equal blocks of consecutive experts (the ranks, or
    the nodes, of an expert-parallel group) that one token's ``k`` experts fall in.

    ``random``: k of the experts drawn without replacement, a block missed with probability
    ``C(E − E/groups, k) / C(E, k)``; under group-limited routing (``groups_per_token`` of
    ``expert_groups`` routing groups, :func:`group_limited_blocks`) inside the chosen
    groups. ``round_robin``: token t takes experts ``(t·k + j) mod E``, averaged over one
    period of tokens."""
    if groups <= 1 or num_experts < groups:
        return 1.0
    k = max(1, min(int(k), num_experts))
    per = num_experts / groups
    if routing != "round_robin" and 1 <= groups_per_token < expert_groups:
        limited = group_limited_blocks(num_experts, k, groups, expert_groups, groups_per_token)
        if limited is not None:
            return limited
    if routing == "round_robin":
        period = num_experts // math.gcd(num_experts, k)
        hit = sum(len({int(((t * k + j) % num_experts) // per) for j in range(k)})
                  for t in range(period))
        return hit / period
    outside = num_experts - int(round(per))
    miss = math.comb(outside, k) / math.comb(num_experts, k) if outside >= k else 0.0
    return groups * (1.0 - miss)


def group_limited_blocks(num_experts: int, k: int, blocks: int, expert_groups: int,
                         groups_per_token: int) -> float | None:
    """Expected number of ``blocks`` equal blocks of consecutive experts (ranks or nodes)
    that one token reaches under group-limited routing: ``groups_per_token`` (g) of the
    ``expert_groups`` (G) blocks of consecutive experts chosen, each equally likely, and the
    ``k`` experts taken ``k/g`` from each chosen group (``⌊k/g⌋`` or ``⌈k/g⌉`` where g does not
    divide k), at random inside it. Megatron-core ranks a group by the sum of its top
    ``k/g`` scores (``group_limited_topk``; DeepSeek-V3's router), so the top-k falls about
    evenly over the chosen groups: a simulation of that router over random logits gives
    3.96 distinct groups of 4 for DeepSeek-V3 (256 experts, top-8, 4 of 8 groups), where an
    even split counts 4 and drawing the 8 anywhere in the chosen 128 experts 3.63
    (docs/models.md#mixture-of-experts).

    A block holding ``m`` whole groups is reached when one of them is chosen,
    ``1 − C(G − m, g) / C(G, g)``; a block inside one group (``s`` of its ``E/G`` experts)
    when that group is chosen and one of its ``c`` picks falls in the block,
    ``g/G × (1 − C(E/G − s, c) / C(E/G, c))``. None where the blocks and groups do not nest
    (neither size divides the other) or ``k < g``."""
    if blocks < 1 or expert_groups < 2 or num_experts % blocks or num_experts % expert_groups:
        return None
    g = int(groups_per_token)
    if not 1 <= g < expert_groups or k < g:
        return None
    per_block, per_group = num_experts // blocks, num_experts // expert_groups
    if per_block % per_group == 0:
        m = per_block // per_group
        miss = (math.comb(expert_groups - m, g) / math.comb(expert_groups, g)
                if expert_groups - m >= g else 0.0)
        return blocks * (1.0 - miss)
    if per_group % per_block:
        return None
    q, r = divmod(int(k), g)
    hit = 0.0
    for picks, share in ((q + 1, r / g), (q, 1.0 - r / g)):
        if share > 0:
            picks = min(picks, per_group)
            hit += share * (1.0 - math.comb(per_group - per_block, picks)
                            / math.comb(per_group, picks))
    return blocks * g / expert_groups * hit


def routing_groups(workload: Workload) -> tuple[int, int]:
    """``(num_expert_groups, expert_groups_per_token)`` of a group-limited router, (1, 0)
    without a limit."""
    groups = int(workload.num_expert_groups or 1)
    per_token = int(workload.expert_groups_per_token or 0)
    if groups <= 1 or not 1 <= per_token < groups:
        return 1, 0
    return groups, per_token


def expert_tp(workload: Workload, layout: Layout) -> int:
    """The routed experts' tensor-parallel degree: ``Workload.expert_tensor_parallel`` where
    it divides ``tp`` (else their greatest common divisor), else ``tp`` (Megatron-core's
    default ``expert_tensor_parallel_size``)."""
    etp = workload.expert_tensor_parallel
    if not etp or etp < 1:
        return layout.tp
    return math.gcd(int(etp), layout.tp)


def expert_data_parallel(workload: Workload, layout: Layout) -> int:
    """Ranks holding the same experts, which reduce their gradients and shard their optimizer
    states together (Megatron's expert data-parallel group): a pipeline stage's
    ``tp × dp`` ranks over ``etp × ep``, at least 1. With ``etp`` = ``tp`` it is
    ``dp / ep``; with ``etp`` below ``tp`` the expert group also spans tensor-parallel ranks
    (MoE parallel folding: Qwen3-235B on H100 runs tp2 × ep32 × etp1 over 16 replicas, no
    expert data parallelism)."""
    return max(1, layout.tp * layout.dp // (expert_tp(workload, layout) * max(1, layout.ep)))


def expert_sync(workload: Workload, layout: Layout,
                gpus_per_node: int) -> tuple[float, Layout] | None:
    """(the routed experts' parameters on one GPU, the layout of the group that reduces their
    gradients), or None without expert parallelism.

    The experts' gradients are not reduced over the data-parallel group but over their expert
    data-parallel group (:func:`expert_data_parallel`; Megatron's ``expert_parallel_buffers``
    on ``expt_dp_group``, torchtitan's FSDP of the experts over ``dp_shard_mod_ep``). That
    group's ranks stand ``etp × ep`` apart in a pipeline stage's ranks (order
    ``tp-cp-ep-dp-pp``), a stage holding ``min(gpus per node, tp × dp)`` of a node: where the
    expert-parallel group fills the node, each of its ranks is alone in its node, and the
    experts' whole gradient crosses the GPU's own NIC, with no NVLink stage to shrink it
    (docs/models.md#mixture-of-experts)."""
    if layout.ep <= 1 or not is_moe(workload):
        return None
    params = expert_params_per_gpu(workload, layout)
    edp = expert_data_parallel(workload, layout)
    stage_in_node = max(1, min(int(gpus_per_node), layout.tp * layout.dp))
    in_node = max(1, min(edp, stage_in_node // (expert_tp(workload, layout) * layout.ep)))
    group = dataclasses.replace(layout, dp=edp, dp_ranks_per_node=in_node,
                                dp_spans_nodes=edp > in_node)
    return params, group


def expert_sync_notes(workload: Workload, layout: Layout,
                      gpus_per_node: int) -> tuple[str, ...]:
    """Where the routed experts' gradients are reduced (:func:`expert_sync`), in words, when
    two or more ranks hold the same experts."""
    sync = expert_sync(workload, layout, gpus_per_node)
    if sync is None or sync[1].dp <= 1:
        return ()
    params, group = sync
    if not group.dp_spans_nodes:
        where = "inside a node"
    elif group.dp_ranks_per_node == 1:
        where = "one in each node: each GPU's whole share crosses its network"
    else:
        where = f"{group.dp_ranks_per_node} in each node, across nodes"
    return (f"routed experts' gradients ({params / 1e9:.3g} B parameters a GPU) reduced over "
            f"their expert data-parallel group of {group.dp} ranks, {where}",)


def ep_ranks_per_node(workload: Workload, layout: Layout) -> int:
    """Expert-parallel ranks of one group in a node: Megatron-core builds the expert groups
    with a rank generator of their own (``initialize_model_parallel``: ``tp`` =
    ``expert_tensor_parallel_size``, then ``ep``, expert data parallel and ``pp``, order
    ``tp-cp-ep-dp-pp``), so ``min(ep, gpus per node / etp)`` of them share a node; with
    ``etp`` = ``tp`` the layout's ``ep_ranks_per_node``."""
    etp = expert_tp(workload, layout)
    return max(1, min(layout.ep, layout.ep_ranks_per_node * layout.tp // etp))


def is_moe(workload: Workload) -> bool:
    """True when the workload routes tokens over two or more experts."""
    return (workload.num_experts or 0) > 1


def moe_layers(workload: Workload) -> int:
    """Decoder layers whose MLP is a mixture of experts: every ``moe_layer_freq``-th after
    the ``first_dense_layers``."""
    if not is_moe(workload) or not workload.num_layers:
        return 0
    after = max(0, workload.num_layers - (workload.first_dense_layers or 0))
    return after // max(1, workload.moe_layer_freq or 1)


def routed_expert_params(workload: Workload) -> float:
    """Weights of every routed expert of every MoE layer (what ``ep`` shards): gated
    experts (three matrices) unless ``mlp`` is ``gelu``; 0 without the width or hidden size."""
    width, hidden = workload.expert_ffn_hidden_size, workload.hidden_size
    if not is_moe(workload) or not width or not hidden:
        return 0.0
    matrices = 2 if (workload.mlp or "swiglu") == "gelu" else 3
    return float(moe_layers(workload) * workload.num_experts * matrices * hidden * width)


def check_experts(workload: Workload, layout: Layout) -> None:
    """One line when ``layout``'s expert-parallel degree does not fit the workload."""
    if layout.ep <= 1:
        return
    if not is_moe(workload):
        raise PerfModelError(f"expert parallel ep{layout.ep} needs a mixture-of-experts "
                             "workload (num_experts of 2 or more)")
    if workload.num_experts % layout.ep:
        raise PerfModelError(f"expert parallel ep{layout.ep} must divide the "
                             f"{workload.num_experts} experts")
    if not moe_layers(workload) or not workload.hidden_size:
        raise PerfModelError(f"expert parallel ep{layout.ep} needs num_layers and hidden_size "
                             "(the all-to-all's volume)")
    etp = expert_tp(workload, layout)
    if (layout.tp * layout.dp) % (etp * layout.ep):
        # Megatron-core builds the expert groups from a pipeline stage's tp x cp x dp ranks:
        # etp x ep x expert-data-parallel (MoE parallel folding)
        raise PerfModelError(
            f"expert parallel ep{layout.ep} x the experts' tensor parallel {etp} must divide "
            f"tp{layout.tp} x the data-parallel degree {layout.dp} (an expert group wider than "
            "the data-parallel ranks takes tensor-parallel ones: give "
            "--expert-tensor-parallel 1)")
    try:
        normalize_dispatcher(workload.moe_dispatcher)
        normalize_routing(workload.moe_routing)
    except ValueError as exc:
        raise PerfModelError(str(exc)) from None


def alltoall_bytes_per_layer(workload: Workload, tokens: float, act_bytes: float) -> float:
    """Bytes one GPU sends in one all-to-all of one MoE layer, ``tokens`` on the GPU:
    ``tokens × hidden × top-k × element bytes × capacity factor`` (the busiest rank's)."""
    k = workload.experts_per_token or 1
    capacity = workload.capacity_factor or 1.0
    return tokens * float(workload.hidden_size or 0) * k * act_bytes * capacity


def alltoall_s(workload: Workload, layout: Layout, hardware: Hardware, micro_batch: float,
               seq_len: float, act_bytes: float) -> float:
    """Seconds of one micro-step's expert-parallel all-to-alls on one GPU (this pipeline
    stage's MoE layers; with tensor parallel, each rank dispatches its ``1/tp`` of the
    tokens, as Megatron's sequence parallelism holds them; ``seq_len`` is the tokens of a
    sample on the GPU, ``seq/cp`` under context parallel)."""
    if layout.ep <= 1 or not is_moe(workload):
        return 0.0
    tokens = micro_batch * seq_len / layout.tp
    layers = max(1, moe_layers(workload) // layout.pp)
    how = normalize_dispatcher(workload.moe_dispatcher)
    if how == "flex":
        per_call = flex_dispatch_s(workload, layout, hardware, tokens, act_bytes)
    else:
        if how == "allgather":
            # every rank's tokens to every other rank (the combine: a reduce-scatter of as
            # much), whatever experts they chose and however unevenly
            nbytes = tokens * float(workload.hidden_size or 0) * act_bytes * (layout.ep - 1)
        else:
            nbytes = (alltoall_bytes_per_layer(workload, tokens, act_bytes)
                      * (layout.ep - 1) / layout.ep)
        # bytes leaving the GPU: comm.alltoall_s takes what a rank sends to all its peers
        per_call = comm.alltoall_s(nbytes, layout.ep, ep_ranks_per_node(workload, layout),
                                   hardware)
    return ALLTOALLS_PER_LAYER * layers * per_call


def flex_dispatch_s(workload: Workload, layout: Layout, hardware: Hardware, tokens: float,
                    act_bytes: float) -> float:
    """One dispatch (or combine) of DeepEP's normal kernels, ``tokens`` on the GPU: each token
    goes once to every rank holding one of its experts (:func:`distinct_groups`), the others'
    part over NVLink (directly, or forwarded there from the network) at
    ``FLEX_NVLINK_EFFICIENCY``; across nodes once to each other node holding one, over the
    GPU's NIC at ``FLEX_RDMA_EFFICIENCY``, at once; the slower sets the time. Group-limited
    routing (:func:`routing_groups`) bounds the nodes: with one routing group a node, a
    token reaches at most ``expert_groups_per_token`` of them (DeepSeek-V3: 4)."""
    experts, k = int(workload.num_experts or 1), int(workload.experts_per_token or 1)
    routing = normalize_routing(workload.moe_routing)
    row = tokens * float(workload.hidden_size or 0) * act_bytes * (workload.capacity_factor
                                                                   or 1.0)
    ep, local = layout.ep, ep_ranks_per_node(workload, layout)
    groups = routing_groups(workload)
    ranks = distinct_groups(experts, k, ep, routing, *groups)
    intra = (row * ranks * (ep - 1) / ep
             / (hardware.intra_node_bytes_per_s * FLEX_NVLINK_EFFICIENCY))
    if local >= ep:
        return comm.INTRA_NODE_LATENCY_S + intra
    nodes = max(2, ep // local)
    remote = distinct_groups(experts, k, nodes, routing, *groups) * (nodes - 1) / nodes
    inter = row * remote / (comm.nic_bytes_per_s_per_gpu(hardware) * FLEX_RDMA_EFFICIENCY)
    return comm.INTER_NODE_LATENCY_S + max(intra, inter)


def tokens_per_expert(workload: Workload, layout: Layout, micro_batch: float,
                      seq_len: float) -> float:
    """Rows one local expert's GEMM takes in a micro-step (its ``M``) at an even load: the GPU's
    ``micro_batch × seq_len / tp`` tokens × top-k, from all ``ep`` ranks, over the experts
    (× the capacity factor where tokens are padded to it), × the experts' tensor-parallel
    degree: each of the ``etp`` ranks splitting an expert's weights takes the tokens all of
    them received (Megatron's all-to-all dispatcher gathers them over that group after the
    all-to-all, each rank then computing its ``1/etp`` of the outputs)."""
    k = workload.experts_per_token or 1
    capacity = workload.capacity_factor or 1.0
    return (micro_batch * seq_len / layout.tp * expert_tp(workload, layout) * k * layout.ep
            * capacity / max(1, workload.num_experts or 1))


def gemm_efficiency(rows: float, depth: float | None = None, half_depth: float = 0.0) -> float:
    """Share of its large-shape efficiency a GEMM of ``rows`` output rows and reduction depth
    ``depth`` reaches: ``M / (M + GEMM_HALF_EFFICIENCY_M)``, times ``K / (K + half_depth)``
    where a depth is given (:func:`half_efficiency_k`)."""
    if rows <= 0:
        return 0.0
    eff = 1.0 if math.isinf(rows) else rows / (rows + GEMM_HALF_EFFICIENCY_M)
    if depth is not None and half_depth > 0:
        eff *= depth / (depth + half_depth) if depth > 0 else 0.0
    return eff


def half_efficiency_k(hardware: Hardware, precision: str) -> float:
    """``K0`` of :func:`gemm_efficiency` on ``hardware`` at ``precision``:
    ``GEMM_HALF_EFFICIENCY_K`` × the GPU's dense tensor peak of the precision per SM and clock
    (over ``compute.latency_rate_flops_per_s``) / ``GEMM_HALF_EFFICIENCY_K_RATE``: 720 for
    H100 FP8, 360 at bf16; B200 1,440 and 720."""
    rate = latency_rate_flops_per_s(hardware)
    if rate <= 0:
        return GEMM_HALF_EFFICIENCY_K
    peak = peak_flops_per_s(hardware.peak_flops_per_s, precision)
    return GEMM_HALF_EFFICIENCY_K * peak / rate / GEMM_HALF_EFFICIENCY_K_RATE


def expert_gemm_ratio(workload: Workload, layout: Layout, hardware: Hardware, precision: str,
                      micro_batch: float, seq_len: float) -> float:
    """Efficiency of a MoE layer's expert GEMMs over the dense layers' (what
    ``compute.GENERATION_MFU`` times every matmul at), forward and backward: each expert
    linear layer (the gate and up projections as one, ``K`` = hidden, ``N`` = 2 × expert
    width; the down projection, ``K`` = expert width, ``N`` = hidden) runs a forward GEMM
    (``M`` = :func:`tokens_per_expert` rows, reduction ``K``), an input-gradient GEMM (``M``
    rows, reduction ``N``) and a weight-gradient GEMM (reduction over the ``M`` rows), equal
    in FLOPs, timed at :func:`gemm_efficiency`; the dense layers at the micro-batch's tokens
    as rows and ``GEMM_REFERENCE_K`` (their weight gradients reducing over the tokens)."""
    width, hidden = workload.expert_ffn_hidden_size, workload.hidden_size
    if not width or not hidden:
        return 1.0
    k0 = half_efficiency_k(hardware, precision)
    rows = tokens_per_expert(workload, layout, micro_batch, seq_len)
    tokens = micro_batch * seq_len  # the dense GEMMs' rows: sequence parallel gathers them
    gated = (workload.mlp or "swiglu") != "gelu"
    up = 2.0 * width if gated else float(width)
    # (share of the expert FLOPs, K of the forward, K of the input gradient)
    linears = ((up / (up + width), float(hidden), up), (width / (up + width), float(width),
                                                         float(hidden)))
    time = 0.0
    for share, k_fwd, k_dgrad in linears:
        time += share / 3.0 * (1.0 / gemm_efficiency(rows, k_fwd, k0)
                               + 1.0 / gemm_efficiency(rows, k_dgrad, k0)
                               + 1.0 / gemm_efficiency(math.inf, rows, k0))
    dense = 3.0 / (2.0 / gemm_efficiency(tokens, GEMM_REFERENCE_K, k0)
                   + 1.0 / gemm_efficiency(math.inf, tokens, k0))
    return (1.0 / time) / dense if time > 0 else 1.0


def layer_parts_s(workload: Workload, layout: Layout, hardware: Hardware, precision: str,
                  micro_batch: float, seq_len: float) -> dict[str, float]:
    """Seconds per micro-step on one GPU of this pipeline stage's MoE layers beyond their
    dense part, by cause (before calibration): ``permute`` (traffic), ``expert_gemm`` (the
    experts' GEMMs at ``M`` = :func:`tokens_per_expert` against the dense layers' ``M`` =
    the micro-batch's tokens), ``fp8_cast`` (FP8 only: :func:`expert_cast_bytes` at the
    memory bandwidth), ``dispatch`` (host launches, unless the profile counted the kernels)
    and ``sync`` (dropless only).
    ``seq_len`` is a sample's tokens on the GPU (``seq/cp``); all zero for a dense model."""
    parts = dict.fromkeys(("permute", "expert_gemm", "fp8_cast", "dispatch", "sync"), 0.0)
    layers = moe_layers(workload)
    if not layers or not workload.hidden_size:
        return parts
    layers = max(1, layers // layout.pp)
    k = workload.experts_per_token or 1
    capacity = workload.capacity_factor or 1.0
    hidden = float(workload.hidden_size)
    tokens = micro_batch * seq_len / layout.tp
    element = COMM_ELEMENT_BYTES[precision]  # hidden states permuted at 16 bit under FP8
    routed_bytes = tokens * k * capacity * hidden * element
    passes = (PERMUTE_PASSES if normalize_dispatcher(workload.moe_dispatcher) == "alltoall"
              else PERMUTE_PASSES_FUSED)
    parts["permute"] = (layers * passes * routed_bytes
                        / (hardware.memory_bandwidth_bytes_per_s * memory_efficiency(hardware)))
    width = workload.expert_ffn_hidden_size
    if width:
        matrices = 2 if (workload.mlp or "swiglu") == "gelu" else 3
        flops = 6.0 * tokens * k * capacity * matrices * hidden * width * layers
        ratio = expert_gemm_ratio(workload, layout, hardware, precision, micro_batch, seq_len)
        if 0 < ratio < 1:
            rate = (peak_flops_per_s(hardware.peak_flops_per_s, precision)
                    * matmul_efficiency(hardware, precision)[0])
            parts["expert_gemm"] = flops / rate * (1 / ratio - 1)
        if precision == "fp8":
            parts["fp8_cast"] = (expert_cast_bytes(workload, tokens * capacity) * layers
                                 / (hardware.memory_bandwidth_bytes_per_s
                                    * memory_efficiency(hardware)))
    if not (workload.kernels_per_micro_step and workload.kernels_per_micro_step > 0):
        # a profiled run's kernel count has them already (compute.kernel_count)
        local = max(1, (workload.num_experts or 1) // layout.ep)
        per_expert = GEMMS_PER_EXPERT_STEP + (FP8_CASTS_PER_EXPERT_STEP if precision == "fp8"
                                              else 0)
        parts["dispatch"] = (layers * (ROUTER_KERNELS_PER_LAYER_STEP + per_expert * local)
                             * KERNEL_DISPATCH_S)
    if workload.capacity_factor is None:
        parts["sync"] = layers * SYNC_STALL_S
    return parts


def expert_cast_bytes(workload: Workload, tokens: float) -> float:
    """DRAM bytes of FP8's casts of one MoE layer's expert inputs and output gradients per
    micro-step, ``tokens`` on the GPU (× the capacity factor), beyond what dense GEMMs of the
    same FLOPs cast: ``FP8_CAST_BYTES_PER_EXPERT_ELEMENT`` × the routed rows (``tokens × top-k``)
    × (the gate/up layer's input ``hidden`` and output gradient ``up``, the down layer's
    ``width`` and ``hidden``), less ``FP8_CAST_BYTES_PER_EXPERT_ELEMENT / 6 × 2 /
    GEMM_REFERENCE_K`` per FLOP (a GEMM's ``6·M·K·N`` FLOPs forward and backward cast
    ``M·K + M·N`` elements). Qwen3-30B-A3B (hidden 2,048, width 768, top-8) at 4,096 tokens:
    839 MB, 653 MB beyond. 0 without the expert width."""
    width, hidden = workload.expert_ffn_hidden_size, workload.hidden_size
    if not width or not hidden:
        return 0.0
    up = 2.0 * width if (workload.mlp or "swiglu") != "gelu" else float(width)
    rows = tokens * (workload.experts_per_token or 1)
    elements = rows * (hidden + up + width + hidden)
    flops = 6.0 * rows * (hidden * up + width * hidden)
    per_flop = FP8_CAST_BYTES_PER_EXPERT_ELEMENT / 6.0 * 2.0 / GEMM_REFERENCE_K
    return max(0.0, FP8_CAST_BYTES_PER_EXPERT_ELEMENT * elements - per_flop * flops)


def layer_time_s(workload: Workload, layout: Layout, hardware: Hardware, precision: str,
                 micro_batch: float, seq_len: float, compute_scale: float = 1.0,
                 overhead_scale: float = 1.0) -> float:
    """:func:`layer_parts_s` summed: the GPU's work (permutation, expert GEMMs, casts) at
    ``compute_scale``, the host's (launches, the sync) at ``overhead_scale``."""
    if not is_moe(workload):
        return 0.0
    p = layer_parts_s(workload, layout, hardware, precision, micro_batch, seq_len)
    return (compute_scale * (p["permute"] + p["expert_gemm"] + p["fp8_cast"])
            + overhead_scale * (p["dispatch"] + p["sync"]))


def expert_params_per_gpu(workload: Workload, layout: Layout) -> float:
    """Routed-expert parameters one GPU holds under expert parallelism (``etp × pp × ep``
    ways, :func:`expert_tp`) before data-parallel sharding; 0 without ``ep`` (the experts
    are then split like the dense weights)."""
    if layout.ep <= 1:
        return 0.0
    return routed_expert_params(workload) / (expert_tp(workload, layout) * layout.pp
                                             * layout.ep)


def params_per_shard(workload: Workload, layout: Layout) -> float:
    """Parameters one tensor/pipeline/expert shard holds before data-parallel sharding: the
    dense ones over ``tp × pp``, the routed experts over ``etp × pp × ep``
    (:func:`expert_params_per_gpu`)."""
    experts = routed_expert_params(workload) if layout.ep > 1 else 0.0
    return ((workload.params - experts) / (layout.tp * layout.pp)
            + expert_params_per_gpu(workload, layout))


def optimizer_params_per_gpu(workload: Workload, layout: Layout) -> float:
    """Parameters one GPU's sharded optimizer (ZeRO, FSDP) steps: the dense ones of its
    :func:`params_per_shard` over the ``dp`` ranks, the routed experts over their
    :func:`expert_data_parallel` group (Megatron's distributed optimizer shards each
    parameter over the ranks that reduce its gradient)."""
    shard = params_per_shard(workload, layout)
    if layout.ep <= 1 or not is_moe(workload):
        return shard / layout.dp
    experts = expert_params_per_gpu(workload, layout)
    return (shard - experts) / layout.dp + experts / expert_data_parallel(workload, layout)


def largest_unit_params(workload: Workload, layout: Layout, largest: float) -> float:
    """The largest unit FSDP / ZeRO-3 gathers at once, ``largest`` parameters without expert
    parallelism: under ``ep`` a MoE layer's unit holds this rank's ``1/ep`` of its routed
    experts only (they are sharded over the expert data-parallel group, not gathered from
    the other expert-parallel ranks), and stays at least the embedding matrix."""
    layers = moe_layers(workload)
    if layout.ep <= 1 or not layers:
        return largest
    per_layer = routed_expert_params(workload) / layers
    if per_layer >= largest:  # the largest unit is not a MoE layer holding all its experts
        return largest
    embedding = float(workload.vocab_size or 0) * float(workload.hidden_size or 0)
    return max(largest - per_layer * (1.0 - 1.0 / layout.ep), min(largest, embedding))


def _overlap_words(workload: Workload, layout: Layout, overlapped: bool) -> str:
    """How the notes say the all-to-alls meet the compute (``overlapped``: the prediction ran
    the 1F1B overlap)."""
    mode = normalize_a2a_overlap(workload.moe_a2a_overlap)
    if mode == "none":
        return "on the critical path (not overlapped)"
    why = a2a_overlap_blocker(workload, layout)
    if why:
        return f"on the critical path (the 1F1B overlap asked is not applied: {why})"
    if not overlapped:
        return ("on the critical path (the 1F1B overlap, moe_a2a_overlap auto, left off: "
                "it would cost more here than it hides)")
    return ("added under the 1F1B overlap (each under the paired micro-batch's attention "
            "or experts, whose GEMMs it slows)")


def notes(workload: Workload, layout: Layout, alltoall_step_s: float,
          alltoall_total_s: float, overlapped: bool) -> tuple[str, ...]:
    """The expert-parallel all-to-all a prediction counted, in words (the config.json reader
    says what the FLOPs and parameters are): ``alltoall_step_s`` on the critical path,
    ``alltoall_total_s`` its own seconds (they differ under the 1F1B overlap, which the
    prediction ran where ``overlapped``)."""
    out = []
    if is_moe(workload) and layout.ep > 1:
        cf = workload.capacity_factor
        how = normalize_dispatcher(workload.moe_dispatcher)
        out.append(f"expert parallel ep{layout.ep}: experts sharded {layout.ep} ways; "
                   f"{how} dispatcher"
                   + (f" ({normalize_routing(workload.moe_routing)} routing)"
                      if how == "flex" else "")
                   + f", {ALLTOALLS_PER_LAYER} "
                   + ("all-to-alls" if how == "alltoall" else "dispatches and combines")
                   + " per MoE layer per micro-step, "
                   f"{alltoall_step_s * 1e3:.3g} ms per step "
                   + _overlap_words(workload, layout, overlapped) + ", "
                   + ("across nodes" if ep_ranks_per_node(workload, layout) < layout.ep
                      else "inside a node")
                   + (f", experts tensor parallel {expert_tp(workload, layout)}"
                      if expert_tp(workload, layout) != layout.tp else "")
                   + (f", capacity factor {cf:g}" if cf else
                      ", dropless at an even load (no capacity factor given)"))
        if overlapped and alltoall_total_s > 0 and alltoall_step_s > alltoall_total_s:
            out.append(f"the 1F1B all-to-all overlap costs more here than it hides: "
                       f"{alltoall_step_s * 1e3:.3g} ms per step with it (the paired GEMMs "
                       f"{A2A_OVERLAP_GEMM_COST:.0%} less efficient beside the communication) "
                       f"against {alltoall_total_s * 1e3:.3g} ms of all-to-all without it: "
                       f"plan this layout without --moe-a2a-overlap (or with auto)")
    return tuple(out)
