"""Fully sharded data parallel (FSDP2 ``fully_shard``) tracked by gpuopt as ONE MLflow run.

    torchrun --nproc-per-node=2 examples/train_fsdp.py --steps 60

Each linear layer is its own FSDP unit, then the root; parameters are sharded across ranks,
all-gathered for forward/backward and gradients reduce-scattered. ``gpuopt.track()`` times
those collectives through FSDP's ``set_custom_all_gather`` / ``set_custom_reduce_scatter``.
Works with ``gloo`` on CPU and ``nccl`` on GPU.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import _dist_common as dc
from _common import base_parser, setup_mlflow


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id on rank 0 (``None`` on other ranks)."""
    import mlflow_gpuopt as gpuopt

    parser = base_parser("FSDP2 on synthetic data, tracked by gpuopt as one run", steps=60)
    dc.add_args(parser)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    rank, world, device = dc.init()
    if args.autolog:
        import mlflow

        mlflow.autolog(silent=True)
    if rank == 0:
        setup_mlflow()
    mesh = init_device_mesh(device.type, (world,))
    model = dc.MLP().to(device)
    for layer in (model.fc1, model.fc2, model.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = dc.loader(rank, world, args.batch, seed=args.seed)
    with gpuopt.track(model=model, optimizer=opt, interval_s=args.interval, name="mlp-fsdp",
                      print_summary=rank == 0) as tracker:
        for step, (x, y) in enumerate(dc.batches(data, args.steps)):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
                print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"gpuopt run_id {tracker.run_id}", flush=True)
    return tracker.run_id


if __name__ == "__main__":
    main()
