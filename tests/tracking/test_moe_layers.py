"""Mixture-of-experts layers recognised in the tracked model: tiny Hugging Face Mixtral and
Qwen2-MoE models trained under ``gpuopt.track()`` into a sqlite store log their experts,
experts per token, shared experts, total and active parameters, counted here by hand from
the configs' sizes, and the same expert keys the model's ``config.json`` gives as a workload
file. The older Hugging Face block (a ``ModuleList`` of experts) and torchtitan's ``MoE``
(``router.gate``, grouped ``[experts, ...]`` weights, shared experts) are read without
training.
"""

from __future__ import annotations

import json

import mlflow
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from click.testing import CliRunner
from torch import nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import gpuopt as gpuopt_cli
from mlflow_gpuopt.hf_config import workload_doc
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.tracking.moe_layers import moe_fields

transformers = pytest.importorskip("transformers")

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}
VOCAB, SEQ, MICRO = 64, 8, 2
H, F_EXPERT, EXPERTS, K, LAYERS = 16, 24, 4, 2, 2
MOE_KEYS = tuple(contract.MOE_PARAMS)


def train_tracked(model) -> tuple[dict, dict, str]:
    """3 AdamW steps of next-token loss under ``track()``: (params, profile, run id)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(3):
            ids = torch.randint(0, VOCAB, (MICRO, SEQ))
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    params = mlflow.get_run(t.run_id).data.params
    profile = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    return params, profile, t.run_id


def attention_and_norms(config, qkv_bias: bool = False) -> int:
    """One decoder layer's attention and its two RMSNorms."""
    head = config.hidden_size // config.num_attention_heads
    q = config.num_attention_heads * head
    kv = config.num_key_value_heads * head
    return H * q + 2 * H * kv + q * H + 2 * H + ((q + 2 * kv) if qkv_bias else 0)


def test_mixtral_logs_experts_and_active_params(tracking_uri):
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=F_EXPERT,
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1,
        num_local_experts=EXPERTS, num_experts_per_tok=K, max_position_embeddings=SEQ)
    model = transformers.MixtralForCausalLM(config)
    params, profile, rid = train_tracked(model)
    expert = 3 * H * F_EXPERT  # gate, up, down
    layer = attention_and_norms(config) + H * EXPERTS + EXPERTS * expert
    total = 2 * VOCAB * H + LAYERS * layer + H  # embedding, head (untied), final norm
    assert total == sum(p.numel() for p in model.parameters())  # the hand count is right
    assert int(params["gpuopt.params"]) == total
    assert int(params["gpuopt.active_params"]) == total - LAYERS * (EXPERTS - K) * expert
    assert profile["active_params"] == int(params["gpuopt.active_params"])
    assert (params["gpuopt.num_experts"], params["gpuopt.experts_per_token"],
            params["gpuopt.expert_ffn_hidden_size"], params["gpuopt.moe_layer_freq"]) == (
        str(EXPERTS), str(K), str(F_EXPERT), "1")
    assert "gpuopt.num_shared_experts" not in params
    # one token's MLP width (top-k experts) and its kind, as the config.json workload says
    assert (params["gpuopt.ffn_hidden_size"], params["gpuopt.mlp"]) == (str(K * F_EXPERT),
                                                                        "swiglu")
    # the run plans as its config.json would: the same expert keys reach the workload
    doc, _ = workload_doc(config.to_dict(), SEQ, name="tiny-mixtral")
    workload = load_run_inputs([rid]).workload
    for key in (*MOE_KEYS, "ffn_hidden_size", "mlp", "params"):  # 0 shared: not logged
        assert (getattr(workload, key) or None) == (doc[key] or None), key
    # and predict plans its experts: expert parallel's all-to-all is in the breakdown
    r = CliRunner().invoke(gpuopt_cli, ["predict", "--run-id", rid, "--gpu", "H100-SXM5-80GB",
                                        "--gpus", "4", "--strategy", "ep2xfsdp", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["time_breakdown"]["alltoall_s"] > 0


def test_qwen2_moe_counts_its_shared_expert_and_sparse_step(tracking_uri):
    torch.manual_seed(0)
    width, shared, dense_width = 8, 16, 24
    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=dense_width,
        moe_intermediate_size=width, shared_expert_intermediate_size=shared,
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1,
        num_experts=EXPERTS, num_experts_per_tok=K, decoder_sparse_step=2,
        max_position_embeddings=SEQ)
    model = transformers.Qwen2MoeForCausalLM(config)
    params, _, rid = train_tracked(model)
    attn = attention_and_norms(config, qkv_bias=True)  # Qwen's q, k, v biases
    dense_layer = attn + 3 * H * dense_width
    expert = 3 * H * width
    moe_layer = attn + H * EXPERTS + EXPERTS * expert + 3 * H * shared + H  # + shared gate
    total = 2 * VOCAB * H + dense_layer + moe_layer + H  # layer 1 of 2 is MoE (step 2)
    assert total == sum(p.numel() for p in model.parameters())
    assert int(params["gpuopt.params"]) == total
    assert int(params["gpuopt.active_params"]) == total - (EXPERTS - K) * expert
    assert (params["gpuopt.num_experts"], params["gpuopt.experts_per_token"],
            params["gpuopt.num_shared_experts"], params["gpuopt.moe_layer_freq"]) == (
        str(EXPERTS), str(K), str(shared // width), "2")
    doc, _ = workload_doc(config.to_dict(), SEQ, name="tiny-qwen2-moe")
    workload = load_run_inputs([rid]).workload
    for key in (*MOE_KEYS, "ffn_hidden_size"):
        assert (getattr(workload, key) or None) == (doc[key] or None), key


class OldMixtralBlock(nn.Module):
    """transformers 4's ``MixtralSparseMoeBlock``: ``gate`` Linear, ``experts`` ModuleList of
    w1/w2/w3 MLPs, ``top_k``."""

    def __init__(self, experts: int = 8, held: int = 8, width: int = 12) -> None:
        super().__init__()
        self.top_k = 2
        self.gate = nn.Linear(H, experts, bias=False)
        self.experts = nn.ModuleList(nn.ModuleDict({
            "w1": nn.Linear(H, width, bias=False), "w2": nn.Linear(width, H, bias=False),
            "w3": nn.Linear(H, width, bias=False)}) for _ in range(held))


class TitanRouter(nn.Module):
    def __init__(self, experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(H, experts, bias=False)
        self.top_k = top_k


class TitanGroupedExperts(nn.Module):
    def __init__(self, experts: int, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.zeros(experts, width, H))
        self.w2 = nn.Parameter(torch.zeros(experts, H, width))
        self.w3 = nn.Parameter(torch.zeros(experts, width, H))


class TitanMoE(nn.Module):
    """torchtitan's ``MoE``: ``router`` (``gate``, ``top_k``), grouped experts, a shared
    FeedForward ``hidden_dim × num_shared_experts`` wide."""

    def __init__(self, experts: int = 8, width: int = 10, shared: int = 2) -> None:
        super().__init__()
        self.router = TitanRouter(experts, top_k=3)
        self.experts = TitanGroupedExperts(experts, width)
        self.shared_experts = nn.ModuleDict({
            "w1": nn.Linear(H, width * shared, bias=False),
            "w2": nn.Linear(width * shared, H, bias=False),
            "w3": nn.Linear(H, width * shared, bias=False)})


def _fields(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    return moe_fields(model, {"params": total, "trainable_params": total})


def test_modulelist_experts_and_expert_parallel_shards():
    full = nn.Sequential(nn.Embedding(VOCAB, H), OldMixtralBlock())
    f = _fields(full)
    expert = 3 * H * 12
    assert (f["num_experts"], f["experts_per_token"], f["expert_ffn_hidden_size"]) == (8, 2, 12)
    assert f["active_params"] == f["params"] - 6 * expert
    # a rank holding 2 of the 8 experts (expert parallel over 4): the whole model counted
    shard = nn.Sequential(nn.Embedding(VOCAB, H), OldMixtralBlock(held=2))
    assert _fields(shard)["params"] == f["params"]
    assert _fields(shard)["active_params"] == f["active_params"]
    # a router whose experts are not these (3 held of 8): not a MoE block
    assert _fields(nn.Sequential(OldMixtralBlock(held=3))) == {}


def test_torchtitan_moe_grouped_experts_and_shared_experts():
    model = nn.Sequential(TitanMoE(), TitanMoE())
    f = _fields(model)
    expert = 3 * H * 10
    assert (f["num_experts"], f["experts_per_token"], f["num_shared_experts"],
            f["expert_ffn_hidden_size"]) == (8, 3, 2, 10)
    assert f["params"] == sum(p.numel() for p in model.parameters())
    assert f["active_params"] == f["params"] - 2 * (8 - 3) * expert
    assert "moe_layer_freq" not in f  # no config says how many layers there are
    # a dense model has no MoE fields
    assert _fields(nn.Sequential(nn.Linear(H, H), nn.Linear(H, 4))) == {}


def test_dense_run_logs_no_moe_params(tracking_uri):
    model = nn.Sequential(nn.Embedding(VOCAB, H), nn.Linear(H, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(3):
            ids = torch.randint(0, VOCAB, (MICRO, SEQ))
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
    params = mlflow.get_run(t.run_id).data.params
    assert "gpuopt.params" in params
    assert not [p for p in (*contract.MOE_PARAMS.values(), contract.PARAM_ACTIVE_PARAMS)
                if p in params]
