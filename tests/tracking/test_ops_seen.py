"""What the profiled step ran, read from its operators: the attention kernel, activation
recomputation, and the precision of the matrix products (FP8 included).

Real training steps on CPU through the real profiler (``WorkloadProfiler`` driven as the
step clock drives it, or ``gpuopt.track()`` into a sqlite store), on small GPT-shaped models
whose attention, checkpointing and dtype each test chooses (tests/support/tiny_gpt.py).
"""

from __future__ import annotations

import mlflow
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tiny_gpt import D, SEQ, VOCAB, TinyGPT, profile_step
from torch import nn

import mlflow_gpuopt as gpuopt


@pytest.mark.parametrize("attention,ckpt,expected", [
    ("sdpa", "none", ("sdpa", "none")),
    ("eager", "none", ("eager", "none")),
    ("sdpa", "full", ("sdpa", "full")),
    ("eager", "full", ("eager", "full")),
    ("sdpa", "reentrant", ("sdpa", "full")),  # the older CheckpointFunction path
    ("eager", "core", ("eager", "selective")),
    ("sdpa", "op", ("sdpa", "selective-op")),
])
def test_attention_kernel_and_recompute_mode(attention, ckpt, expected):
    p = profile_step(TinyGPT(attention, ckpt))
    assert (p.attention, p.recompute) == expected
    assert p.precision == "fp32" and p.fp8_recipe is None


def test_no_attention_is_none():
    p = profile_step(nn.Sequential(nn.Embedding(VOCAB, D), nn.Linear(D, VOCAB)))
    assert p.attention is None and p.recompute == "none"


def test_precision_is_what_the_products_ran_in():
    assert profile_step(TinyGPT(autocast=True)).precision == "bf16"  # autocast inside forward
    assert profile_step(TinyGPT().to(torch.bfloat16)).precision == "bf16"
    assert profile_step(TinyGPT().to(torch.float16)).precision == "fp16"


class ScaledMMLinear(nn.Linear):
    """A linear layer whose forward product runs in FP8 through ``torch._scaled_mm`` (as
    torchao float8 training does): operands cast to float8_e4m3fn with per-tensor scales."""

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        sx = flat.abs().amax().clamp(min=1e-12) / 448.0
        sw = self.weight.abs().amax().clamp(min=1e-12) / 448.0
        with torch.no_grad():  # _scaled_mm has no derivative: gradients go straight through
            xq = (flat / sx).to(torch.float8_e4m3fn)
            wq = (self.weight / sw).to(torch.float8_e4m3fn)
            y = torch._scaled_mm(xq, wq.t(), scale_a=sx.float(), scale_b=sw.float(),
                                 out_dtype=torch.bfloat16).float()
        ref = flat @ self.weight.t()
        y = ref + (y - ref).detach()
        return (y + self.bias).reshape(*x.shape[:-1], -1)


def test_fp8_from_scaled_mm_operands():
    model = nn.Sequential(nn.Embedding(VOCAB, D), ScaledMMLinear(D, 4 * D), nn.GELU(),
                          ScaledMMLinear(4 * D, VOCAB))
    p = profile_step(model)
    assert p.precision == "fp8" and p.fp8_recipe is None  # no recipe said


class _Granularity:  # torchao's ScalingGranularity enum values
    def __init__(self, value):
        self.value = value


class Float8Linear(nn.Linear):
    """Named like torchao's float8 layer, with its config shape (scaling granularity)."""

    def __init__(self, *args, granularity: str = "axiswise"):
        super().__init__(*args)
        cast = type("CastConfig", (), {"scaling_granularity": _Granularity(granularity)})()
        self.config = type("Float8LinearConfig", (), {"cast_config_input": cast})()


class TELinear(nn.Linear):
    """A module whose class lives in ``transformer_engine`` and that ran with FP8 on (TE sets
    ``module.fp8`` from its fp8_autocast state at each forward)."""

    __module__ = "transformer_engine.pytorch.module.linear"

    def forward(self, x):
        self.fp8 = True
        return super().forward(x)


@pytest.mark.parametrize("layer,recipe", [
    (lambda: Float8Linear(D, VOCAB, granularity="axiswise"), "rowwise"),
    (lambda: Float8Linear(D, VOCAB, granularity="tensorwise"), "tensorwise"),
    (lambda: TELinear(D, VOCAB), "te"),
])
def test_fp8_layers_name_the_recipe(layer, recipe):
    p = profile_step(nn.Sequential(nn.Embedding(VOCAB, D), layer()))
    assert (p.precision, p.fp8_recipe) == ("fp8", recipe)


def test_te_layer_without_fp8_is_not_fp8():
    class Off(TELinear):
        def forward(self, x):
            self.fp8 = False
            return nn.Linear.forward(self, x)

    Off.__module__ = "transformer_engine.pytorch.module.linear"
    p = profile_step(nn.Sequential(nn.Embedding(VOCAB, D), Off(D, VOCAB)))
    assert p.precision == "fp32" and p.fp8_recipe is None


def _train(model, opt, steps=4):
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, SEQ))
        out = model(ids)
        loss = F.cross_entropy(out.float().flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_track_logs_what_ran(tracking_uri):
    """The params and profile.json of a tracked run carry attention, recompute, precision."""
    model = TinyGPT("eager", "full", autocast=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.2, warmup_steps=1,
                      print_summary=False) as t:
        _train(model, opt)
    run = mlflow.get_run(t.run_id)
    p = run.data.params
    assert (p["gpuopt.attention"], p["gpuopt.recompute"], p["gpuopt.precision"]) == (
        "eager", "full", "bf16")
    assert "gpuopt.fp8_recipe" not in p
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert (prof["attention"], prof["recompute"], prof["precision"]) == ("eager", "full", "bf16")


def test_plain_fp32_loop_is_fp32(tracking_uri):
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.2, print_summary=False) as t:
        _train(model, opt)
    p = mlflow.get_run(t.run_id).data.params
    assert p["gpuopt.precision"] == "fp32" and p["gpuopt.attention"] == "sdpa"


@pytest.mark.parametrize("flag", ["allow_tf32", "matmul_precision"])
def test_tf32_flags_are_recorded_on_a_cpu(tracking_uri, flag):
    """A script that asks for TF32 matmuls runs them as TF32 on the GPUs it is planned on:
    its precision is tf32 on a CPU too (and the TF32 advice has nothing to say)."""
    before = torch.get_float32_matmul_precision()
    try:
        if flag == "allow_tf32":
            torch.backends.cuda.matmul.allow_tf32 = True  # (a property: set as scripts do)
        else:
            torch.set_float32_matmul_precision("high")
        model = TinyGPT()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with gpuopt.track(model=model, optimizer=opt, interval_s=0.2,
                          print_summary=False) as t:
            _train(model, opt)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision(before)
    assert not torch.backends.cuda.matmul.allow_tf32
    assert mlflow.get_run(t.run_id).data.params["gpuopt.precision"] == "tf32"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_fused_sdpa_and_tf32(monkeypatch):
    """On CUDA, SDPA runs a fused kernel (flash / memory-efficient / cuDNN) and fp32
    products run as TF32 when the matmul flag says so; autocast bf16 reads bf16."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    p = profile_step(TinyGPT().cuda())
    assert (p.attention, p.precision) == ("sdpa", "tf32")
    assert profile_step.ops.sdpa_ops - {"_safe_softmax"}  # a fused kernel, not the fallback
    assert profile_step(TinyGPT().cuda().to(torch.bfloat16)).precision == "bf16"
