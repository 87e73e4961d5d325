"""torchao tensor-wise FP8 all-gathers the sequence-parallel activations in FP8
(``comm.tp_gather_element_bytes``): of each tensor-parallel all-reduce's volume the all-gather
half moves 1 byte per element, the reduce-scatter half stays at 2; rowwise and Transformer
Engine keep both at 2 (docs/models.md#communication-commpy)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.perfmodel import A100

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import comm


def test_only_tensorwise_fp8_gathers_in_one_byte():
    assert comm.tp_gather_element_bytes("fp8", "tensorwise", 2) == 1.0
    assert comm.tp_gather_element_bytes("fp8", "rowwise", 2) == 2
    assert comm.tp_gather_element_bytes("fp8", "rowwise_with_gw_hp", 2) == 2
    assert comm.tp_gather_element_bytes("fp8", "te", 2) == 2
    assert comm.tp_gather_element_bytes("bf16", "tensorwise", 2) == 2


def test_fp8_gathers_hand_computed():
    # b=4, s=1024, h=4096 over tp 4 on A100 (300 GB/s NVLink): per all-reduce the gather moves
    # 4·1024·4096·1 bytes and the reduce-scatter 4·1024·4096·2, each (n−1)/n of it per GPU
    gather, scatter = 4 * 1024 * 4096 * 1, 4 * 1024 * 4096 * 2
    bw = 300e9 * comm.BUS_EFFICIENCY
    one = 3 / 4 * (gather + scatter) / bw + 2 * 3 * comm.INTRA_NODE_LATENCY_S
    got = comm.tp_allreduce_s(24, 4, 1024, 4096, 2, 4, A100, gather_bytes=1.0)
    assert got == pytest.approx(4 * 24 * one)
    # the default is the reduce-scatters' element size: 2 bytes both ways
    both16 = 3 / 4 * 2 * scatter / bw + 2 * 3 * comm.INTRA_NODE_LATENCY_S
    assert comm.tp_allreduce_s(24, 4, 1024, 4096, 2, 4, A100) == pytest.approx(4 * 24 * both16)


# Llama 3 70B from its card, tensor-parallel 8 on one 8 × H100 node, FP8.
CARD = {"name": "llama3_70b", "params": 70553706496, "flops_per_sample": 6 * 70.55e9 * 8192,
        "precision": "fp8", "optimizer": "AdamW", "micro_batch": 1, "tokens_per_sample": 8192,
        "num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
        "ffn_hidden_size": 28672, "mlp": "swiglu", "vocab_size": 128256, "attention": "sdpa",
        "dropout": 0, "recompute": "full"}


def _exposed_comm_s(tmp_path, recipe):
    path = tmp_path / f"{recipe}.json"
    path.write_text(json.dumps({**CARD, "fp8_recipe": recipe}))
    res = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                      "NVIDIA H100 80GB HBM3", "--gpus", "8", "--strategy",
                                      "tp8", "--micro-batch", "1", "--precision", "fp8",
                                      "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["time_breakdown"]["exposed_comm_s"]


def test_tensorwise_job_waits_on_three_quarters_of_the_rowwise_traffic(tmp_path):
    # One node, no data parallelism: the exposed communication is the tensor-parallel
    # collectives alone. Per all-reduce of S = 1·8192·8192·2 bytes over 8 H100s (450 GB/s
    # NVLink one way, 0.75 of it): bf16 2·7/8·S/bw + 14·5 µs; tensor-wise 7/8·1.5·S/bw + 14·5 µs.
    s = 8192 * 8192 * 2
    bw = 450e9 * 0.75
    lat = 14 * 5e-6
    expected = (7 / 8 * 1.5 * s / bw + lat) / (2 * 7 / 8 * s / bw + lat)
    ratio = _exposed_comm_s(tmp_path, "tensorwise") / _exposed_comm_s(tmp_path, "rowwise")
    assert ratio == pytest.approx(expected, rel=1e-3)
