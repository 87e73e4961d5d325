"""torchao tensor-wise FP8 all-gathers in FP8: the sequence-parallel activations
(``comm.tp_gather_element_bytes``: of each tensor-parallel all-reduce's volume the all-gather
half moves 1 byte per element, the reduce-scatter half stays at 2; rowwise and Transformer
Engine keep both at 2) and, where the workload says ``fp8_all_gather``, the FSDP weight
gathers (``comm.fp8_gather_scale``); gradients' reduce-scatters stay bf16
(docs/models.md#communication-commpy)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from support.perfmodel import A100

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import ParallelConfig, comm
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.step import fsdp_gather_scales
from mlflow_gpuopt.workload_files import workload_from_dict


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


# -- FSDP all-gathers of FP8 weights in FP8 (the workload's fp8_all_gather) ------------------
def _fsdp8():
    return resolve_layout(ParallelConfig(gpus_per_node=8, nodes=1, strategy="fsdp"))


def test_gather_scale_halves_the_fp8_share_only():
    assert comm.fp8_gather_scale(100.0, 80.0) == pytest.approx(0.5 * 80 / 100 + 20 / 100)
    assert comm.fp8_gather_scale(100.0, 100.0) == 0.5
    assert comm.fp8_gather_scale(100.0, 0.0) == 1.0


def test_fsdp_sync_volume_with_fp8_gathers():
    # 1e9 params at 2 bytes over 8 A100s: a reduce-scatter (half an all-reduce) at 2 bytes,
    # two all-gathers at 1 byte (gather_scale 0.5): 0.5 + 1.0 × 0.5 = 1 all-reduce's volume
    psi = 1e9
    bw = 300e9 * comm.BUS_EFFICIENCY
    allreduce = 2 * 7 / 8 * psi * 2 / bw + 2 * 7 * comm.INTRA_NODE_LATENCY_S
    assert comm.dp_sync_s(psi, 2, _fsdp8(), A100, 0.5) == pytest.approx(1.0 * allreduce)
    assert comm.dp_sync_s(psi, 2, _fsdp8(), A100) == pytest.approx(1.5 * allreduce)


def test_fsdp_exposed_with_nothing_to_hide_under():
    # No compute to overlap: every gather and reduce-scatter is exposed. 4 units of 1 GB each
    # (4 GB sharded bytes) over 8 A100s; gathers at 0.5 of the bytes, reduce-scatters at all.
    shard, unit, n = 4e9, 1e9, 4
    bw = 300e9 * comm.BUS_EFFICIENCY
    lat = 2 * 7 * comm.INTRA_NODE_LATENCY_S

    def half_allreduce(nbytes):  # an all-gather or reduce-scatter of nbytes
        return 0.5 * (2 * 7 / 8 * nbytes / bw + lat)

    gather = half_allreduce(0.5 * shard) + 0.5 * (n - 1) * (2 * 7 / 8 / bw + lat)
    scatter = half_allreduce(shard) + 0.5 * (n - 1) * (2 * 7 / 8 / bw + lat)
    got = comm.fsdp_exposed_s(shard, unit, n, _fsdp8(), A100, 0.0, 0.0, 1.0, 0.5, 0.5)
    assert got == pytest.approx(2 * gather + scatter)


LLAMA8B = {"name": "llama3_8b", "params": 8030261248, "flops_per_sample": 6 * 8.03e9 * 8192,
           "precision": "fp8", "fp8_recipe": "tensorwise", "optimizer": "AdamW",
           "micro_batch": 1, "tokens_per_sample": 8192, "num_layers": 32, "hidden_size": 4096,
           "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336, "mlp": "swiglu",
           "vocab_size": 128256, "attention": "sdpa", "dropout": 0, "recompute": "full"}


def test_gather_scales_of_llama3_8b():
    # embedding + output 2 × 128256 × 4096 = 1.0507e9 of 8.0303e9 parameters stay bf16
    w = workload_from_dict(LLAMA8B)
    fp8 = 8030261248 - 2 * 128256 * 4096
    whole, unit = fsdp_gather_scales(replace(w, fp8_all_gather=True), "fp8")
    assert whole == pytest.approx(1 - 0.5 * fp8 / 8030261248)
    assert unit == 0.5
    assert fsdp_gather_scales(w, "fp8") == (1.0, 1.0)  # not stated: bf16 gathers
    assert fsdp_gather_scales(replace(w, fp8_all_gather=True), "bf16") == (1.0, 1.0)


def _fsdp_predict(tmp_path, doc):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                       "NVIDIA H100 80GB HBM3", "--gpus", "16", "--strategy",
                                       "fsdp", "--micro-batch", "1", "--precision", "fp8",
                                       "--json"])


def test_fp8_all_gather_shortens_an_fsdp_step(tmp_path):
    plain = _fsdp_predict(tmp_path, LLAMA8B)
    fp8 = _fsdp_predict(tmp_path, {**LLAMA8B, "fp8_all_gather": True})
    assert plain.exit_code == 0 and fp8.exit_code == 0, plain.output + fp8.output
    a, b = json.loads(plain.stdout), json.loads(fp8.stdout)
    assert b["time_breakdown"]["exposed_comm_s"] < a["time_breakdown"]["exposed_comm_s"]
    assert b["step_time_s"] < a["step_time_s"]


def test_fp8_all_gather_with_rowwise_is_one_clear_line(tmp_path):
    res = _fsdp_predict(tmp_path, {**LLAMA8B, "fp8_recipe": "rowwise", "fp8_all_gather": True})
    assert res.exit_code == 2
    assert "fp8_all_gather" in res.output and "tensorwise" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
