"""A Hugging Face config.json in, a plan out: ``predict``/``recommend --workload config.json
--seq-len N`` end to end, the global batch they plan with, and the errors."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

# Meta-Llama-3-8B's config.json on the Hugging Face Hub (the keys its shape depends on).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "rope_theta": 500000.0,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.fixture
def config(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return str(path)


def _cli(*args):
    return CliRunner().invoke(gpuopt, list(args), catch_exceptions=False)


def test_llama3_8b_config_plans_1t_tokens_within_30_days(config):
    r = _cli("recommend", "--workload", config, "--seq-len", "8192", "--tokens", "1T",
             "--deadline", "30d", "--no-log", "--top", "5")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "Recommended:" in out
    hours = re.search(r"Predicted ([\d,.]+) h \(([\d,.]+) h–([\d,.]+) h\)", out)
    assert hours, out
    median, low, high = (float(x.replace(",", "")) for x in hours.groups())
    assert low < median < high and median <= 720
    gpu_hours = re.search(r"GPU-hours: ([\d,]+) \(([\d,]+)–([\d,]+)\) on ([\d,]+) GPUs", out)
    assert gpu_hours, out
    gh, gpus = float(gpu_hours.group(1).replace(",", "")), int(gpu_hours.group(4))
    assert gh == pytest.approx(median * gpus, rel=0.01)
    # the defaults it used: the config's derived numbers, the batch, the model's guesses
    assert "Hugging Face config.json (llama): 8.03 B parameters" in out
    assert "derived for LLM pre-training" in out and "Brown et al. 2020" in out
    assert "Assumed: " in out

    doc = json.loads(_cli("recommend", "--workload", config, "--seq-len", "8192", "--tokens",
                          "1T", "--deadline", "30d", "--no-log", "--json").stdout)
    # 1T tokens / 8192 per sequence, the global batch 2 M tokens as 256 sequences
    assert doc["target"]["total_samples"] == pytest.approx(1e12 / 8192)
    assert doc["batch_policy"] == {"global_batch": 256, "mode": "derived",
                                   "per_rank_batch": None,
                                   "why": doc["batch_policy"]["why"]}
    assert doc["meets_deadline"] is True and doc["winner"]["predicted_hours"] <= 720
    assert doc["winner"]["global_batch"] == 256
    assert all(c["global_batch"] == 256 for c in doc["candidates"])


def test_a_binding_global_batch_is_named_with_what_the_flags_give(config):
    # 20 days: the fastest plan at global batch 8 has its median beyond it (~490 h), so no
    # plan meets it whatever the interval's width
    doc = json.loads(_cli("recommend", "--workload", config, "--seq-len", "8192", "--tokens",
                          "1T", "--deadline", "20d", "--no-log", "--global-batch", "8",
                          "--json").stdout)
    assert doc["meets_deadline"] is False
    assert all(c["predicted_hours"] >= doc["fastest"]["predicted_hours"]
               for c in doc["candidates"])
    note = next(n for n in doc["notes"] if n.startswith("no plan meets"))
    assert "what binds: the global batch: 8 samples per step" in note
    alts = {a["flag"]: a for a in doc["deadline_alternatives"]}
    assert set(alts) == {"--keep-micro-batch", "--global-batch 256"}
    assert alts["--global-batch 256"]["meets_deadline"] is True
    assert alts["--global-batch 256"]["predicted_hours"] < doc["fastest"]["predicted_hours"]
    assert any(n.startswith("--global-batch 256 gives") for n in doc["notes"])


def test_predict_from_a_config_json(config):
    r = _cli("predict", "--workload", config, "--seq-len", "4096", "--gpu",
             "NVIDIA H100 80GB HBM3", "--gpus", "8", "--strategy", "fsdp", "--micro-batch", "1",
             "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["tokens_per_s"] == pytest.approx(out["throughput_samples_per_s"] * 4096)
    assert any("8.03 B parameters" in a for a in out["assumptions"])


@pytest.mark.parametrize("args, message", [
    (["predict", "--gpu", "H100", "--gpus", "8"], "--seq-len N"),
    (["recommend", "--tokens", "1T"], "--seq-len N"),
    (["recommend", "--tokens", "1T", "--seq-len", "0"], "--seq-len"),
])
def test_config_json_errors_are_one_line_exit_2(config, args, message):
    r = CliRunner().invoke(gpuopt, [args[0], "--workload", config, *args[1:]])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_seq_len_goes_with_a_config_only(tmp_path):
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"params": 1e8, "flops_per_sample": 1e12, "precision": "bf16",
                             "tokens_per_sample": 1024}))
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(w), "--seq-len", "2048",
                                    "--tokens", "1B"])
    assert r.exit_code == 2 and "--seq-len goes with a Hugging Face" in r.output
    r = CliRunner().invoke(gpuopt, ["recommend", "--run-id", "0" * 32, "--seq-len", "2048",
                                    "--tokens", "1B"])
    assert r.exit_code == 2 and "--seq-len goes with --workload" in r.output
