"""A Hugging Face config.json as a workload: parameter counts against the published ones and
against ``transformers`` building the same model, FLOPs against ``FlopCounterMode``, bad
configs as one line."""

from __future__ import annotations

import json

import pytest

from mlflow_gpuopt.hf_config import (FAMILIES, MLA_FAMILIES, MOE_FAMILIES, HfConfigError,
                                     decoder_shape, is_hf_config)
from mlflow_gpuopt.workload_files import WorkloadFileError, load_workload, read_workload

# The shapes of published checkpoints, as their config.json on the Hugging Face Hub states
# them (only the keys the layout depends on), with the parameter count each model card
# publishes.
PUBLISHED = {
    "Llama-2-7b": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_size": 4096, "intermediate_size": 11008,
                    "num_attention_heads": 32, "num_hidden_layers": 32,
                    "num_key_value_heads": 32, "vocab_size": 32000,
                    "max_position_embeddings": 4096, "tie_word_embeddings": False,
                    "torch_dtype": "float16"}, 6.74e9),
    "Meta-Llama-3-8B": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                         "hidden_size": 4096, "intermediate_size": 14336,
                         "num_attention_heads": 32, "num_hidden_layers": 32,
                         "num_key_value_heads": 8, "vocab_size": 128256,
                         "max_position_embeddings": 8192, "tie_word_embeddings": False,
                         "torch_dtype": "bfloat16"}, 8.03e9),
    "Meta-Llama-3-70B": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                          "hidden_size": 8192, "intermediate_size": 28672,
                          "num_attention_heads": 64, "num_hidden_layers": 80,
                          "num_key_value_heads": 8, "vocab_size": 128256,
                          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, 70.6e9),
    "Mistral-7B-v0.1": ({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                         "hidden_size": 4096, "intermediate_size": 14336,
                         "num_attention_heads": 32, "num_hidden_layers": 32,
                         "num_key_value_heads": 8, "vocab_size": 32000,
                         "sliding_window": 4096, "tie_word_embeddings": False,
                         "torch_dtype": "bfloat16"}, 7.24e9),
    "Qwen2-7B": ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                  "hidden_size": 3584, "intermediate_size": 18944,
                  "num_attention_heads": 28, "num_hidden_layers": 28,
                  "num_key_value_heads": 4, "vocab_size": 152064,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, 7.62e9),
    "gpt2": ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768,
              "n_head": 12, "n_layer": 12, "n_positions": 1024, "n_ctx": 1024,
              "vocab_size": 50257, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
              "attn_pdrop": 0.1}, 124.4e6),
    "pythia-410m": ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                     "hidden_size": 1024, "intermediate_size": 4096,
                     "num_attention_heads": 16, "num_hidden_layers": 24,
                     "vocab_size": 50304, "tie_word_embeddings": False,
                     "torch_dtype": "float16"}, 405e6),
    "gpt-neox-20b": ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                      "hidden_size": 6144, "intermediate_size": 24576,
                      "num_attention_heads": 64, "num_hidden_layers": 44,
                      "vocab_size": 50432, "tie_word_embeddings": False,
                      "torch_dtype": "float16"}, 20.55e9),
    "falcon-7b": ({"architectures": ["FalconForCausalLM"], "model_type": "falcon",
                   "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
                   "multi_query": True, "parallel_attn": True, "bias": False,
                   "new_decoder_architecture": False, "vocab_size": 65024,
                   "torch_dtype": "bfloat16"}, 6.92e9),
    "phi-2": ({"architectures": ["PhiForCausalLM"], "model_type": "phi",
               "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 32,
               "num_hidden_layers": 32, "vocab_size": 51200, "resid_pdrop": 0.1,
               "tie_word_embeddings": False, "torch_dtype": "float16"}, 2.78e9),
    "Phi-3-mini-4k-instruct": ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                                "hidden_size": 3072, "intermediate_size": 8192,
                                "num_attention_heads": 32, "num_hidden_layers": 32,
                                "num_key_value_heads": 32, "vocab_size": 32064,
                                "tie_word_embeddings": False,
                                "torch_dtype": "bfloat16"}, 3.82e9),
    "gemma-7b": ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
                  "hidden_size": 3072, "intermediate_size": 24576, "head_dim": 256,
                  "num_attention_heads": 16, "num_hidden_layers": 28,
                  "num_key_value_heads": 16, "vocab_size": 256000,
                  "torch_dtype": "bfloat16"}, 8.54e9),
    "gemma-2-9b": ({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                    "hidden_size": 3584, "intermediate_size": 14336, "head_dim": 256,
                    "num_attention_heads": 16, "num_hidden_layers": 42,
                    "num_key_value_heads": 8, "vocab_size": 256000,
                    "torch_dtype": "float32"}, 9.24e9),
    "Qwen3-8B": ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                  "hidden_size": 4096, "intermediate_size": 12288, "head_dim": 128,
                  "num_attention_heads": 32, "num_hidden_layers": 36,
                  "num_key_value_heads": 8, "vocab_size": 151936,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, 8.19e9),
}


def _write(tmp_path, name, doc):
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_params_match_the_published_count(tmp_path, name):
    doc, published = PUBLISHED[name]
    read = read_workload(_write(tmp_path, name, doc), seq_len=4096)
    w = read.workload
    assert read.hf_config and w.name == name
    assert w.params == pytest.approx(published, rel=0.01)
    assert w.tokens_per_sample == 4096
    assert (w.num_layers, w.hidden_size) == (doc.get("num_hidden_layers", doc.get("n_layer")),
                                             doc.get("hidden_size", doc.get("n_embd")))
    assert any("Hugging Face config.json" in n for n in read.notes)


def test_flops_follow_six_n_t_plus_attention_with_the_lm_head_not_the_embedding(tmp_path):
    # Llama-3-8B at 8192 tokens, written out by hand: N = the 32 layers' projections and MLP
    # plus the LM head (untied); the input embedding is a gather.
    doc, _ = PUBLISHED["Meta-Llama-3-8B"]
    w = read_workload(_write(tmp_path, "l3", doc), seq_len=8192).workload
    h, f, kv, layers, vocab, t = 4096, 14336, 8 * 128, 32, 128256, 8192
    n = layers * (2 * h * h + 2 * h * kv + 3 * h * f) + vocab * h
    assert w.flops_per_sample == 6 * n * t + 12 * layers * t * t * h
    assert w.precision == "bf16" and w.num_kv_heads == 8 and w.mlp == "swiglu"
    assert w.ffn_hidden_size == f and w.vocab_size == vocab and w.dropout == 0


def test_precision_from_torch_dtype_else_bf16(tmp_path):
    fp16 = read_workload(_write(tmp_path, "a", PUBLISHED["pythia-410m"][0]), seq_len=2048)
    assert fp16.workload.precision == "fp16"
    stored_fp32 = read_workload(_write(tmp_path, "b", PUBLISHED["gemma-2-9b"][0]), seq_len=2048)
    assert stored_fp32.workload.precision == "bf16"
    assert any("default" in n for n in stored_fp32.notes)
    gpt2 = read_workload(_write(tmp_path, "c", PUBLISHED["gpt2"][0]), seq_len=1024).workload
    assert gpt2.precision == "bf16" and gpt2.dropout == pytest.approx(0.1)


def test_a_workload_file_with_hf_key_names_is_still_a_workload_file(tmp_path):
    doc = {"params": 1000, "flops_per_sample": 6000.0, "precision": "fp32",
           "model_type": "llama", "num_hidden_layers": 2}
    assert not is_hf_config(doc)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    assert load_workload(path).num_layers == 2
    with pytest.raises(WorkloadFileError, match="--seq-len goes with a Hugging Face"):
        read_workload(path, seq_len=128)


def _bad(tmp_path, doc, seq_len=2048, where=None):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    with pytest.raises(WorkloadFileError) as info:
        read_workload(path, seq_len=seq_len)
    message = str(info.value)
    assert "\n" not in message and (where or str(path)) in message
    return message


def test_bad_configs_are_one_line(tmp_path):
    llama = dict(PUBLISHED["Meta-Llama-3-8B"][0])
    assert "--seq-len" in _bad(tmp_path, llama, seq_len=None)
    assert "max_position_embeddings" in _bad(tmp_path, llama, seq_len=None)
    assert "missing 'hidden_size'" in _bad(tmp_path, {k: v for k, v in llama.items()
                                                     if k != "hidden_size"})
    assert "must divide hidden_size" in _bad(tmp_path, {**llama, "num_attention_heads": 30})
    assert "must divide num_attention_heads" in _bad(tmp_path, {**llama,
                                                                "num_key_value_heads": 5})
    assert "whole number" in _bad(tmp_path, {**llama, "num_hidden_layers": "32"})
    assert "whole number" in _bad(tmp_path, {**llama, "vocab_size": True})
    assert "whole number from 1" in _bad(tmp_path, {**llama, "hidden_size": 0})
    assert "parameters" in _bad(tmp_path, {**llama, "num_hidden_layers": 90000,
                                           "hidden_size": 10**6, "intermediate_size": 10**6,
                                           "num_attention_heads": 8})
    assert "not a family" in _bad(tmp_path, {**llama, "model_type": "jamba"})
    deepseek = {**llama, "model_type": "deepseek_v2", "n_routed_experts": 8,
                "num_experts_per_tok": 2, "moe_intermediate_size": 64}
    assert "moe_layer_freq" in _bad(tmp_path, {**deepseek, "moe_layer_freq": 2})
    assert "missing 'num_experts_per_tok'" in _bad(
        tmp_path, {k: v for k, v in deepseek.items() if k != "num_experts_per_tok"})
    assert "mlp_bias" in _bad(tmp_path, {**deepseek, "mlp_bias": True})
    assert "mlp_only_layers" in _bad(tmp_path, {**llama, "model_type": "qwen2_moe",
                                                "mlp_only_layers": [0]})
    assert "text_config" in _bad(tmp_path, {"model_type": "gemma3", "text_config": {}})
    assert "true or false" in _bad(tmp_path, {**llama, "tie_word_embeddings": "no"})
    assert "probability" in _bad(tmp_path, {**llama, "attention_dropout": 1.5})
    assert "not valid JSON" in _bad(tmp_path, "{model_type: llama")
    assert "sequence length" in _bad(tmp_path, llama, seq_len=10**9, where="--seq-len")


def test_a_huge_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    import mlflow_gpuopt.workload_files as wf

    monkeypatch.setattr(wf, "MAX_WORKLOAD_FILE_BYTES", 2**20)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**PUBLISHED["gpt2"][0], "pad": "x" * 2**20}))
    with pytest.raises(WorkloadFileError, match="over the 1 MiB limit"):
        read_workload(path, seq_len=1024)


def test_family_from_architectures_when_model_type_is_absent():
    doc = {k: v for k, v in PUBLISHED["falcon-7b"][0].items() if k != "model_type"}
    assert decoder_shape(doc).family == "falcon"
    # Falcon-7B's first config.json: model_type RefinedWebModel, n_layer and n_head
    old = {"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel",
           "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True,
           "parallel_attn": True, "bias": False, "vocab_size": 65024}
    assert decoder_shape(old).params == decoder_shape(doc).params
    with pytest.raises(HfConfigError, match="not a family"):
        decoder_shape({"architectures": ["MambaForCausalLM"], "hidden_size": 8})


transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["Meta-Llama-3-8B", "Qwen2-7B", "falcon-7b", "phi-2",
                                  "gemma-7b", "gemma-2-9b", "gpt2", "pythia-410m",
                                  "Phi-3-mini-4k-instruct", "Qwen3-8B", "Mistral-7B-v0.1"])
def test_params_equal_what_transformers_builds_at_full_size(name):
    """transformers builds the published shape on the meta device (no memory, no download);
    its parameter count is the independent answer."""
    doc, _ = PUBLISHED[name]
    kwargs = {k: v for k, v in doc.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(doc["model_type"], **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert decoder_shape(doc).params == sum(p.numel() for p in model.parameters())


TINY = {  # every family, scaled down (GQA, head_dim, qk norms, new Falcon, biases)
    "llama": dict(num_key_value_heads=2, intermediate_size=96, attention_bias=True),
    "mistral": dict(num_key_value_heads=2, intermediate_size=96),
    "qwen2": dict(num_key_value_heads=2, intermediate_size=96),
    "qwen3": dict(num_key_value_heads=2, head_dim=32, intermediate_size=96),
    "gemma": dict(num_key_value_heads=1, head_dim=32, intermediate_size=96),
    "gemma2": dict(num_key_value_heads=2, head_dim=16, intermediate_size=96),
    "phi3": dict(num_key_value_heads=2, intermediate_size=96, pad_token_id=0),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=32),
    "gpt_neox": dict(intermediate_size=256),
    "falcon": dict(num_kv_heads=2, new_decoder_architecture=True),
    "phi": dict(intermediate_size=256, num_key_value_heads=2),
    # mixtures of experts: top-k of E routed experts, Qwen2-MoE's gated shared expert and a
    # dense layer every other one (decoder_sparse_step 2)
    "mixtral": dict(num_key_value_heads=2, intermediate_size=48, num_local_experts=4,
                    num_experts_per_tok=2),
    "qwen2_moe": dict(num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, num_experts=6,
                      num_experts_per_tok=2, decoder_sparse_step=2),
    "qwen3_moe": dict(num_key_value_heads=2, head_dim=32, intermediate_size=96,
                      moe_intermediate_size=24, num_experts=8, num_experts_per_tok=3),
    # biased attention with sinks, biased router and experts, alternating sliding-window
    # layers (a window of 8 covers the test's 16 tokens: FlopCounterMode counts the eager
    # square either way)
    "gpt_oss": dict(num_key_value_heads=2, head_dim=32, intermediate_size=48,
                    num_local_experts=6, num_experts_per_tok=2, sliding_window=8),
    # multi-head latent attention (query latent or not, value heads narrower than the
    # query/key ones), a dense first layer, shared experts
    "deepseek_v3": dict(num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96,
                        moe_intermediate_size=24,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_group=1,
                        topk_group=1),
    "deepseek_v2": dict(num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96,
                        moe_intermediate_size=24,
                        n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=2,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                        attention_bias=True),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_params_and_flops_equal_transformers_and_the_flop_counter(family):
    """A tiny model of each family, built and trained one step on a CPU: its parameters and
    the FLOPs ``FlopCounterMode`` counts over forward + backward (eager attention, whose
    backward is twice its forward, as the model-FLOPs convention charges) equal the
    config's."""
    from torch.utils.flop_counter import FlopCounterMode

    base = {} if family == "gpt2" else dict(hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4)
    kwargs = {**base, "vocab_size": 128, **TINY[family]}
    config = transformers.AutoConfig.for_model(family, **kwargs)
    # MoE experts in the per-expert loop: FlopCounterMode does not count grouped GEMMs
    experts = ({"experts_implementation": "eager"} if family in MOE_FAMILIES + MLA_FAMILIES
               else {})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          **experts)
    shape = decoder_shape({"model_type": family, **config.to_dict()})
    assert shape.params == sum(p.numel() for p in model.parameters())
    seq, batch = 16, 2
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == batch * shape.flops_per_sample(seq)


def test_every_family_is_tested():
    assert set(TINY) == set(FAMILIES)
