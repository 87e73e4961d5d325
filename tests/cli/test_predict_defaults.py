"""``predict`` from a workload file of model-card keys: the defaults it derives from the
architecture are listed with their values (``defaults``, ``assumptions``), the human output
names the one that moves the answer most, and ``--power-limit-w`` slows the GPU's arithmetic.
Expected values are computed here from the published formulas, not read from the model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

# Llama 2 7B as its card states it (benchmarks/workloads/llama2_7b.json, without the bench
# notes): no traffic, kernel count or largest layer.
L, H, F, V, S = 32, 4096, 11008, 32000, 2048
CARD = {"name": "llama2_7b", "params": 6738415616, "flops_per_sample": 89398720856064.0,
        "precision": "bf16", "optimizer": "AdamW", "micro_batch": 2, "tokens_per_sample": S,
        "num_layers": L, "hidden_size": H, "num_heads": 32, "ffn_hidden_size": F,
        "mlp": "swiglu", "vocab_size": V, "attention": "sdpa", "dropout": 0}
ARGS = ["--gpu", "NVIDIA H100 80GB HBM3", "--gpus", "8", "--strategy", "fsdp",
        "--micro-batch", "2"]


def _run(path, *extra):
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), *ARGS, *extra],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture
def card(tmp_path):
    path = tmp_path / "llama2_7b.json"
    path.write_text(json.dumps(CARD))
    return path


def _expected_traffic_bytes() -> float:
    # Korthikanti et al. 2022 per layer and token at 2-byte elements, no dropout, SDPA:
    # Q, K, V 3e, output-projection input e, SwiGLU 4·(F/H)·e, two norm inputs and the two
    # residual-path inputs 4e (in units of h), two norms' fp32 mean and 1/σ 16 bytes, the
    # log-sum-exp 4 bytes per head; outside the layers the token ids (8), the final norm's and
    # the output projection's inputs 2e·h, its stats 8, the targets 8 and fp32 logits 4·V.
    e = 2.0
    layer = (3 * e + e + 4 * (F / H) * e + 4 * e) * H + 16 + 4 * 32
    outside = 8 + 2 * e * H + 8 + 8 + 4 * V
    return 6.0 * S * (L * layer + outside)


def test_json_lists_each_default_derived_from_the_architecture(card):
    out = json.loads(_run(card, "--json"))
    by_kind = {d["kind"]: d for d in out["defaults"]}
    traffic = by_kind["traffic"]
    assert traffic["value"] == pytest.approx(_expected_traffic_bytes(), rel=1e-6)
    assert "activation formula" in traffic["source"] and not traffic["fallback"]
    assert by_kind["kernels"]["value"] == 100 * L + 40
    # One decoder block: 4h² attention (multi-head) + 3·h·F SwiGLU + two norms.
    assert by_kind["largest_layer"]["value"] == 4 * H * H + 3 * H * F + 2 * H
    assert by_kind["efficiency"]["source"].startswith("compute.GENERATION_MFU")
    assert not any(d["fallback"] for d in out["defaults"])
    # every default is in the assumptions in words, with its value
    words = " ".join(out["assumptions"])
    assert f"{_expected_traffic_bytes() / 1e9:.3g} GB" in words and "3,240" in words
    # effects sorted, the largest first; each a relative change of the throughput
    changes = [abs(d["throughput_change"]) for d in out["defaults"]]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0
    # memory-bound no more: the matmuls decide, model FLOPs utilisation well above 0.3
    mfu = out["tokens_per_s"] * CARD["flops_per_sample"] / S / (8 * 989.4e12)
    assert 0.3 < mfu < 0.6


def test_flops_only_workload_says_its_fallbacks(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"params": 6738415616, "flops_per_sample": 8.94e13,
                                "precision": "bf16", "micro_batch": 2}))
    out = json.loads(_run(path, "--json"))
    traffic = next(d for d in out["defaults"] if d["kind"] == "traffic")
    assert traffic["fallback"] and traffic["value"] == pytest.approx(8.94e13 / 30 / 2)
    assert any(d["kind"] == "kernels" and d["fallback"] for d in out["defaults"])


def test_human_output_names_the_default_that_moves_it_most(card):
    out = json.loads(_run(card, "--json"))
    top = out["defaults"][0]
    text = _run(card)
    line = next(ln for ln in text.splitlines() if "decided most by" in ln)
    assert top["quantity"] in line
    assert f"{100 * top['throughput_change']:+.0f}%" in line


def test_power_limit_slows_the_arithmetic_by_the_clock_it_leaves(card):
    full = json.loads(_run(card, "--json"))
    capped = json.loads(_run(card, "--json", "--power-limit-w", "350"))
    clock = (350 / 700) ** (1 / 3)
    ratio = capped["throughput_samples_per_s"] / full["throughput_samples_per_s"]
    # compute-bound but not wholly: slower than full power, not slower than the clock
    assert clock <= ratio < 0.97
    above_tdp = json.loads(_run(card, "--json", "--power-limit-w", "900"))
    assert above_tdp["throughput_samples_per_s"] == pytest.approx(
        full["throughput_samples_per_s"])
