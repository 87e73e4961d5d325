"""The token dispatcher (``Workload.moe_dispatcher``) and the routing it sees
(``moe_routing``): what each sends per dispatch, at what rate, and the permutation copies it
makes, worked out by hand from docs/models.md#mixture-of-experts."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest

from mlflow_gpuopt.perfmodel import moe
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)
# Qwen3-30B-A3B's MoE shape: 48 layers, hidden 2048, 128 experts, top-8, 768 wide
H, L, E, K, SEQ = 2048, 48, 128, 8, 4096
QWEN = Workload(params=30_532_122_624, flops_per_sample=8.1e13, precision="bf16",
                micro_batch=1, tokens_per_sample=SEQ, num_layers=L, hidden_size=H,
                num_heads=32, num_kv_heads=4, vocab_size=151936, ffn_hidden_size=K * 768,
                mlp="swiglu", num_experts=E, experts_per_token=K, expert_ffn_hidden_size=768,
                optimizer="adamw")
EP8 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
ROW = SEQ * H * 2  # one micro-step's hidden states of one GPU, bf16 bytes


def test_random_routing_reaches_the_hypergeometric_number_of_ranks():
    # 8 experts, top-2, 4 ranks of 2: a rank is missed with C(6,2)/C(8,2) = 15/28
    assert moe.distinct_groups(8, 2, 4) == pytest.approx(4 * (1 - 15 / 28))
    # Qwen3-30B-A3B on ep8 (16 experts a rank): missed with prod (112-i)/(128-i), i < 8
    miss = Fraction(1)
    for i in range(8):
        miss *= Fraction(112 - i, 128 - i)
    assert moe.distinct_groups(128, 8, 8) == pytest.approx(8 * (1 - float(miss)))
    assert 5.3 < moe.distinct_groups(128, 8, 8) < 5.4
    assert moe.distinct_groups(128, 8, 1) == 1.0


def test_round_robin_routing_keeps_a_token_on_few_ranks():
    # token t takes experts 2t, 2t+1 (mod 8): always one rank of 2 experts
    assert moe.distinct_groups(8, 2, 4, "round_robin") == 1.0
    # top-3: {0,1,2}, {3,4,5}, {6,7,0}, {1,2,3}, ...: every token spans 2 of the 4 ranks
    assert moe.distinct_groups(8, 3, 4, "round_robin") == 2.0
    # Qwen3-30B-A3B on ep8: 8 consecutive experts inside one rank's 16
    assert moe.distinct_groups(128, 8, 8, "round_robin") == 1.0
    # DeepSeek-V3 (256 experts, top-8) on ep64: 2 ranks of 4, inside one node of 32
    assert moe.distinct_groups(256, 8, 64, "round_robin") == 2.0
    assert moe.distinct_groups(256, 8, 8, "round_robin") == 1.0


def test_alltoall_sends_every_routed_copy_at_the_collectives_rate():
    per_call = 5e-6 + ROW * K * 7 / 8 / (450e9 * 0.75)
    assert moe.alltoall_s(QWEN, EP8, H100, 1, SEQ, 2) == pytest.approx(4 * L * per_call)
    assert moe.alltoall_s(replace(QWEN, moe_dispatcher="alltoall"), EP8, H100, 1, SEQ,
                          2) == pytest.approx(4 * L * per_call)


def test_flex_sends_one_copy_per_destination_rank_at_deepeps_nvlink_rate():
    flex = replace(QWEN, moe_dispatcher="flex")
    ranks = moe.distinct_groups(E, K, 8)
    per_call = 5e-6 + ROW * ranks * 7 / 8 / (450e9 * 153 / 160)
    assert moe.alltoall_s(flex, EP8, H100, 1, SEQ, 2) == pytest.approx(4 * L * per_call)
    rr = replace(flex, moe_routing="round_robin")
    per_call = 5e-6 + ROW * 1 * 7 / 8 / (450e9 * 153 / 160)
    assert moe.alltoall_s(rr, EP8, H100, 1, SEQ, 2) == pytest.approx(4 * L * per_call)


def test_flex_across_nodes_sends_once_per_node_over_the_network():
    flex = replace(QWEN, moe_dispatcher="flex")
    ep16 = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=2, strategy="ep16xfsdp"))
    assert ep16.ep_ranks_per_node == 8 and ep16.ep_spans_nodes
    ranks = moe.distinct_groups(E, K, 16)
    nodes_hit = moe.distinct_groups(E, K, 2)  # 2 nodes of 64 experts
    nvlink = ROW * ranks * 15 / 16 / (450e9 * 153 / 160)
    rdma = ROW * nodes_hit * 1 / 2 / (400e9 / 8 * 43 / 50)
    assert moe.alltoall_s(flex, ep16, H100, 1, SEQ, 2) == pytest.approx(
        4 * L * (20e-6 + max(nvlink, rdma)))


def test_allgather_sends_every_token_to_every_rank():
    gather = replace(QWEN, moe_dispatcher="allgather")
    per_call = 5e-6 + ROW * 7 / (450e9 * 0.75)
    assert moe.alltoall_s(gather, EP8, H100, 1, SEQ, 2) == pytest.approx(4 * L * per_call)
    # a capacity factor pads the experts, not the gather: the same bytes
    padded = replace(gather, capacity_factor=1.25)
    assert moe.alltoall_s(padded, EP8, H100, 1, SEQ, 2) == pytest.approx(4 * L * per_call)
    # the all-to-all's busiest rank takes 1.25 x its share
    a2a = moe.alltoall_s(QWEN, EP8, H100, 1, SEQ, 2)
    assert moe.alltoall_s(replace(QWEN, capacity_factor=1.25), EP8, H100, 1, SEQ,
                          2) == pytest.approx(4 * L * (5e-6 + 1.25 * (a2a / (4 * L) - 5e-6)))


def test_fused_dispatchers_copy_the_routed_tokens_half_as_often():
    base = moe.layer_parts_s(QWEN, EP8, H100, "bf16", 1, SEQ)["permute"]
    assert base == pytest.approx(L * 16 * SEQ * K * H * 2 / (3.35e12 * 0.75))
    for how in ("flex", "allgather"):
        got = moe.layer_parts_s(replace(QWEN, moe_dispatcher=how), EP8, H100, "bf16", 1,
                                SEQ)["permute"]
        assert got == pytest.approx(base / 2)


def test_the_dispatcher_is_read_in_megatrons_and_torchtitans_words():
    doc = {"params": 30_532_122_624, "flops_per_sample": 8.1e13, "precision": "bf16",
           "num_experts": 128, "experts_per_token": 8}
    assert workload_from_dict({**doc, "moe_token_dispatcher_type": "flex"}).moe_dispatcher \
        == "flex"
    assert workload_from_dict({**doc, "expert_parallel_comm_backend": "DeepEP"}) \
        .moe_dispatcher == "flex"
    assert workload_from_dict({**doc, "moe_dispatcher": "all_to_all"}).moe_dispatcher \
        == "alltoall"
    assert workload_from_dict({**doc, "moe_routing": "round-robin"}).moe_routing \
        == "round_robin"
    assert workload_from_dict(doc).moe_dispatcher is None  # alltoall, Megatron's default
    with pytest.raises(WorkloadFileError, match="unknown moe_dispatcher 'nccl'"):
        workload_from_dict({**doc, "moe_dispatcher": "nccl"})
    with pytest.raises(WorkloadFileError, match="unknown moe_routing"):
        workload_from_dict({**doc, "moe_routing": "sorted"})


def test_an_unknown_dispatcher_on_the_record_is_one_clear_error():
    with pytest.raises(PerfModelError, match="unknown moe_dispatcher"):
        moe.check_experts(replace(QWEN, moe_dispatcher="nccl"), EP8)


def test_predict_takes_the_dispatcher_flag(tmp_path):
    from click.testing import CliRunner

    from mlflow_gpuopt.cli import gpuopt

    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
              "vocab_size": 151936, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = ["--workload", str(path), "--seq-len", "4096", "--gpu", "NVIDIA H100 80GB HBM3",
            "--gpus", "8", "--strategy", "ep8xfsdp", "--micro-batch", "1", "--json"]
    runner = CliRunner()
    got = {}
    for how in ("alltoall", "flex"):
        res = runner.invoke(gpuopt, ["predict", *args, "--moe-dispatcher", how])
        assert res.exit_code == 0, res.output
        got[how] = json.loads(res.output)["time_breakdown"]["alltoall_s"]
    assert got["flex"] < got["alltoall"]
    bad = runner.invoke(gpuopt, ["predict", *args, "--moe-dispatcher", "nccl"])
    assert bad.exit_code == 2, bad.output
    assert "--moe-dispatcher: unknown moe_dispatcher 'nccl'" in bad.output
    assert "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_predict_takes_the_schedule_runs_flag(tmp_path):
    from mlflow_gpuopt.cli import gpuopt
    from click.testing import CliRunner

    doc = {"name": "w", "params": 7_000_000_000, "flops_per_sample": 6 * 7e9 * 4096,
           "precision": "bf16", "tokens_per_sample": 4096, "num_layers": 32,
           "hidden_size": 4096, "num_heads": 32, "vocab_size": 32000, "optimizer": "adamw"}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    args = ["predict", "--workload", str(path), "--gpu", "NVIDIA H100 80GB HBM3", "--gpus",
            "8", "--strategy", "pp4xddp", "--micro-batch", "1", "--grad-accum", "8", "--json"]
    runner = CliRunner()
    whole = runner.invoke(gpuopt, args)
    runs = runner.invoke(gpuopt, [*args, "--pp-microbatches", "2"])
    assert whole.exit_code == 0 and runs.exit_code == 0, whole.output + runs.output
    one = json.loads(whole.output)["time_breakdown"]["bubble_s"]
    four = json.loads(runs.output)["time_breakdown"]["bubble_s"]
    assert one > 0 and four == pytest.approx(4 * one)
