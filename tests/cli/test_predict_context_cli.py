"""`predict` with context parallelism on a 128k-token Llama-3-8B config.json: the degree in
the JSON, the key/value exchange in the time breakdown and its buffers in the memory, the
spellings that mean the same layout, and bad cp degrees as one line and exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

# Meta-Llama-3-8B's config.json (the keys its shape depends on)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_8B))
    return str(path)


def _predict(config, strategy, *extra, seq="131072"):
    return CliRunner().invoke(gpuopt, ["predict", "--workload", config, "--seq-len", seq,
                                       "--gpu", "H100", "--gpus", "8", "--strategy", strategy,
                                       "--micro-batch", "1", "--recompute", "full", *extra])


def test_cp4_json_has_the_degree_the_exchange_and_its_buffers(config):
    r = _predict(config, "cp4xfsdp", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["cp"] == 4 and out["fits"]
    # 4 chunks of K and V: 2 x 32768 tokens x 1024 (8 heads of 128) x 2 bytes
    assert out["memory"]["cp_buffers_bytes"] == 4 * 2 * 32768 * 1024 * 2
    assert out["time_breakdown"]["cp_exchange_s"] == 0.0  # hidden under attention on NVLink
    assert out["samples_per_step"] == 2  # 8 GPUs / cp4
    words = " ".join(out["assumptions"])
    assert "context parallel cp4" in words and "inside a node" in words
    same = json.loads(_predict(config, "fsdpxcp4", "--json").output)
    assert same["step_time_s"] == out["step_time_s"]
    assert same["memory_per_gpu_bytes"] == out["memory_per_gpu_bytes"]
    plain = json.loads(_predict(config, "fsdp", "--json").output)
    assert plain["cp"] == 1 and not plain["fits"]
    assert plain["memory"]["cp_buffers_bytes"] == 0
    assert plain["time_breakdown"]["cp_exchange_s"] == 0


def test_cp4_text_output_names_the_buffers_and_the_exchange(config):
    r = _predict(config, "cp4xfsdp")
    assert r.exit_code == 0, r.output
    assert "context-parallel K/V buffers 0.54 GB" in r.output  # 4 x 134,217,728 bytes
    assert "ring exchange of keys and values" in r.output
    plain = _predict(config, "fsdp").output
    assert "K/V buffers" not in plain and "context parallel" not in plain


@pytest.mark.parametrize("strategy, words, seq", [
    ("cp3xfsdp", "context-parallel cp3 x tensor-parallel 1 x pipeline 1 does not divide 8",
     "131072"),
    ("cp8xdp2", "dp2 x tp1 x pp1 x cp8 is not the 8 GPUs", "131072"),
    ("cp", "cp needs a number", "131072"),
    ("cp4xfsdp", "does not split into 8 equal chunks", "131076"),
])
def test_bad_cp_is_one_line_and_exit_2(config, strategy, words, seq):
    r = _predict(config, strategy, seq=seq)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
