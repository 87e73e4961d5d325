"""The profile counts MODEL FLOPs (PaLM's / Megatron's convention: 6·N·T + 12·L·T²·h for a
decoder, no recomputation): forward operators that activation checkpointing replays in the
backward are counted apart (``recompute_flops_per_sample``), and a fused attention backward
is charged 2 × its forward (the four gradient products; torch's formula adds the backward's
recomputation of QKᵀ).

Real training steps on CPU through the real profiler (driven as the step clock drives it,
or ``gpuopt.track()`` into a sqlite store). Every expected figure is computed here from the
models' dimensions: a Linear(i, o) is 2·i·o FLOPs per row forward, as much again for its
weight gradient and again for its input gradient (left out where the input needs none).
"""

from __future__ import annotations

import functools

import mlflow
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tiny_gpt import D, SEQ, VOCAB, TinyGPT, profile_step
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    set_checkpoint_early_stop,
)
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking.dispatch_count import (
    SDPA_BACKWARD_OPS,
    ReplayedFlops,
    model_flop_formulas,
)
from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

aten = torch.ops.aten
LAYERS = 2  # TinyGPT's blocks


def linear(n_in: int, n_out: int) -> int:
    """FLOPs of one row through Linear(n_in, n_out) forward (2 per multiply-add)."""
    return 2 * n_in * n_out


def tiny_gpt_model_flops() -> int:
    """Model FLOPs per sample of test_ops_seen's TinyGPT: 6·N·T over the blocks' 12·D²
    matmul weights and the head (every block's input needs a gradient: the embedding below
    trains) plus attention's 12·L·T²·D (QKᵀ and PV, 2·T²·D each forward, twice that back)."""
    weights = LAYERS * 12 * D * D + D * VOCAB
    return 6 * weights * SEQ + 12 * LAYERS * SEQ * SEQ * D


# Per block and sample, what each checkpointing replays. Non-reentrant checkpointing stops
# replaying once the last tensor the backward needs is saved again (torch's early stop): the
# block ends in fc2, whose product saves its input before it runs, so fc2 is not replayed;
# eager attention's core ends in P·V, which saves P and V before it runs, so only QKᵀ is.
QKV_PROJ_FC1 = SEQ * (linear(D, 3 * D) + linear(D, D) + linear(D, 4 * D))
FC2 = SEQ * linear(4 * D, D)
SDPA_FORWARD = 2 * 2 * SEQ * SEQ * D  # QKᵀ and PV, heads summed
QK = 2 * SEQ * SEQ * D


def _save_attention_only(ctx, op, *args, **kwargs):
    """Per-op selective checkpointing that keeps only the attention kernel's output."""
    if op is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class SaveAttentionOnly(TinyGPT):
    """TinyGPT whose blocks run under per-op selective checkpointing that saves the SDPA
    output and recomputes everything else (the products included)."""

    def __init__(self) -> None:
        super().__init__("sdpa", "none")
        for b in self.blocks:
            b.forward = functools.partial(
                checkpoint, b.body, use_reentrant=False,
                context_fn=functools.partial(create_selective_checkpoint_contexts,
                                             _save_attention_only))


@pytest.mark.parametrize("attention,ckpt,replayed_per_block", [
    ("sdpa", "none", 0),
    ("eager", "none", 0),
    ("sdpa", "full", QKV_PROJ_FC1 + SDPA_FORWARD),
    ("eager", "full", QKV_PROJ_FC1 + SDPA_FORWARD),
    ("sdpa", "reentrant", QKV_PROJ_FC1 + FC2 + SDPA_FORWARD),  # no early stop: all of it
    ("sdpa", "core", SDPA_FORWARD),  # selective: the attention core
    ("eager", "core", QK),
    ("sdpa", "op", 0),  # per-op selective that saves every product: element-wise ops only
])
def test_checkpointing_leaves_model_flops_unchanged(attention, ckpt, replayed_per_block):
    p = profile_step(TinyGPT(attention, ckpt))
    assert p.flops_per_sample == tiny_gpt_model_flops()
    assert p.recompute_flops_per_sample == LAYERS * replayed_per_block


def test_per_op_checkpointing_that_replays_products():
    """Per-op selective checkpointing (``create_selective_checkpoint_contexts``): the saved
    attention output comes from its cache (not dispatched again, not counted); the products
    it recomputes are counted apart."""
    p = profile_step(SaveAttentionOnly())
    assert p.recompute == "full"  # weight products were replayed
    assert p.flops_per_sample == tiny_gpt_model_flops()
    assert p.recompute_flops_per_sample == LAYERS * QKV_PROJ_FC1


class Mlp(nn.Module):
    """Linear(64, 256) → ReLU → Linear(256, 64), checkpointed or not."""

    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.ckpt = ckpt

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False) if self.ckpt else self.body(x)


def profile_mlp(model: nn.Module, batch: int = 8, retain_graph: bool = False):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 64)
    prof = WorkloadProfiler(model, opt)
    prof.begin_step(x)
    out = model(x)
    prof.end_forward(out)
    out.pow(2).mean().backward(retain_graph=retain_graph)
    opt.step()
    prof.end_step()
    return prof.result(batch, 1)


@pytest.mark.parametrize("early_stop,replayed", [
    (True, linear(64, 256)),  # the second Linear's input is saved again before it runs
    (False, linear(64, 256) + linear(256, 64)),  # the whole body replayed
])
def test_checkpointed_mlp(early_stop, replayed):
    # the first Linear's input needs no gradient: its backward is the weight gradient only
    model_flops = 2 * linear(64, 256) + 3 * linear(256, 64)
    plain = profile_mlp(Mlp(ckpt=False))
    with set_checkpoint_early_stop(early_stop):
        ckpt = profile_mlp(Mlp(ckpt=True))
    assert plain.flops_per_sample == ckpt.flops_per_sample == model_flops
    assert plain.recompute_flops_per_sample == 0
    assert ckpt.recompute_flops_per_sample == replayed
    assert plain.recompute == "none" and ckpt.recompute == "full"


def test_a_replay_in_a_backward_that_keeps_its_graph_is_still_a_replay():
    """``retain_graph=True`` keeps the graph as ``create_graph`` does, but the backward's first
    operator runs with gradients off: the checkpoint's replay is told apart all the same."""
    with set_checkpoint_early_stop(True):
        kept = profile_mlp(Mlp(ckpt=True), retain_graph=True)
    assert kept.recompute == "full" and kept.recompute_flops_per_sample == linear(64, 256)
    assert kept.flops_per_sample == 2 * linear(64, 256) + 3 * linear(256, 64)


def _counted(fn) -> dict:
    """FLOPs by operator of ``fn()`` under FlopCounterMode with the profiler's formulas."""
    replayed = ReplayedFlops()
    with FlopCounterMode(display=False, custom_mapping=model_flop_formulas(replayed)) as mode:
        fn()
    assert replayed.flops == 0  # nothing here runs inside a backward with grad on
    return {str(op): n for op, n in mode.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("q_shape,kv_shape,gqa", [
    ((2, 4, 16, 8), (2, 4, 16, 8), False),  # self-attention
    ((2, 4, 8, 8), (2, 4, 24, 8), False),  # cross-attention: s_q != s_k
    ((2, 8, 16, 8), (2, 2, 16, 8), True),  # grouped-query: 4 query heads per KV head
])
def test_cpu_fused_attention_backward_is_twice_its_forward(q_shape, kv_shape, gqa):
    q = torch.randn(q_shape, requires_grad=True)
    k, v = (torch.randn(kv_shape, requires_grad=True) for _ in range(2))

    def step():
        F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa).sum().backward()

    counts = _counted(step)
    fwd = counts["aten._scaled_dot_product_flash_attention_for_cpu"]
    bwd = counts["aten._scaled_dot_product_flash_attention_for_cpu_backward"]
    b, h, s_q, d = q_shape
    assert fwd == 2 * 2 * b * h * s_q * kv_shape[2] * d  # QKᵀ and PV over the query heads
    assert bwd == 2 * fwd


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _cuda_backward_args(name: str, q, k, v, out):
    """Arguments of each CUDA attention backward kernel as its schema orders them, up to
    the last one torch's FLOP formula reads (the rest are not passed)."""
    lse = _meta(*q.shape[:-1])
    if name == "_flash_attention_backward":
        return (out, q, k, v, out, lse, None, None, q.shape[-2], k.shape[-2])
    if name == "_efficient_attention_backward":
        return (out, q, k, v, None, out, None, None, q.shape[-2], k.shape[-2])
    return (out, q, k, v, out, lse)


@pytest.mark.parametrize("name", SDPA_BACKWARD_OPS)
def test_cuda_attention_backward_formulas_are_twice_the_forward(name):
    """The CUDA kernels' formulas (torch's, scaled to the convention), on meta tensors:
    the backward of attention over q [b, h, s_q, d_qk], v [b, h, s_k, d_v] is 2 × its
    forward, d_v != d_qk included."""
    formulas = model_flop_formulas(ReplayedFlops())
    q, k, v = _meta(2, 4, 16, 8), _meta(2, 4, 32, 8), _meta(2, 4, 32, 16)
    out = _meta(2, 4, 16, 16)
    forward = sdpa_flop_count(q.shape, k.shape, v.shape)
    assert formulas[getattr(aten, name)](*_cuda_backward_args(name, q, k, v, out)) == 2 * forward
    # torch's own formula counts QKᵀ a second time: 2·s_q·s_k·d_qk per head more
    torch_count = flop_registry[getattr(aten, name)](*_cuda_backward_args(name, q, k, v, out))
    assert torch_count - 2 * forward == 2 * 2 * 4 * 16 * 32 * 8


def test_nested_flash_backward_is_twice_its_forward():
    """Variable-length (jagged) batches: per sequence, the forward's FLOPs twice."""
    formulas = model_flop_formulas(ReplayedFlops())
    lengths = (3, 5, 8)
    total, heads, d = sum(lengths), 4, 8
    cum = torch.tensor([0, 3, 8, 16])
    q, k, v = (torch.empty(total, heads, d) for _ in range(3))
    out, lse = torch.empty(total, heads, d), torch.empty(heads, total)
    backward = formulas[aten._flash_attention_backward](out, q, k, v, out, lse, cum, cum, 8, 8)
    forward = sum(2 * 2 * heads * n * n * d for n in lengths)
    assert backward == 2 * forward


def _train(model, opt, steps: int = 4):
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, SEQ))
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("ckpt", ["full", "none"])
def test_track_logs_model_and_recompute_flops(tracking_uri, ckpt):
    """The run's params and profile.json: model FLOPs in flops_per_sample (so the MFU is
    model FLOPs utilisation), the replayed forward's apart; the param is left out when
    nothing was replayed, the profile says 0."""
    model = TinyGPT("sdpa", ckpt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.2, warmup_steps=1,
                      print_summary=False) as t:
        _train(model, opt)
    p = mlflow.get_run(t.run_id).data.params
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    replayed = LAYERS * (QKV_PROJ_FC1 + SDPA_FORWARD) if ckpt == "full" else 0
    assert prof["flops_per_sample"] == tiny_gpt_model_flops()
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(tiny_gpt_model_flops(),
                                                                rel=1e-5)
    assert prof["recompute_flops_per_sample"] == replayed
    if replayed:
        assert float(p["gpuopt.recompute_flops_per_sample"]) == pytest.approx(replayed,
                                                                          rel=1e-5)
    else:
        assert "gpuopt.recompute_flops_per_sample" not in p


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION",
                                     "CUDNN_ATTENTION"])
def test_cuda_fused_attention_backward_is_twice_its_forward(backend):
    """Each CUDA kernel that SDPA dispatches: its backward counted at 2 × its forward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = 2, 4, 128, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = []
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            forward = _counted(lambda: out.append(F.scaled_dot_product_attention(q, k, v)))
            backward = _counted(lambda: out[0].sum().backward())
    except RuntimeError as exc:  # the kernel does not take these inputs on this GPU
        pytest.skip(f"{backend}: {exc}")
    assert sum(forward.values()) == 2 * 2 * b * h * s * s * d
    assert sum(backward.values()) == 2 * sum(forward.values())


def test_a_fused_lstm_is_counted():
    """``nn.LSTM`` runs as one fused operator per layer and direction (``mkldnn_rnn_layer`` on
    a CPU, cuDNN's on CUDA) that torch's FLOP registry does not know: each step of each
    sequence multiplies the layer's input and hidden state by its 4·h-row weights, forward,
    then twice as much backward (data and weight gradients)."""
    t, b, i, h = 5, 3, 8, 16
    torch.manual_seed(0)
    model = nn.LSTM(i, h, num_layers=2, bidirectional=True, batch_first=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(b, t, i)
    profiler = WorkloadProfiler(model, opt)
    profiler.begin_step(x)
    loss = model(x)[0].sum()
    profiler.end_forward()
    loss.backward()
    profiler.end_step()
    first = 2 * 2 * 4 * h * (i + h)  # two directions, 2 FLOPs per multiply-add
    second = 2 * 2 * 4 * h * (2 * h + h)  # its input: both directions' outputs
    assert profiler.result(b, 1).flops_per_sample * b == pytest.approx(
        3 * t * b * (first + second))
