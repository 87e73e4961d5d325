"""Mixture of experts: which parameters expert parallelism shards, and the all-to-all
dispatch and combine it costs (docs/models.md#mixture-of-experts).

A MoE layer sends each token's hidden vector to the ``experts_per_token`` ranks holding its
experts and back: with ``ep`` expert-parallel ranks, 2 all-to-alls in forward (dispatch,
combine) and 2 in backward, each moving ``tokens × hidden × top-k × element bytes`` per
GPU, of which ``(ep − 1)/ep`` leaves the GPU. A capacity factor lets the busiest rank take
that many times its even share, and every rank waits for it. They are not overlapped.
"""

from __future__ import annotations

from mlflow_gpuopt.perfmodel import comm
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import Layout
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

#: all-to-alls per MoE layer per micro-step: dispatch and combine, forward and backward
ALLTOALLS_PER_LAYER = 4


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
    nbytes = alltoall_bytes_per_layer(workload, tokens, act_bytes) * (layout.ep - 1) / layout.ep
    layers = max(1, moe_layers(workload) // layout.pp)
    # bytes leaving the GPU: comm.alltoall_s takes what a rank sends to all its peers
    per_call = comm.alltoall_s(nbytes, layout.ep, layout.ep_ranks_per_node, hardware)
    return ALLTOALLS_PER_LAYER * layers * per_call


def params_per_shard(workload: Workload, layout: Layout) -> float:
    """Parameters one tensor/pipeline/expert shard holds before data-parallel sharding: the
    dense ones over ``tp × pp``, the routed experts over ``tp × pp × ep``."""
    experts = routed_expert_params(workload) if layout.ep > 1 else 0.0
    shards = layout.tp * layout.pp
    return (workload.params - experts) / shards + experts / (shards * layout.ep)


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


def notes(workload: Workload, layout: Layout, alltoall_step_s: float) -> tuple[str, ...]:
    """The expert-parallel all-to-all a prediction counted, in words (the config.json reader
    says what the FLOPs and parameters are)."""
    out = []
    if is_moe(workload) and layout.ep > 1:
        cf = workload.capacity_factor
        out.append(f"expert parallel ep{layout.ep}: experts sharded {layout.ep} ways; "
                   f"{ALLTOALLS_PER_LAYER} all-to-alls per MoE layer per micro-step, "
                   f"{alltoall_step_s * 1e3:.3g} ms per step, not overlapped, "
                   + ("across nodes" if layout.ep_spans_nodes else "inside a node")
                   + (f", capacity factor {cf:g}" if cf else
                      ", dropless at an even load (no capacity factor given)"))
    return tuple(out)
