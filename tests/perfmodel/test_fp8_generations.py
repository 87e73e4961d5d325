"""FP8 as a precision, efficiency per GPU generation, B200 in the catalog, and ``recommend``
from a workload file before any run exists."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import ParallelConfig
from mlflow_gpuopt.perfmodel.compute import COMPUTE_EFFICIENCY_TENSOR, architecture, \
    tensor_efficiency
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.recommend import allowed_precisions
from mlflow_gpuopt.workload_files import workload_from_dict

WORKLOAD = {"schema": "gpuopt.workload/1", "name": "decoder-7b", "params": 6.7e9,
            "flops_per_sample": 6 * 6.7e9 * 2048, "precision": "bf16", "micro_batch": 2,
            "optimizer": "adamw", "tokens_per_sample": 2048, "num_layers": 32,
            "hidden_size": 4096, "activation_bytes_per_sample": 1.0e9,
            "memory_traffic_bytes_per_sample": 6.0e9}
OBS = ("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
       "H100-SXM5-80GB,8,1,2,30,fsdp,bf16\n")
# (the ``files`` fixture of tests/conftest.py writes WORKLOAD and OBS for each test)


def _cli(*args):
    return CliRunner().invoke(gpuopt, list(args))


def test_architectures_of_catalog_gpus():
    gpus = load_catalog().gpus
    assert {architecture(g) for g in gpus} >= {"volta", "turing", "ampere", "ada", "hopper",
                                               "blackwell", "cdna3"}
    assert "unknown" not in {architecture(g) for g in gpus}


def test_efficiency_per_generation_follows_published_mfu():
    # Ampere (and the older generations the DLE tables set it on) keep the 60%.
    assert tensor_efficiency("A100-80GB-SXM4", "bf16") == COMPUTE_EFFICIENCY_TENSOR
    assert tensor_efficiency("V100-SXM2-16GB", "fp16") == COMPUTE_EFFICIENCY_TENSOR
    # Hopper reaches a smaller share of its doubled peak (MFU 0.46 vs 0.538), FP8 smaller still.
    h_bf16 = tensor_efficiency("H100-SXM5-80GB", "bf16")
    h_fp8 = tensor_efficiency("H100-SXM5-80GB", "fp8")
    assert h_bf16 == pytest.approx(0.6 * 0.46 / 0.538)
    assert h_fp8 == pytest.approx(0.6 * 0.409 / 0.538)
    assert h_fp8 < h_bf16 < COMPUTE_EFFICIENCY_TENSOR
    assert tensor_efficiency("H200-SXM-141GB", "bf16") == h_bf16
    assert tensor_efficiency("B200-SXM-180GB", "fp8") == h_fp8  # no derivation row: Hopper's
    assert tensor_efficiency("L40S", "fp8") < tensor_efficiency("L40S", "bf16")


def test_fp8_memory_keeps_master_weights_and_saves_activations():
    w = workload_from_dict(WORKLOAD)
    bf16 = memory_per_gpu(w, ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=2,
                                            precision="bf16"))
    fp8 = memory_per_gpu(w, ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=2,
                                           precision="fp8"))
    assert fp8.optimizer_bytes == bf16.optimizer_bytes  # fp32 master + Adam states
    assert fp8.gradients_bytes == bf16.gradients_bytes
    assert fp8.weights_bytes > bf16.weights_bytes  # + the FP8 copy of the gathered layer
    assert fp8.activations_bytes == pytest.approx(bf16.activations_bytes * 27 / 34)


def test_predict_fp8_on_h100_is_faster_but_below_the_peak_ratio(files):
    w, o = files
    out = {}
    for prec in ("bf16", "fp8"):
        r = _cli("predict", "--workload", w, "--observations", o, "--gpu", "H100", "--gpus",
                 "8", "--strategy", "fsdp", "--precision", prec, "--json")
        assert r.exit_code == 0, r.output
        out[prec] = json.loads(r.stdout)
    speedup = out["fp8"]["throughput_samples_per_s"] / out["bf16"]["throughput_samples_per_s"]
    assert 1.1 < speedup < 2.0
    assert out["fp8"]["precision"] == "fp8"


@pytest.mark.parametrize("gpu", ["A100-80GB-SXM4", "V100", "A10G"])
def test_predict_fp8_on_a_gpu_without_it_is_refused(files, gpu):
    w, o = files
    r = _cli("predict", "--workload", w, "--observations", o, "--gpu", gpu, "--gpus", "8",
             "--precision", "fp8")
    assert r.exit_code == 2
    assert "has no FP8 tensor cores" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_recommend_offers_fp8_for_transformers_only_where_the_gpu_has_it():
    gpus = load_catalog().gpus
    assert "fp8" in allowed_precisions("bf16", gpus["H100-SXM5-80GB"], linear_layers=True)
    assert "fp8" in allowed_precisions("bf16", gpus["B200-SXM-180GB"], linear_layers=True)
    assert "fp8" not in allowed_precisions("bf16", gpus["A100-80GB-SXM4"], linear_layers=True)
    assert "fp8" not in allowed_precisions("fp16", gpus["H100-SXM5-80GB"])  # a CNN


def test_b200_in_the_catalog_and_pricing_show():
    cat = load_catalog()
    spec = cat.gpus["B200-SXM-180GB"]
    assert spec.fp8_tflops == 4500 and spec.bf16_tflops == 2250 and spec.memory_gb == 180
    assert cat.resolve_gpu("gpu_8x_b200_sxm6") == "B200-SXM-180GB"
    r = _cli("pricing", "show", "--gpu", "B200", "--json")
    assert r.exit_code == 0, r.output
    offers = json.loads(r.output)
    offers = offers["offers"] if isinstance(offers, dict) else offers
    assert {o["provider"] for o in offers} >= {"aws", "gcp", "lambda"}
    assert all(o["gpu"] == "B200-SXM-180GB" for o in offers)
    h200 = json.loads(_cli("pricing", "show", "--gpu", "H200", "--json").output)
    h200 = h200["offers"] if isinstance(h200, dict) else h200
    assert {o["provider"] for o in h200} >= {"aws", "gcp", "azure"}


def test_recommend_from_a_workload_file_before_any_run(files):
    w, o = files
    # An LLM trains at a global batch of ~4M tokens (2,048 sequences of 2,048); the
    # observation's own 8 x 2 would cap data parallelism at 16 ranks.
    r = _cli("recommend", "--workload", w, "--observations", o, "--tokens", "100B",
             "--deadline", "48h", "--provider", "aws", "--global-batch", "2048", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["source_run_ids"] == [] and "mlflow_run_id" not in doc
    assert doc["winner"] is not None
    precisions = {c["precision"] for c in doc["candidates"]}
    assert "fp8" in precisions
    # A 48 h deadline for 100B tokens of a 7B model needs more than 16 nodes.
    assert max(c["nodes"] for c in doc["candidates"]) > 16


def test_recommend_workload_alone_uses_the_prior(files):
    w, _ = files
    r = _cli("recommend", "--workload", w, "--tokens", "10B", "--provider", "lambda", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any(c["gpu"] == "B200-SXM-180GB" for c in doc["candidates"])


@pytest.mark.parametrize("args, message", [
    (["--observations", "o.csv", "--tokens", "1B"], "--observations needs --workload"),
    (["--workload", "w.json", "--run-id", "abc", "--observations", "o.csv", "--tokens", "1B"],
     "not both"),
    (["--tokens", "1B"], "--workload W.json"),
])
def test_recommend_source_errors_are_one_line_exit_2(args, message):
    r = _cli("recommend", *args)
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output
