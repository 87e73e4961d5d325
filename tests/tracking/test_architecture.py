"""The tracked model's architecture: read from its ``config`` (Hugging Face, GPT-2, nanoGPT,
litgpt), logged as ``gpuopt.*`` params and ``profile.json`` keys, and fed by
``predict --run-id`` into the workload, so its shape is read, not estimated.

Real training on CPU under ``gpuopt.track()`` into a sqlite store, tiny Hugging Face models;
``architecture_of`` on config objects without training.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import mlflow
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from click.testing import CliRunner
from torch import nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import gpuopt as gpuopt_cli
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.tracking.architecture import Architecture, architecture_of
from support.tracking import params_and_profile

transformers = pytest.importorskip("transformers")

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}
VOCAB, SEQ, MICRO = 128, 16, 4
ARCH_PARAMS = tuple(contract.ARCHITECTURE_PARAMS.values())


def tiny_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ))


def tiny_gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0))


def train_tracked(model, steps: int = 4, call=None) -> str:
    """``steps`` AdamW steps of next-token loss under ``track()``; the run id."""
    call = call or (lambda m, ids: m(input_ids=ids, labels=ids).loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(steps):
            ids = torch.randint(0, VOCAB, (MICRO, SEQ))
            loss = call(model, ids)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert t.run_id
    return t.run_id



def test_llama_run_logs_its_architecture_and_predict_uses_it(tracking_uri):
    rid = train_tracked(tiny_llama())
    params, profile = params_and_profile(rid)
    expected = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
                "ffn_hidden_size": 176, "mlp": "swiglu", "vocab_size": VOCAB}
    assert {k: profile[k] for k in expected} == expected
    assert {k: params[contract.ARCHITECTURE_PARAMS[k]] for k in expected} == {
        k: str(v) for k, v in expected.items()}

    workload = load_run_inputs([rid]).workload
    assert (workload.num_layers, workload.hidden_size, workload.num_heads,
            workload.num_kv_heads, workload.ffn_hidden_size, workload.mlp,
            workload.vocab_size) == (2, 64, 4, 2, 176, "swiglu", VOCAB)

    r = CliRunner().invoke(gpuopt_cli, ["predict", "--run-id", rid, "--gpu", "A100-80GB-SXM4",
                                        "--gpus", "2", "--strategy", "tp2", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assumptions = json.loads(r.stdout)["assumptions"]
    shape_estimates = [a for a in assumptions
                       if a.startswith(("num_layers estimated", "hidden_size estimated"))]
    assert not shape_estimates, assumptions  # tensor parallelism needs the shape


def test_predict_without_architecture_still_estimates_the_shape(tracking_uri):
    """The other side of the check above: the same Llama's run, its architecture keys
    removed from the profile and never logged as params, gets shape estimates."""
    rid = train_tracked(tiny_llama())
    params, profile = params_and_profile(rid)
    client = mlflow.MlflowClient()
    bare = client.create_run(mlflow.get_run(rid).info.experiment_id).info.run_id
    for k, v in params.items():
        if k not in ARCH_PARAMS:
            client.log_param(bare, k, v)
    for k, v in mlflow.get_run(rid).data.metrics.items():
        client.log_metric(bare, k, v)
    client.log_dict(bare, {k: v for k, v in profile.items()
                           if k not in contract.ARCHITECTURE_PARAMS}, "gpuopt/profile.json")
    r = CliRunner().invoke(gpuopt_cli, ["predict", "--run-id", bare, "--gpu", "A100-80GB-SXM4",
                                        "--gpus", "2", "--strategy", "tp2", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assumptions = json.loads(r.stdout)["assumptions"]
    assert any(a.startswith("num_layers estimated") for a in assumptions), assumptions


def test_gpt2_logs_gelu_and_four_times_hidden(tracking_uri):
    rid = train_tracked(tiny_gpt2())
    params, profile = params_and_profile(rid)
    assert params["gpuopt.mlp"] == "gelu" and profile["mlp"] == "gelu"
    assert params["gpuopt.ffn_hidden_size"] == str(4 * 32)
    assert params["gpuopt.num_layers"] == "3" and params["gpuopt.hidden_size"] == "32"
    assert params["gpuopt.num_heads"] == "2" and params["gpuopt.vocab_size"] == str(VOCAB)
    assert "gpuopt.num_kv_heads" not in params and profile["num_kv_heads"] is None


def _lm_loss(model, ids):
    return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())


def test_plain_sequential_logs_no_architecture(tracking_uri):
    model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, 64), nn.GELU(),
                          nn.Linear(64, VOCAB))
    rid = train_tracked(model, call=_lm_loss)
    params, profile = params_and_profile(rid)
    assert "gpuopt.flops_per_sample" in params  # the profile was logged
    assert not [p for p in ARCH_PARAMS if p in params]
    assert all(profile[k] is None for k in contract.ARCHITECTURE_PARAMS)


class BrokenConfig(nn.Module):
    """A model whose ``config`` property raises (a half-initialised wrapper)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    @property
    def config(self):
        raise RuntimeError("config is not ready")

    def forward(self, ids):
        return self.head(self.emb(ids))


def test_config_that_raises_still_trains_and_tracks(tracking_uri, caplog):
    model = BrokenConfig()
    before = model.head.weight.detach().clone()
    with caplog.at_level(logging.WARNING):
        rid = train_tracked(model, call=_lm_loss)
    assert not torch.equal(before, model.head.weight)  # it trained
    params, profile = params_and_profile(rid)
    assert params["gpuopt.micro_batch"] == str(MICRO) and "gpuopt.flops_per_sample" in params
    assert not [p for p in ARCH_PARAMS if p in params]
    assert not [r for r in caplog.records if r.getMessage().startswith("gpuopt:")]


def test_bad_architecture_param_is_left_out_with_the_run_intact(tracking_uri):
    """A run whose logged architecture is damaged (heads that do not divide, a negative
    width) still feeds the models: those fields are dropped and said, the rest kept."""
    rid = train_tracked(tiny_llama())
    params, profile = params_and_profile(rid)
    client = mlflow.MlflowClient()
    bad = client.create_run(mlflow.get_run(rid).info.experiment_id).info.run_id
    for k, v in params.items():
        client.log_param(bad, k, {"gpuopt.num_kv_heads": "3", "gpuopt.hidden_size": "-64"}
                         .get(k, v))
    for k, v in mlflow.get_run(rid).data.metrics.items():
        client.log_metric(bad, k, v)
    inputs = load_run_inputs([bad])  # no profile: the params are all there is
    w = inputs.workload
    assert w.num_kv_heads is None and w.hidden_size is None
    assert (w.num_layers, w.num_heads, w.ffn_hidden_size, w.mlp) == (2, 4, 176, "swiglu")
    assert w.params == int(params["gpuopt.params"])
    dropped = [n for n in inputs.notes if "left out" in n]
    assert len(dropped) == 2 and any("num_kv_heads" in n for n in dropped)


# -- architecture_of without training -----------------------------------------------------


def _with_config(config, *children: tuple[str, nn.Module]) -> nn.Module:
    m = nn.Module()
    for name, child in children:
        m.add_module(name, child)
    m.config = config
    return m


def test_nanogpt_config():
    cfg = SimpleNamespace(block_size=1024, vocab_size=50304, n_layer=12, n_head=12,
                          n_embd=768, dropout=0.0, bias=True)
    assert architecture_of(_with_config(cfg)) == Architecture(
        num_layers=12, hidden_size=768, num_heads=12, vocab_size=50304)


def test_litgpt_config():
    cfg = SimpleNamespace(n_layer=32, n_head=32, n_embd=4096, n_query_groups=8,
                          intermediate_size=14336, vocab_size=128000, padded_vocab_size=128256,
                          mlp_class_name="LLaMAMLP")
    assert architecture_of(_with_config(cfg)) == Architecture(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        mlp="swiglu", vocab_size=128256)
    neox = SimpleNamespace(n_layer=2, n_head=4, n_embd=64, n_query_groups=4,
                           intermediate_size=256, padded_vocab_size=512,
                           mlp_class_name="GptNeoxMLP")
    assert architecture_of(_with_config(neox)).mlp == "gelu"
    moe = SimpleNamespace(**{**vars(cfg), "mlp_class_name": "LLaMAMoE", "n_expert": 8})
    arch = architecture_of(_with_config(moe))
    assert arch.mlp is None and arch.ffn_hidden_size is None and arch.num_layers == 32


def test_hf_names_gated_only_with_a_gate_projection():
    cfg = SimpleNamespace(num_hidden_layers=4, hidden_size=128, num_attention_heads=8,
                          num_key_value_heads=8, intermediate_size=344, vocab_size=1000,
                          hidden_act="silu")
    gated = _with_config(cfg, ("gate_proj", nn.Linear(2, 2)))
    assert architecture_of(gated).mlp == "swiglu"
    plain = architecture_of(_with_config(cfg, ("fc", nn.Linear(2, 2))))
    assert plain.mlp is None and plain.ffn_hidden_size == 344 and plain.num_kv_heads == 8
    gelu = SimpleNamespace(**{**vars(cfg), "hidden_act": "gelu_pytorch_tanh"})
    assert architecture_of(_with_config(gelu, ("gate_proj", nn.Linear(2, 2)))).mlp == "geglu"


def test_wrappers_are_unwrapped():
    model = tiny_llama()
    expected = architecture_of(model)
    assert expected is not None and expected.num_kv_heads == 2
    assert architecture_of(nn.DataParallel(model)) == expected
    assert architecture_of(torch.compile(model)) == expected
    # a child called "module" is not a wrapper: the outer model's own config is read
    outer = _with_config(SimpleNamespace(n_layer=3, n_head=2, n_embd=32, vocab_size=64),
                         ("module", model))
    assert architecture_of(outer).num_layers == 3


def test_encoder_decoder_layers_are_both_stacks():
    """T5 answers ``num_hidden_layers`` with its encoder's layers alone; BART likewise."""
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
        num_heads=4))
    assert t5.config.num_hidden_layers == 2  # what the shared name says
    assert len(t5.encoder.block) + len(t5.decoder.block) == 5
    assert architecture_of(t5).num_layers == 5
    bart = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                   decoder_layers=4, encoder_attention_heads=4,
                                   decoder_attention_heads=4)
    assert architecture_of(_with_config(bart)).num_layers == 6
    # a decoder-only config is unchanged
    assert architecture_of(tiny_llama()).num_layers == 2


def test_peft_model_is_unwrapped():
    """PEFT's ``PeftModel`` (not installed here) keeps the user's model behind
    ``get_base_model()``; a class of its name and interface stands in for it."""
    model = tiny_llama()

    class PeftModelForCausalLM(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base_model = base

        def get_base_model(self):
            return self.base_model

    from mlflow_gpuopt.tracking.architecture import unwrap_model

    assert unwrap_model(PeftModelForCausalLM(model)) is model
    assert architecture_of(PeftModelForCausalLM(model)) == architecture_of(model)


@pytest.mark.parametrize("config", [
    None, "llama", {"num_hidden_layers": 2}, SimpleNamespace(),
    SimpleNamespace(num_hidden_layers="2", hidden_size=True, num_attention_heads=-4),
    SimpleNamespace(n_layer=2.5, n_embd=float("nan"), n_head=0),
])
def test_no_architecture_without_declared_counts(config):
    assert architecture_of(_with_config(config)) is None


def test_kv_heads_that_do_not_divide_are_dropped():
    cfg = SimpleNamespace(n_layer=2, n_head=6, n_embd=48, n_query_groups=4)
    arch = architecture_of(_with_config(cfg))
    assert arch.num_kv_heads is None and arch.num_heads == 6


def test_never_raises():
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError(name)

    assert architecture_of(_with_config(Exploding())) is None
    assert architecture_of(object()) is None
    assert architecture_of(None) is None


def test_padded_batches_count_real_tokens_and_report_the_padding(tracking_uri):
    """Variable-length sequences padded to the longest: tokens are the attention mask's
    ones; the padded share is reported apart; FLOPs are what ran (padded length)."""
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(3)
    real_per_step = []
    steps = 6
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(steps):
            lengths = torch.randint(2, SEQ + 1, (MICRO,), generator=gen)
            lengths[0] = SEQ  # padded to the longest
            ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=gen)
            mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            real_per_step.append(int(lengths.sum()))
    params, profile = params_and_profile(t.run_id)
    metrics = mlflow.get_run(t.run_id).data.metrics
    tokens_per_step = (metrics["gpuopt/summary/throughput_tokens_per_s"]
                       / metrics["gpuopt/summary/throughput_steps_per_s"])
    steady = [n for i, n in enumerate(real_per_step)  # the profiled step is no steady step
              if i >= OPTS["warmup_steps"] and i != t.config.profile_step]
    assert tokens_per_step == pytest.approx(sum(steady) / len(steady), rel=1e-6)
    profiled = real_per_step[t.config.profile_step]
    assert profile["padding_fraction"] == pytest.approx(1 - profiled / (MICRO * SEQ))
    assert float(params["gpuopt.padding_fraction"]) == pytest.approx(
        1 - profiled / (MICRO * SEQ), rel=1e-3)
    assert params["gpuopt.tokens_per_sample"] == str(SEQ)  # the length that ran


def test_unpadded_token_ids_report_no_padding(tracking_uri):
    params, profile = params_and_profile(train_tracked(tiny_llama()))
    assert profile["padding_fraction"] is None
    assert "gpuopt.padding_fraction" not in params
