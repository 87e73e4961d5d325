"""Tensor parallel × FSDP2 on a 2-D ``DeviceMesh``, tracked by gpuopt as ONE MLflow run.

    torchrun --nproc-per-node=4 examples/train_tp_fsdp.py --steps 30

The mesh is ``(dp, tp)``: each MLP's first layer is split by columns and the second by rows
over ``tp`` (``torch.distributed.tensor.parallel``), then every layer and the root are fully
sharded over ``dp``. ``gpuopt.track()`` reads the degrees from the mesh the parameters live
on and logs ``gpuopt.tp``, ``gpuopt.dp`` and ``gpuopt.strategy = tp<N>xfsdp``, so the run
calibrates predictions of tensor-parallel layouts. Works with ``gloo`` on CPU and ``nccl``.
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
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import _dist_common as dc
from _common import base_parser, setup_mlflow


def main(argv: list[str] | None = None) -> str | None:
    """Train and track; returns the MLflow run id on rank 0 (``None`` on other ranks)."""
    import mlflow_gpuopt as gpuopt

    parser = base_parser("TP x FSDP2 on synthetic data, tracked by gpuopt as one run", steps=30)
    dc.add_args(parser)
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (default 2)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    rank, world, device = dc.init()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the {world} processes")
    if rank == 0:
        setup_mlflow()
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    model = dc.MLP().to(device)
    # fc1 split by output features, fc2 by input features: one all-reduce per forward
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    for layer in (model.fc1, model.fc2, model.head):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # ranks of one tensor-parallel group read the same batch: data is sharded over dp only
    data = dc.loader(mesh["dp"].get_local_rank(), world // args.tp, args.batch, seed=args.seed)
    with gpuopt.track(model=model, optimizer=opt, interval_s=args.interval, name="mlp-tp-fsdp",
                      print_summary=rank == 0) as tracker:
        for step, (x, y) in enumerate(dc.batches(data, args.steps)):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"gpuopt run_id {tracker.run_id}", flush=True)
    return tracker.run_id


if __name__ == "__main__":
    main()
