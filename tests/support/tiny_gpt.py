"""A small GPT-shaped model whose attention, checkpointing and dtype a test chooses, and one
profiled training step of it, driven as the step clock drives the profiler (shared by the
profile tests of tests/tracking/)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

#: width, attention heads, sequence length (tokens per sample), vocabulary
D, HEADS, SEQ, VOCAB = 32, 4, 16, 64


class Block(nn.Module):
    """Pre-norm transformer block; ``attention`` "sdpa" or "eager"; ``ckpt`` "none",
    "full" (the whole block checkpointed), "core" (only softmax(QKᵀ)V: Korthikanti's
    selective recomputation) or "op" (per-op selective: products saved, the rest replayed)."""

    def __init__(self, attention: str, ckpt: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.attention, self.ckpt = attention, ckpt

    def core(self, q, k, v):
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        return scores.softmax(-1) @ v

    def body(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        if self.ckpt == "core":
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        if self.ckpt in ("full", "reentrant"):
            return checkpoint(self.body, x, use_reentrant=self.ckpt == "reentrant")
        if self.ckpt == "op":
            return checkpoint(self.body, x, use_reentrant=False,
                              context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                           _save_products))
        return self.body(x)


def _save_products(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    return (CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE)


class TinyGPT(nn.Module):
    def __init__(self, attention: str = "sdpa", ckpt: str = "none", autocast: bool = False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(attention, ckpt) for _ in range(2))
        self.head = nn.Linear(D, VOCAB)
        self.autocast = autocast

    def forward(self, ids):
        # autocast entered INSIDE forward, as accelerate and transformers do
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)


def profile_step(model: nn.Module, batch: int = 2):
    """One profiled step, driven as the step clock drives the profiler."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, VOCAB, (batch, SEQ), device=next(model.parameters()).device)
    prof = WorkloadProfiler(model, opt)
    prof.begin_step(ids)
    out = model(ids)
    prof.end_forward(out)
    F.cross_entropy(out.float().flatten(0, 1), ids.flatten()).backward()
    opt.step()
    prof.end_step()
    profile_step.ops = prof.ops  # what the last step's operators showed
    return prof.result(batch, 1)
