"""The routed experts' own tensor-parallel degree (``Workload.expert_tensor_parallel``,
Megatron's ``expert_tensor_parallel_size``): where the expert-parallel ranks sit, what
DeepEP sends across nodes for them, and the expert weights a GPU holds, worked out by hand
from docs/models.md#mixture-of-experts."""

from __future__ import annotations

import json
from dataclasses import replace
from math import comb

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import moe
from mlflow_gpuopt.perfmodel.fitting import fit_calibration
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import observations_to_csv, parse_observations_csv

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9, tdp_w=700.0)
V3 = Workload(params=671e9, flops_per_sample=2.6e15, precision="bf16", micro_batch=1,
              tokens_per_sample=4096, num_layers=61, hidden_size=7168, num_heads=128,
              vocab_size=129280, num_experts=256, experts_per_token=8,
              expert_ffn_hidden_size=2048, first_dense_layers=3, num_expert_groups=8,
              expert_groups_per_token=4, moe_dispatcher="flex", optimizer="adamw")
# DeepSeek-V3 on 1,024 H100 as Megatron-Bridge runs it: tp2 x pp8 x ep64
CONFIG = ParallelConfig(gpus_per_node=8, nodes=128, strategy="tp2xpp8xep64xzero1",
                        micro_batch=1, grad_accum=64, precision="bf16")
LAYOUT = resolve_layout(CONFIG)


def test_the_experts_tensor_parallel_divides_tp():
    assert moe.expert_tp(V3, LAYOUT) == 2  # none given: tp
    assert moe.expert_tp(replace(V3, expert_tensor_parallel=1), LAYOUT) == 1
    assert moe.expert_tp(replace(V3, expert_tensor_parallel=3), LAYOUT) == 1  # gcd(3, 2)
    tp4 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp4xep2xzero1"))
    assert moe.expert_tp(replace(V3, expert_tensor_parallel=2), tp4) == 2


def test_expert_ranks_fill_the_node_without_expert_tensor_parallel():
    # tp2: 4 pairs a node hold 4 expert ranks; experts unsplit: 8 expert ranks a node
    assert LAYOUT.ep_ranks_per_node == 4
    assert moe.ep_ranks_per_node(V3, LAYOUT) == 4
    assert moe.ep_ranks_per_node(replace(V3, expert_tensor_parallel=1), LAYOUT) == 8
    # a group inside a node stays there: tp2 x ep4 on 8 GPUs
    small = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp2xep4xzero1"))
    assert moe.ep_ranks_per_node(replace(V3, expert_tensor_parallel=1), small) == 4


def test_deepep_reaches_the_chosen_groups_when_a_node_holds_one():
    etp1 = replace(V3, expert_tensor_parallel=1)
    tokens = 4096 / 2  # the GPU's tokens under sequence parallel
    row = tokens * 7168 * 2
    # 8 nodes of 32 experts, one routing group each: a token reaches its 4 chosen groups'
    # nodes, 7/8 of them remote
    inter = row * 4 * 7 / 8 / (400e9 / 8 * 43 / 50)
    ranks = 64 * 4 / 8 * (1 - comb(28, 2) / comb(32, 2))
    intra = row * ranks * 63 / 64 / (450e9 * 153 / 160)
    assert inter > intra
    assert moe.flex_dispatch_s(etp1, LAYOUT, H100, tokens, 2) == pytest.approx(20e-6 + inter)
    # with the experts split over tp pairs: 16 nodes, 6.06 of them reached
    nodes16 = 16 * 4 / 8 * (1 - comb(16, 2) / comb(32, 2))
    assert moe.flex_dispatch_s(V3, LAYOUT, H100, tokens, 2) == pytest.approx(
        20e-6 + row * nodes16 * 15 / 16 / (400e9 / 8 * 43 / 50))


def test_unsplit_experts_hold_twice_the_weights_per_gpu():
    routed = 58 * 256 * 3 * 7168 * 2048
    split = moe.params_per_shard(V3, LAYOUT)
    whole = moe.params_per_shard(replace(V3, expert_tensor_parallel=1), LAYOUT)
    assert split == pytest.approx((671e9 - routed) / 16 + routed / (2 * 8 * 64))
    assert whole - split == pytest.approx(routed / (8 * 64) / 2)
    # ZeRO-1 leaves the weights whole on each GPU: their bytes grow by as much, at the
    # bytes a weight takes in the dense layers of the same run
    dense_per_param = memory_per_gpu(replace(V3, num_experts=None),
                                     CONFIG).weights_bytes / (671e9 / 16)
    grown = (memory_per_gpu(replace(V3, expert_tensor_parallel=1), CONFIG).weights_bytes
             - memory_per_gpu(V3, CONFIG).weights_bytes)
    assert grown == pytest.approx(routed / (8 * 64) / 2 * dense_per_param)


def test_a_run_is_read_with_its_own_expert_tensor_parallel():
    obs = Observation(gpu="H100-SXM5-80GB", gpu_count=1024, nodes=128, micro_batch=1,
                      strategy="tp2xpp8xep64xzero1", precision="bf16", grad_accum=64,
                      throughput_samples_per_s=300.0)
    text = observations_to_csv([replace(obs, expert_tensor_parallel=1)])
    (read,) = parse_observations_csv(text)
    assert read.expert_tensor_parallel == 1
    hw = {"H100-SXM5-80GB": H100}
    key = ("H100-SXM5-80GB", "bf16")
    marked = fit_calibration(V3, [read], hw)
    as_run = fit_calibration(replace(V3, expert_tensor_parallel=1), [obs], hw)
    misread = fit_calibration(V3, [obs], hw)
    assert marked.log_compute_scale[key] == pytest.approx(as_run.log_compute_scale[key])
    assert marked.comm_scale == pytest.approx(as_run.comm_scale)
    assert abs(misread.comm_scale / marked.comm_scale - 1) > 0.05


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}


def test_the_flag_reaches_predict(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    args = ["predict", "--workload", str(path), "--seq-len", "4096", "--gpu", "H100",
            "--gpus", "8", "--strategy", "tp2xep4xzero1", "--micro-batch", "1", "--json"]
    plain = json.loads(CliRunner().invoke(gpuopt, args).output)
    r = CliRunner().invoke(gpuopt, [*args, "--expert-tensor-parallel", "1"])
    assert r.exit_code == 0, r.output
    etp1 = json.loads(r.output)
    assert "experts tensor parallel 1" in " ".join(etp1["assumptions"])
    assert "experts tensor parallel" not in " ".join(plain["assumptions"])
    # the experts unsplit: more weights on each GPU
    assert etp1["memory"]["weights_bytes"] > plain["memory"]["weights_bytes"]
    bad = CliRunner().invoke(gpuopt, [*args, "--expert-tensor-parallel", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
