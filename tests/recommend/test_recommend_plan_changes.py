"""Plans say what they change in the script (precision, recomputation), FP8 only where
``advise``'s rule would offer it, a long plan on an unmeasured precision is marked as a risk,
and the memory headroom is kept and said."""

from __future__ import annotations

import json

from click.testing import CliRunner

from mlflow_gpuopt.advice import rules
from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.recommend import search


def _recommend(tmp_path, workload: dict, *args: str) -> dict:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--no-log", "--json",
                                    *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


#: A 0.47 M-parameter GPT (4 layers of 96, 256 tokens, vocabulary 65) in bf16.
TINY = {"name": "tiny-gpt", "params": 470_000, "flops_per_sample": 6 * 470_000 * 256,
        "precision": "bf16", "micro_batch": 32, "tokens_per_sample": 256, "num_layers": 4,
        "hidden_size": 96, "num_heads": 4, "vocab_size": 65, "optimizer": "adamw"}
#: Llama 3 8B's shape (Meta's config.json), bf16.
LLAMA3_8B = {"name": "llama3-8b", "params": 8_030_261_248,
             "flops_per_sample": 6 * 8_030_261_248 * 8192, "precision": "bf16",
             "micro_batch": 1, "tokens_per_sample": 8192, "num_layers": 32, "hidden_size": 4096,
             "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336, "mlp": "swiglu",
             "vocab_size": 128256, "dropout": 0, "optimizer": "adamw"}


def test_fp8_threshold_is_advise_rule_threshold():
    assert search.FP8_MIN_PARAMS == rules.FP8_MIN_PARAMS


def test_a_small_model_is_never_switched_to_fp8(tmp_path):
    doc = _recommend(tmp_path, TINY, "--samples", "10M", "--provider", "aws")
    assert doc["candidates"]
    assert all(c["precision"] != "fp8" for c in doc["candidates"])


def test_a_precision_switch_is_a_script_change_and_a_long_one_a_risk(tmp_path):
    doc = _recommend(tmp_path, LLAMA3_8B, "--tokens", "20B", "--provider", "aws",
                     "--global-batch", "512", "--no-spot")
    fp8 = [c for c in doc["candidates"] if c["precision"] == "fp8"]
    bf16 = [c for c in doc["candidates"] if c["precision"] == "bf16"]
    assert fp8, "an 8B transformer on H100s is offered FP8"
    for c in fp8:
        assert any(n.startswith("script change: precision bf16 -> fp8") for n in c["notes"])
        long = c["predicted_hours"] >= search.UNTESTED_RISK_HOURS
        assert long == any(n.startswith("risk: ") and "fp8" in n for n in c["notes"])
    for c in bf16:
        assert not any("precision" in n for n in c["notes"] if n.startswith("script change"))
    best = doc["winner"] or doc["cheapest"]
    if best["precision"] == "fp8":
        assert any(line.startswith("Script change: precision bf16 -> fp8")
                   for line in doc["explanation"])


def test_the_headroom_is_kept_and_can_be_changed(tmp_path):
    tight = _recommend(tmp_path, LLAMA3_8B, "--tokens", "5B", "--provider", "aws",
                       "--global-batch", "64", "--memory-headroom", "0.3", "--top", "50")
    for c in tight["candidates"]:
        assert c["memory_per_gpu_bytes"] <= 0.7 * c["memory_usable_bytes"] * (1 + 1e-9)
        assert c["p_fits"] >= 0.5
    assert tight["memory_headroom"] == 0.3
    assert any("30%" in n for n in tight["notes"])
    loose = _recommend(tmp_path, LLAMA3_8B, "--tokens", "5B", "--provider", "aws",
                       "--global-batch", "64", "--memory-headroom", "0", "--top", "50")
    fullest = max(c["memory_per_gpu_bytes"] / c["memory_usable_bytes"]
                  for c in loose["candidates"])
    assert fullest > 0.7  # without a margin the search packs memory fuller


def test_a_headroom_out_of_range_is_refused_in_one_line(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(TINY))
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--samples", "1M",
                                    "--memory-headroom", "1.5", "--no-log"])
    assert r.exit_code == 2 and "--memory-headroom" in r.output and "Traceback" not in r.output
