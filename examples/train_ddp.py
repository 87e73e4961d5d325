"""Data-parallel training (``DistributedDataParallel``) tracked by gpuopt as ONE MLflow run.

    torchrun --nproc-per-node=2 examples/train_ddp.py --steps 60

``--batch`` / ``--grad-accum`` default to a launched plan's ``GPUOPT_MICRO_BATCH`` /
``GPUOPT_GRAD_ACCUM`` (``mlflow gpuopt recommend --emit torchrun``).

Every rank trains on its shard of a synthetic dataset; ``gpuopt.track()`` times DDP's
all-reduce through a communication hook, and rank 0 — the only rank that touches MLflow —
logs every rank's throughput and hardware and the job's global throughput. ``gloo`` on CPU,
``nccl`` on GPU. Logs into MLflow's current tracking URI (``sqlite:///mlflow.db`` if none).
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - usual name

import _dist_common as dc
from _common import base_parser, plan_int, setup_mlflow


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id on rank 0 (``None`` on other ranks)."""
    import mlflow_gpuopt as gpuopt

    parser = base_parser("DDP on synthetic data, tracked by gpuopt as one run", steps=60)
    dc.add_args(parser)
    parser.add_argument("--grad-accum", type=int, default=plan_int("GPUOPT_GRAD_ACCUM", 1),
                        help="micro-batches per optimizer step (default: $GPUOPT_GRAD_ACCUM "
                             "or 1)")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.grad_accum < 1:
        parser.error("--batch and --grad-accum must be at least 1")
    torch.manual_seed(args.seed)
    rank, world, device = dc.init()
    if args.autolog:
        import mlflow

        mlflow.autolog(silent=True)
    if rank == 0:  # only rank 0 talks to MLflow
        setup_mlflow()
    model = DDP(dc.MLP().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = dc.loader(rank, world, args.batch, seed=args.seed)
    with gpuopt.track(model=model, optimizer=opt, interval_s=args.interval, name="mlp-ddp",
                      print_summary=rank == 0) as tracker:
        micro_batches = dc.batches(data, args.steps * args.grad_accum)
        for step in range(args.steps):
            for micro in range(args.grad_accum):
                x, y = next(micro_batches)
                # all-reduce the gradients once per optimizer step, on the last micro-batch
                last = micro == args.grad_accum - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = F.cross_entropy(model(x.to(device)), y.to(device))
                    (loss / args.grad_accum).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
                print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"gpuopt run_id {tracker.run_id}", flush=True)
    return tracker.run_id


if __name__ == "__main__":
    main()
