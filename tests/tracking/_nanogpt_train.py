"""A training loop in the structure of Karpathy's nanoGPT ``train.py``, tracked by gpuopt.

Written for tests/tracking/test_nanogpt_loop.py: the loop the most LLM training code is copied
from, with the tracker added the way a user adds it (one ``with gpuopt.track(...)`` around the
loop). What it keeps from nanoGPT's structure:

* DDP when ``WORLD_SIZE > 1`` (gloo on CPU), ``raw_model = model.module``, and the total
  ``gradient_accumulation_steps`` divided by the world size;
* micro-steps that set ``model.require_backward_grad_sync`` (nanoGPT's replacement for
  ``no_sync()``) on every micro-step but the last;
* ``with ctx:`` autocast (bf16 / fp16) or a null context (fp32), the loss computed inside
  ``forward(idx, targets)`` and divided by the accumulation steps, the next batch fetched right
  after the forward (nanoGPT's asynchronous prefetch);
* ``GradScaler`` (enabled for fp16 only), ``unscale_``, gradient clipping, ``scaler.step``,
  ``scaler.update``, ``zero_grad(set_to_none=True)``;
* a cosine learning rate with warm-up written into ``param_group["lr"]`` every iteration;
* ``estimate_loss`` every ``eval_interval`` iterations: ``model.eval()``, several forwards of
  both splits under ``torch.no_grad()``, ``model.train()``;
* AdamW with weight decay on 2-D parameters only, ``fused`` where available (CUDA);
* a GPT with tied token-embedding / LM-head weights and ``scaled_dot_product_attention``.

``main(argv)`` returns this process's facts (the MLflow run id on rank 0, the iterations run,
the eval forwards, ...) and, with ``--out``, writes them to ``<out>.rank<r>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 32  # tokens per sample
    vocab_size: int = 96
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = [z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                 for z in self.c_attn(x).split(c, dim=2)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.mlp_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """Token + position embeddings, pre-LN blocks, an LM head tied to the token embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg  # as nanoGPT keeps it: the tracker reads the architecture here
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT (and GPT-2) do

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:  # inference: the last position only
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float], device_type: str):
        """AdamW; matrices (matmul weights, embeddings) decay, biases and norms do not."""
        params = [p for p in self.parameters() if p.requires_grad]  # tied: listed once
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = "fused" in inspect.signature(torch.optim.AdamW).parameters \
            and device_type == "cuda"
        extra = {"fused": True} if fused else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)


def analytic_flops_per_sample(cfg: GPTConfig) -> float:
    """Forward + backward FLOPs of one sample (``block_size`` tokens), from the dimensions.

    Matmul weights: per layer the attention's QKV (3d²) and output (d²) projections and the
    MLP (8d²), plus the LM head (d·V; the tied embedding's lookup is no matmul): 2 FLOPs per
    weight per token forward and 4 backward (input and weight gradients; every layer's input
    needs a gradient, since the embeddings below it train). Attention: QKᵀ and AV are
    2·T²·d each forward (counted over the full T×T, as FlopCounterMode counts SDPA), twice
    that backward: 12·T²·d per layer.
    """
    d, t = cfg.n_embd, cfg.block_size
    matmul_params = cfg.n_layer * 12 * d * d + d * cfg.vocab_size
    return 6.0 * matmul_params * t + 12.0 * cfg.n_layer * t * t * d


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-iters", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--block-size", type=int, default=GPTConfig.block_size)
    p.add_argument("--gradient-accumulation-steps", type=int, default=3,
                   help="micro-steps per iteration for the whole job (divided by world size)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    p.add_argument("--eval-interval", type=int, default=2)
    p.add_argument("--eval-iters", type=int, default=3)
    p.add_argument("--init-scale", type=float, default=2.0 ** 16,
                   help="GradScaler's first scale (fp16); a large one makes it skip steps")
    p.add_argument("--interval", type=float, default=0.2, help="gpuopt sampling period, s")
    p.add_argument("--run-name", default="nanogpt")
    p.add_argument("--out", default=None, help="write this process's facts to OUT.rank<r>.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import mlflow_gpuopt as gpuopt

    args = parse_args(argv)
    ddp = int(os.environ.get("RANK", "-1")) != -1 and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

        dist.init_process_group(backend="gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        assert args.gradient_accumulation_steps % world == 0
        gradient_accumulation_steps = args.gradient_accumulation_steps // world
    else:
        rank, world = 0, 1
        gradient_accumulation_steps = args.gradient_accumulation_steps
    master_process = rank == 0
    torch.manual_seed(1337 + rank)
    device_type = "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
               "float16": torch.float16}[args.dtype]
    ctx = (contextlib.nullcontext() if args.dtype == "float32"
           else torch.autocast(device_type=device_type, dtype=ptdtype))

    # the data: a fixed token stream per split (nothing downloaded)
    gen = torch.Generator().manual_seed(0)
    cfg = GPTConfig(block_size=args.block_size)
    data = {"train": torch.randint(cfg.vocab_size, (20_000,), generator=gen),
            "val": torch.randint(cfg.vocab_size, (4_000,), generator=gen)}

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = data[split]
        ix = torch.randint(len(d) - args.block_size, (args.batch_size,))
        x = torch.stack([d[i:i + args.block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + args.block_size] for i in ix])
        return x, y

    model = GPT(cfg)
    scaler = torch.amp.GradScaler(device_type, init_scale=args.init_scale,
                                  enabled=(args.dtype == "float16"))
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
    if ddp:
        model = DDP(model)
    raw_model = model.module if ddp else model

    eval_forwards = 0

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        nonlocal eval_forwards
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                xb, yb = get_batch(split)
                with ctx:
                    _, loss = model(xb, yb)
                eval_forwards += 1
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    learning_rate, min_lr, warmup_iters, lr_decay_iters = 6e-4, 6e-5, 2, args.max_iters

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    train_forwards = 0
    skipped_steps = 0
    lrs = []
    eval_s = []  # seconds estimate_loss took before each iteration's micro-steps (0: none)
    x, y = get_batch("train")  # the first batch, fetched before the loop
    iter_num = 0
    with gpuopt.track(model=model, optimizer=optimizer, run_name=args.run_name,
                      interval_s=args.interval, print_summary=master_process) as tracker:
        while iter_num < args.max_iters:
            lr = get_lr(iter_num)
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            lrs.append(lr)
            eval_s.append(0.0)
            if iter_num % args.eval_interval == 0:
                t0 = time.perf_counter()
                losses = estimate_loss()
                eval_s[-1] = time.perf_counter() - t0
                if master_process:
                    print(f"step {iter_num}: train loss {losses['train']:.4f}, "
                          f"val loss {losses['val']:.4f}", flush=True)
            for micro_step in range(gradient_accumulation_steps):
                if ddp:
                    # sync gradients only on the last micro-step (nanoGPT's no_sync())
                    model.require_backward_grad_sync = \
                        micro_step == gradient_accumulation_steps - 1
                with ctx:
                    _, loss = model(x, y)
                    loss = loss / gradient_accumulation_steps
                train_forwards += 1
                x, y = get_batch("train")  # prefetch the next batch while backward runs
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped_steps += scaler.get_scale() < scale  # inf/NaN found: the update was skipped
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
    facts = {"rank": rank, "world_size": world, "iterations": iter_num,
             "gradient_accumulation_steps": gradient_accumulation_steps,
             "train_forwards": train_forwards, "eval_forwards": eval_forwards,
             "skipped_steps": skipped_steps,
             "batch_size": args.batch_size, "block_size": args.block_size,
             "params": sum(p.numel() for p in raw_model.parameters()),
             "analytic_flops_per_sample": analytic_flops_per_sample(cfg),
             "config": asdict(cfg), "lrs": lrs, "eval_s": eval_s, "run_id": tracker.run_id,
             "decay_groups": [len(g["params"]) for g in optimizer.param_groups]}
    if ddp:
        import torch.distributed as dist

        dist.destroy_process_group()
    if args.out:
        with open(f"{args.out}.rank{rank}.json", "w") as f:
            json.dump(facts, f)
    return facts


if __name__ == "__main__":
    main()
