"""Mixture-of-experts config.json files as workloads: total and active parameters against the
published counts and against ``transformers`` building the full-size model, the workload's
expert keys, and the workload.json checks of those keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlflow_gpuopt.hf_config import HfConfigError, decoder_shape
from mlflow_gpuopt.workload_files import WorkloadFileError, load_workload, read_workload

# config.json of published checkpoints (the keys the layout depends on), with the total and
# active parameter counts their model cards publish.
PUBLISHED = {
    "Mixtral-8x7B-v0.1": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                           "hidden_size": 4096, "intermediate_size": 14336,
                           "num_attention_heads": 32, "num_hidden_layers": 32,
                           "num_key_value_heads": 8, "num_local_experts": 8,
                           "num_experts_per_tok": 2, "vocab_size": 32000,
                           "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
                          46.7e9, 12.9e9),
    "Qwen1.5-MoE-A2.7B": ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                           "hidden_size": 2048, "intermediate_size": 5632,
                           "moe_intermediate_size": 1408,
                           "shared_expert_intermediate_size": 5632,
                           "num_attention_heads": 16, "num_hidden_layers": 24,
                           "num_key_value_heads": 16, "num_experts": 60,
                           "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                           "vocab_size": 151936, "tie_word_embeddings": False,
                           "torch_dtype": "bfloat16"}, 14.3e9, 2.7e9),
    "Qwen3-30B-A3B": ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                       "hidden_size": 2048, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "head_dim": 128,
                       "num_attention_heads": 32, "num_hidden_layers": 48,
                       "num_key_value_heads": 4, "num_experts": 128,
                       "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                       "vocab_size": 151936, "tie_word_embeddings": False,
                       "torch_dtype": "bfloat16"}, 30.5e9, None),  # "3.3B activated":
    # the card's one-decimal figure of 3.35 B (1.6 % away); the tiny Qwen3-MoE FLOPs test in
    # test_hf_config.py checks the active weights exactly instead
}


def _write(tmp_path, doc, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_and_active_params_match_the_published_counts(name):
    doc, total, active = PUBLISHED[name]
    shape = decoder_shape(doc)
    assert shape.params == pytest.approx(total, rel=0.01)
    if active is not None:
        assert shape.active_params == pytest.approx(active, rel=0.01)


def test_mixtral_workload_flops_are_the_active_weights_and_memory_all_of_them(tmp_path):
    doc, _, _ = PUBLISHED["Mixtral-8x7B-v0.1"]
    read = read_workload(_write(tmp_path, doc), seq_len=4096)
    w = read.workload
    h, f, kv, layers, vocab, t, e, k = 4096, 14336, 8 * 128, 32, 32000, 4096, 8, 2
    # by hand: attention, the router (h × E), k experts of three h × f matrices, the LM head
    n_active = layers * (2 * h * h + 2 * h * kv + e * h + k * 3 * h * f) + vocab * h
    assert w.flops_per_sample == 6 * n_active * t + 12 * layers * t * t * h
    all_params = (2 * vocab * h + h + layers * (2 * h * h + 2 * h * kv + 2 * h + e * h
                                               + e * 3 * h * f))
    assert w.params == all_params == w.trainable_params
    assert (w.num_experts, w.experts_per_token, w.num_shared_experts) == (8, 2, 0)
    assert (w.expert_ffn_hidden_size, w.moe_layer_freq) == (f, 1)
    assert w.ffn_hidden_size == k * f  # what one token's MLP holds, for activations
    assert any("active parameters" in n for n in read.notes)


def test_qwen_moe_shared_experts_and_sparse_step(tmp_path):
    doc, _, _ = PUBLISHED["Qwen1.5-MoE-A2.7B"]
    w = read_workload(_write(tmp_path, doc), seq_len=2048).workload
    assert (w.num_experts, w.experts_per_token, w.num_shared_experts) == (60, 4, 4)
    every_other = {**doc, "decoder_sparse_step": 2}
    dense = decoder_shape(every_other)
    assert dense.moe_layers == 12
    # 12 layers trade 60 experts, router, shared expert and gate for one dense MLP
    h = 2048
    moe_mlp = 60 * h + 60 * 3 * h * 1408 + 3 * h * 5632 + h
    assert decoder_shape(doc).params - dense.params == 12 * (moe_mlp - 3 * h * 5632)


transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_params_equal_what_transformers_builds_at_full_size(name):
    doc, _, _ = PUBLISHED[name]
    kwargs = {k: v for k, v in doc.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(doc["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert decoder_shape(doc).params == sum(p.numel() for p in model.parameters())


def _base():
    return {"params": 46_700_000_000, "flops_per_sample": 3.2e14, "precision": "bf16",
            "num_layers": 32, "hidden_size": 4096}


def test_workload_file_expert_keys_and_hf_spellings(tmp_path):
    w = load_workload(_write(tmp_path, {**_base(), "num_local_experts": 8,
                                        "num_experts_per_tok": 2,
                                        "moe_intermediate_size": 14336,
                                        "capacity_factor": 1.25}, "w.json"))
    assert (w.num_experts, w.experts_per_token, w.expert_ffn_hidden_size) == (8, 2, 14336)
    assert w.capacity_factor == 1.25


@pytest.mark.parametrize("extra, words", [
    ({"experts_per_token": 2}, "needs 'num_experts'"),
    ({"num_experts": 8, "experts_per_token": 9}, "at most 'num_experts'"),
    ({"num_experts": 8, "capacity_factor": 0}, "above 0"),
    ({"num_experts": "eight"}, "must be a number"),
    ({"num_experts": 8, "first_dense_layers": 32}, "must be below 'num_layers'"),
])
def test_bad_expert_keys_are_one_line(tmp_path, extra, words):
    path = _write(tmp_path, {**_base(), **extra}, "w.json")
    with pytest.raises(WorkloadFileError) as info:
        load_workload(path)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert str(path) in str(info.value)


FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
# DeepSeek's config.json files (the keys the layout depends on, from the published
# checkpoints) and the totals their model cards and papers give: DeepSeek-V3 671 B total /
# 37 B activated, DeepSeek-V2 236 B / 21 B, DeepSeek-V2-Lite 15.7 B / 2.4 B. DeepSeek's
# "activated" leaves out the token embedding (a gather); the cards round to two figures.
DEEPSEEK = {"deepseek_v3": (671e9, 37e9), "deepseek_v2": (236e9, 21e9),
            "deepseek_v2_lite": (15.7e9, 2.4e9)}


def _fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(DEEPSEEK))
def test_deepseek_latent_attention_counts_match_the_published_totals(name):
    total, active = DEEPSEEK[name]
    shape = decoder_shape(_fixture(name))
    assert shape.params == pytest.approx(total, rel=0.003)
    assert shape.active_params - shape.embedding_params == pytest.approx(active, rel=0.025)


def test_deepseek_v3_workload_keys_and_notes(tmp_path):
    doc = _fixture("deepseek_v3")
    wl = read_workload(_write(tmp_path, doc), seq_len=4096)
    w = wl.workload
    assert (w.num_experts, w.experts_per_token, w.num_shared_experts) == (256, 8, 1)
    assert (w.expert_ffn_hidden_size, w.first_dense_layers) == (2048, 3)
    # 3 dense layers of 18432 and 58 MoE layers of 8 routed + 1 shared 2048-wide experts
    assert w.ffn_hidden_size == round((3 * 18432 + 58 * 9 * 2048) / 61)
    # attention per token and layer: 6·T·heads·(192 + 128) FLOPs, forward and backward
    shape = decoder_shape(doc)
    attn = 6.0 * 61 * 4096 * 4096 * 128 * (192 + 128)
    assert w.flops_per_sample == pytest.approx(6.0 * shape.matmul_weights * 4096 + attn)
    words = " ".join(wl.notes)
    assert "latent attention" in words and "num_nextn_predict_layers 1" in words
    assert "first 3 layers are dense" in words


def test_first_dense_layers_sets_the_moe_layers_ep_shards():
    from mlflow_gpuopt.perfmodel import moe
    from mlflow_gpuopt.perfmodel.types import Workload

    w = Workload(params=671e9, flops_per_sample=1e15, precision="bf16", num_layers=61,
                 hidden_size=7168,
                 num_experts=256, experts_per_token=8, expert_ffn_hidden_size=2048,
                 first_dense_layers=3)
    assert moe.moe_layers(w) == 58
    assert moe.routed_expert_params(w) == 58 * 256 * 3 * 7168 * 2048


@pytest.mark.parametrize("name", sorted(DEEPSEEK))
def test_deepseek_params_equal_what_transformers_builds_at_full_size(name):
    doc = _fixture(name)
    kwargs = {k: v for k, v in doc.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(doc["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert decoder_shape(doc).params == sum(p.numel() for p in model.parameters())


BENCH_CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads" / "hf"
# The config.json shapes bench_llm's MoE rows read, against their model cards' totals:
# Qwen3-235B-A22B "235B total, 22B activated"; Kimi K2 (model_type kimi_k2, DeepSeek-V3's
# layout) "1 trillion total, 32 billion activated" (active here less the embedding, as
# DeepSeek's); Qwen3-30B-A3B 30.5 B; DeepSeek-V3 as above.
BENCH_TOTALS = {"qwen3_235b_a22b": (235e9, 22e9, 0.01), "kimi_k2": (1.0e12, 32e9, 0.03),
                # gpt-oss-120b: "117B parameters with 5.1B active" (active here less the
                # untied LM head's 0.58 B, counted once as the embedding is)
                "gpt_oss_120b": (116.8e9, None, 0.005),
                "qwen3_30b_a3b": (30.5e9, None, 0.01), "deepseek_v3": (671e9, 37e9, 0.025)}


@pytest.mark.parametrize("name", sorted(BENCH_TOTALS))
def test_benchmark_config_shapes_match_their_model_cards(name):
    total, active, rel = BENCH_TOTALS[name]
    doc = json.loads((BENCH_CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    shape = decoder_shape(doc)
    assert shape.params == pytest.approx(total, rel=rel)
    if active is not None:
        skipped = shape.embedding_params if shape.kv_lora_rank else 0
        assert shape.active_params - skipped == pytest.approx(active, rel=rel)
    if name == "kimi_k2":
        assert shape.family == "deepseek_v3" and doc["model_type"] == "kimi_k2"


def test_latent_attention_qkv_width_sets_the_activation_formula(tmp_path):
    """DeepSeek-V3's Q, K, V per token: 128 heads × (2 × 192 + 128) = 65,536 elements, not
    3 × 7,168; the formula's per-layer bytes grow by the difference × 2 bytes (bf16)."""
    from dataclasses import replace as dc_replace

    from mlflow_gpuopt.perfmodel.activations import layer_bytes_per_token, transformer_dims

    w = read_workload(_write(tmp_path, _fixture("deepseek_v3")), seq_len=4096).workload
    assert w.qkv_width == 128 * (2 * 192 + 128)
    with_mla = layer_bytes_per_token(transformer_dims(w), 2.0, 0.0, "flash", False)
    plain = layer_bytes_per_token(transformer_dims(dc_replace(w, qkv_width=None)), 2.0, 0.0,
                                  "flash", False)
    assert with_mla - plain == pytest.approx(2.0 * (65536 - 3 * 7168))


def test_heads_wider_than_hidden_give_qkv_width_and_attention_share(tmp_path):
    """Qwen3-30B-A3B: 32 query heads of 128 (4,096 wide, twice its hidden size of 2,048) and 4
    key/value heads: Q, K and V are (32 + 2 × 4) × 128 = 5,120 per token, and attention's two
    batched matmuls are 12 · L · T² · 4,096 of the config's FLOPs (its own count: 6 · L · T² ·
    heads · (head_dim + head_dim)), not 12 · L · T² · 2,048."""
    from mlflow_gpuopt.perfmodel.compute import attention_flops_share

    doc, _, _ = PUBLISHED["Qwen3-30B-A3B"]
    w = read_workload(_write(tmp_path, doc), seq_len=4096).workload
    assert w.qkv_width == (32 + 2 * 4) * 128
    attention = 6.0 * 48 * 4096 * 4096 * 32 * (128 + 128)
    assert attention_flops_share(w) == pytest.approx(attention / w.flops_per_sample)
    # a config whose heads make up the hidden size keeps the formula and no qkv_width
    mixtral, _, _ = PUBLISHED["Mixtral-8x7B-v0.1"]
    m = read_workload(_write(tmp_path, mixtral, "m.json"), seq_len=4096).workload
    assert m.qkv_width is None
    assert attention_flops_share(m) == pytest.approx(
        12.0 * 32 * 4096 * 4096 * 4096 / m.flops_per_sample)


def test_gpt_oss_params_equal_what_transformers_builds_and_its_window_saves_flops(tmp_path):
    """GPT-OSS 120B's config.json (benchmarks/workloads/hf): every parameter transformers
    builds (biased attention, sinks, biased router and experts), 5.13 B active without the
    embedding; half its layers attend to a 128-token window, so their attention counts
    T × 256 of the T² square, and attention's share of the FLOPs drops by as much."""
    from mlflow_gpuopt.perfmodel.compute import attention_flops_share

    doc = json.loads((BENCH_CONFIGS / "gpt_oss_120b.json").read_text(encoding="utf-8"))
    kwargs = {k: v for k, v in doc.items()
              if k not in ("architectures", "model_type", "quantization_config")}
    config = transformers.AutoConfig.for_model("gpt_oss", **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = decoder_shape(doc)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.active_params - shape.embedding_params == pytest.approx(5.1e9, rel=0.01)
    assert (shape.sliding_window, shape.sliding_window_layers) == (128, 18)
    t = 4096
    attention = 6.0 * 64 * (64 + 64) * t * (18 * t + 18 * 256)
    assert shape.flops_per_sample(t) == pytest.approx(6.0 * shape.matmul_weights * t + attention)
    w = read_workload(_write(tmp_path, doc), seq_len=t).workload
    assert (w.sliding_window, w.sliding_window_layers) == (128, 18)
    assert attention_flops_share(w) == pytest.approx(attention / w.flops_per_sample)
    # the same shape without the window: every layer over the whole square
    full = read_workload(_write(tmp_path, {**doc, "layer_types": ["full_attention"] * 36},
                                "full.json"), seq_len=t).workload
    assert full.sliding_window_layers is None
    assert attention_flops_share(full) > 1.6 * attention_flops_share(w)


def test_a_window_wider_than_the_sequence_saves_nothing_and_bad_layer_types_are_one_line(
        tmp_path):
    mixtral, _, _ = PUBLISHED["Mixtral-8x7B-v0.1"]
    plain = decoder_shape({**mixtral, "sliding_window": None})
    windowed = decoder_shape({**mixtral, "sliding_window": 4096})
    assert windowed.sliding_window_layers == windowed.num_layers
    assert windowed.flops_per_sample(4096) == plain.flops_per_sample(4096)
    assert windowed.flops_per_sample(32768) < plain.flops_per_sample(32768)
    doc = json.loads((BENCH_CONFIGS / "gpt_oss_120b.json").read_text(encoding="utf-8"))
    with pytest.raises(HfConfigError, match="layer_types"):
        decoder_shape({**doc, "layer_types": ["sliding_attention"] * 3})
