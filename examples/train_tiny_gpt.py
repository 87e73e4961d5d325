"""Train a tiny decoder-only GPT (character level) on generated text, tracked by gpuopt.

    python examples/train_tiny_gpt.py --steps 30
    torchrun --nproc-per-node 2 examples/train_tiny_gpt.py --steps 30   # DDP, one run

Text: sentences from a small generated grammar (deterministic; nothing downloaded).
Optimizer AdamW; bf16 autocast when the CPU (or GPU) supports it. Under ``torchrun`` (more than
one process) the model is wrapped in DistributedDataParallel (gloo on CPU, nccl on GPU) and
only rank 0 talks to MLflow. ``--batch`` / ``--grad-accum`` default to a launched plan's
``GPUOPT_MICRO_BATCH`` / ``GPUOPT_GRAD_ACCUM``. Logs into MLflow's current tracking URI
(``sqlite:///mlflow.db`` if none is set).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

from _common import add_batch_args, base_parser, setup_mlflow


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 64  # tokens per sample
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    batch_size: int = 16
    lr: float = 3e-3


def make_text(n_sentences: int = 3000, seed: int = 0) -> str:
    """Sentences from a tiny grammar: learnable structure, no download."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my friend", "the robot", "our teacher", "a small bird"]
    verbs = ["sees", "likes", "chases", "builds", "paints", "finds"]
    objects = ["a red ball", "the old house", "some bread", "a tall tree", "the blue sky"]
    endings = [".", "!", " today.", " again.", " at night."]
    return " ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
                    f"{rng.choice(endings)}" for _ in range(n_sentences))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, ``n_layers`` pre-LN blocks, an untied LM head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def analytic_flops_per_sample(cfg: GPTConfig) -> float:
    """Training FLOPs for one sample (one sequence of ``seq_len`` tokens), forward + backward:
    6 · (matmul params) · tokens + attention (QKᵀ and AV: 12 · L · T² · d).

    Not used for training: it is the paper-and-pencil figure that the tracker's measured
    ``flops_per_sample`` is checked against (tests/tracking/test_examples.py).
    """
    d, t, layers = cfg.d_model, cfg.seq_len, cfg.n_layers
    matmul_params = layers * (3 * d * d + d * d + 8 * d * d) + d * cfg.vocab_size
    return 6.0 * matmul_params * t + 12.0 * layers * t * t * d


def batches(data: torch.Tensor, cfg: GPTConfig, gen: torch.Generator):
    while True:
        ix = torch.randint(len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        x = torch.stack([data[i:i + cfg.seq_len] for i in ix])
        y = torch.stack([data[i + 1:i + cfg.seq_len + 1] for i in ix])
        yield x, y


def bf16_available(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        return True
    except Exception:
        return False


def _init_distributed() -> tuple[int, int]:
    """``(rank, world_size)``; joins the process group when started by ``torchrun`` with
    more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id (``None`` on ranks other than 0)."""
    import mlflow

    import mlflow_gpuopt as gpuopt

    parser = base_parser("Tiny GPT on generated text, tracked by gpuopt", steps=30)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default=None)
    add_batch_args(parser, micro_batch=GPTConfig.batch_size)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.grad_accum < 1:
        parser.error("--batch and --grad-accum must be at least 1")
    rank, world = _init_distributed()
    torch.manual_seed(args.seed)
    if rank == 0:  # only rank 0 talks to MLflow
        setup_mlflow()
        plan = os.environ.get("GPUOPT_PLAN")
        if plan:
            print(f"gpuopt plan {plan}: micro-batch {args.batch} × {args.grad_accum}, "
                  f"{world} process(es)", flush=True)
    cfg = replace(GPTConfig(), batch_size=args.batch)
    text = make_text(seed=args.seed)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    assert len(chars) <= cfg.vocab_size
    device = "cuda" if torch.cuda.is_available() else "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    model = TinyGPT(cfg).to(torch.device("cuda", local_rank) if device == "cuda" else device)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

        model = DDP(model, device_ids=[local_rank] if device == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    use_bf16 = (args.precision or ("bf16" if bf16_available(device) else "fp32")) == "bf16"
    gen = torch.Generator().manual_seed(args.seed + rank)  # each rank its own batches
    it = batches(data, cfg, gen)
    run_ctx = mlflow.start_run(run_name="tiny-gpt") if rank == 0 else contextlib.nullcontext()
    with run_ctx as run:
        if rank == 0:
            mlflow.log_params({"model": "TinyGPT", "batch_size": cfg.batch_size,
                               "seq_len": cfg.seq_len, "d_model": cfg.d_model,
                               "n_layers": cfg.n_layers})
        with gpuopt.track(model=model, optimizer=opt, interval_s=args.interval, name="tiny-gpt",
                          print_summary=rank == 0):
            for step in range(args.steps):
                for micro in range(args.grad_accum):
                    x, y = (z.to(device) for z in next(it))
                    last = micro == args.grad_accum - 1
                    sync = contextlib.nullcontext() if last or world == 1 else model.no_sync()
                    with sync:
                        with torch.autocast(device, dtype=torch.bfloat16, enabled=use_bf16):
                            logits = model(x)
                        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size),
                                               y.view(-1))
                        (loss / args.grad_accum).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                    mlflow.log_metric("loss", loss.item(), step=step)
                    print(f"step {step:4d}  loss {loss.item():.3f}  "
                          f"(uniform {math.log(len(chars)):.3f})")
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return run.info.run_id if rank == 0 else None


if __name__ == "__main__":
    main()
