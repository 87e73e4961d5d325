"""Expert parallelism: the ``ep`` degree of a strategy string, where it must divide, the
expert weights it shards, and the all-to-all it costs (by hand, from the docs' formula)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import moe
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import expert_degree, parse_layout, resolve_layout
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"bf16": 989.4e12}, intra_node_bytes_per_s=450e9,
                inter_node_bytes_per_s=400e9)
# Mixtral-8x7B's shape: 32 MoE layers of 8 experts, 2 per token, experts 14336 wide
H, F, L, E, K = 4096, 14336, 32, 8, 2
EXPERTS = L * E * 3 * H * F
MIXTRAL = Workload(params=46_702_792_704, flops_per_sample=3.4e14, precision="bf16",
                   micro_batch=1, tokens_per_sample=4096, num_layers=L, hidden_size=H,
                   num_heads=32, num_kv_heads=8, vocab_size=32000, ffn_hidden_size=K * F,
                   mlp="swiglu", num_experts=E, experts_per_token=K, expert_ffn_hidden_size=F,
                   optimizer="adamw")


def test_ep_is_a_degree_of_the_strategy_string():
    assert expert_degree("ep8xfsdp") == 8 and expert_degree("tp2xep4xfsdp") == 4
    assert expert_degree("fsdp") == 1
    assert parse_layout("tp2xep8xfsdp") == ("fsdp", 2, 1, 1, 0)
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=2, strategy="tp2xep8xfsdp"))
    assert (layout.tp, layout.dp, layout.ep) == (2, 8, 8)
    assert layout.ep_spans_nodes  # 4 data-parallel ranks per node, 8 in the group
    assert not resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp")
                              ).ep_spans_nodes


@pytest.mark.parametrize("text, words", [
    ("ep", "ep needs a number"), ("ep2xep4", "expert-parallel part twice")])
def test_bad_ep_parts_are_one_line(text, words):
    with pytest.raises(PerfModelError, match=words):
        parse_layout(text)


def test_ep_divides_the_data_parallel_degree_and_the_experts():
    with pytest.raises(PerfModelError, match="must divide tp2 x the data-parallel degree 4"):
        resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp2xep16xfsdp"))
    # ep8 over tp2 x dp4: only with the experts unsplit (MoE parallel folding); Megatron's
    # default splits them over tp as well, and 2 x 8 ranks are more than the 8
    folded = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp2xep8xfsdp"))
    with pytest.raises(PerfModelError, match="--expert-tensor-parallel 1"):
        moe.check_experts(MIXTRAL, folded)
    moe.check_experts(replace(MIXTRAL, expert_tensor_parallel=1), folded)
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    moe.check_experts(MIXTRAL, layout)
    with pytest.raises(PerfModelError, match="must divide the 6 experts"):
        moe.check_experts(replace(MIXTRAL, num_experts=6), layout)
    dense = replace(MIXTRAL, num_experts=None, experts_per_token=None)
    with pytest.raises(PerfModelError, match="mixture-of-experts workload"):
        moe.check_experts(dense, layout)


def test_expert_states_are_sharded_by_ep_under_ddp():
    """DDP: bf16 mixed precision keeps 2 + 2 + (4 + 8) bytes per parameter; each ep rank
    holds 1/ep of the experts, every rank the rest."""
    assert moe.routed_expert_params(MIXTRAL) == EXPERTS
    base = memory_per_gpu(MIXTRAL, ParallelConfig(gpus_per_node=8, strategy="ddp"))
    ep = memory_per_gpu(MIXTRAL, ParallelConfig(gpus_per_node=8, strategy="ep8xddp"))
    saved = EXPERTS * (1 - 1 / 8)
    assert base.weights_bytes - ep.weights_bytes == pytest.approx(2 * saved)
    assert base.gradients_bytes - ep.gradients_bytes == pytest.approx(2 * saved)
    assert base.optimizer_bytes - ep.optimizer_bytes == pytest.approx(12 * saved)


def test_fsdp_with_ep_keeps_the_per_gpu_states():
    """FSDP over 8 ranks or ep8 (experts whole on their rank, the rest sharded 8 ways): the
    optimizer state per GPU is the same Ψ/8."""
    fsdp = memory_per_gpu(MIXTRAL, ParallelConfig(gpus_per_node=8, strategy="fsdp"))
    ep = memory_per_gpu(MIXTRAL, ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    assert ep.optimizer_bytes == pytest.approx(fsdp.optimizer_bytes)


def test_alltoall_inside_a_node_by_hand():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    t = moe.alltoall_s(MIXTRAL, layout, H100, micro_batch=1, seq_len=4096, act_bytes=2)
    sent = 4096 * H * K * 2 * 7 / 8  # tokens × hidden × top-k × bytes, the 7/8 that leave
    one = 5e-6 + sent / (450e9 * 0.75)
    assert t == pytest.approx(4 * L * one)
    # a capacity factor of 1.25: the busiest rank's 25 % more
    t_cf = moe.alltoall_s(replace(MIXTRAL, capacity_factor=1.25), layout, H100, 1, 4096, 2)
    assert t_cf == pytest.approx(4 * L * (5e-6 + 1.25 * sent / (450e9 * 0.75)))
    assert moe.alltoall_s(MIXTRAL, resolve_layout(ParallelConfig(gpus_per_node=8,
                                                                 strategy="fsdp")),
                          H100, 1, 4096, 2) == 0


def test_alltoall_across_nodes_waits_on_the_network():
    """ep16 over 2 nodes: 7 of 15 peers over NVLink, 8 over the GPU's 50 GB/s NIC share."""
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=2, strategy="ep16xfsdp"))
    w = replace(MIXTRAL, num_experts=16)
    t = moe.alltoall_s(w, layout, H100, 1, 4096, 2)
    sent = 4096 * H * K * 2 * 15 / 16
    inter = sent * 8 / 15 / (400e9 / 8)
    assert t == pytest.approx(4 * L * (20e-6 + inter))


def test_the_expert_group_sits_next_to_tensor_parallel_inside_the_pipeline_stages():
    """Megatron-core's rank order tp-cp-ep-dp-pp (torchtitan: pp outermost): pp8 × ep8 over
    8 nodes keeps each expert-parallel group of 8 inside one node, so its all-to-all is the
    NVLink one, not the network's."""
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=8,
                                           strategy="pp8xep8xzero1"))
    assert (layout.pp, layout.dp, layout.ep, layout.ep_ranks_per_node) == (8, 8, 8, 8)
    assert not layout.ep_spans_nodes
    t = moe.alltoall_s(MIXTRAL, layout, H100, 1, 4096, 2)
    one = 5e-6 + 4096 * H * K * 2 * 7 / 8 / (450e9 * 0.75)
    assert t == pytest.approx(4 * (L // 8) * one)
    # with tp2 an ep8 group spans two nodes (4 of its ranks per node)
    wide = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=2,
                                         strategy="tp2xep8xzero1"))
    assert (wide.ep_ranks_per_node, wide.ep_spans_nodes) == (4, True)


def test_fsdp_gathers_a_moe_layer_with_this_ranks_experts_only():
    """Under ep the unit FSDP gathers holds 1/ep of the layer's routed experts (they are not
    gathered from the other expert-parallel ranks), never less than the embedding."""
    layer = 4 * H * H + E * H + E * 3 * H * F  # attention (about), router, all experts
    w = replace(MIXTRAL, largest_layer_params=layer)
    ep8 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    per_layer = E * 3 * H * F
    assert moe.largest_unit_params(w, ep8, layer) == pytest.approx(
        layer - per_layer + per_layer / 8)
    fsdp = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="fsdp"))
    assert moe.largest_unit_params(w, fsdp, layer) == layer
    huge_vocab = replace(w, vocab_size=10**7)  # the embedding is the larger unit
    assert moe.largest_unit_params(huge_vocab, ep8, layer) == layer
    # and the gathered buffer under ep8xfsdp shrinks accordingly
    small = memory_per_gpu(w, ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    whole = memory_per_gpu(w, ParallelConfig(gpus_per_node=8, strategy="fsdp"))
    assert small.weights_bytes < whole.weights_bytes


def test_first_dense_layers_leave_the_alltoall_of_those_layers_out():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
    full = moe.alltoall_s(MIXTRAL, layout, H100, 1, 4096, 2)
    three_dense = moe.alltoall_s(replace(MIXTRAL, first_dense_layers=3), layout, H100, 1,
                                 4096, 2)
    assert three_dense == pytest.approx(full * (L - 3) / L)
