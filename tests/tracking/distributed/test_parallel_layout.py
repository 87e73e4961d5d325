"""Degrees of parallelism and the links between ranks, as a tracked job logs them.

The 4-process torchrun job on a real (dp, tp) ``DeviceMesh`` is in
``test_distributed_torchrun.py``; here: the layout from ``TrackConfig`` and from a real
one-process mesh, the compound strategy string, and the interconnect label on an AMD node
(fake AMD SMI under the real reader).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mlflow_gpuopt import contract
from mlflow_gpuopt.perfmodel.layout import parse_layout
from mlflow_gpuopt.testing import FakeAmdGPU, fake_amdsmi
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.distributed.job import interconnect
from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout, detect_layout, mesh_degrees
from mlflow_gpuopt.tracking.run_params import with_layout


@pytest.mark.parametrize("layout,dp_strategy,expected", [
    (ParallelLayout(tp=2, dp=4), "fsdp", "tp2xfsdp"),
    (ParallelLayout(tp=4, pp=2, dp=2), "ddp", "tp4xpp2xddp"),
    (ParallelLayout(tp=8), "ddp", "tp8"),  # no replicas
    (ParallelLayout(tp=2, cp=2), "single", "tp2xddp"),  # cp ranks act as data parallel
    (ParallelLayout(dp=8), "fsdp", "fsdp"),  # no model parallelism: unchanged
    (ParallelLayout(tp=2, dp=2), "tp2xzero3", "tp2xzero3"),  # the user's own layout wins
])
def test_compound_strategy_string(layout, dp_strategy, expected):
    s = layout.strategy(dp_strategy)
    assert s == expected
    parse_layout(s)  # every string written is one --strategy accepts


def test_layout_from_track_config_fills_dp_from_the_world():
    layout = detect_layout(None, tp=2, pp=2, world_size=16)
    assert (layout.tp, layout.pp, layout.dp, layout.cp) == (2, 2, 4, 1)
    assert detect_layout(nn.Linear(2, 2), world_size=4) is None  # nothing names a degree
    start = {contract.PARAM_STRATEGY: "fsdp", contract.PARAM_WORLD_SIZE: 16}
    params = with_layout(start, layout)
    assert params[contract.PARAM_STRATEGY] == "tp2xpp2xfsdp"
    assert (params[contract.PARAM_TP], params[contract.PARAM_DP]) == (2, 4)
    assert with_layout(start, None) == start
    with pytest.raises(ValueError, match="tp must be"):
        TrackConfig(tp=0)


@pytest.fixture
def one_process_group(monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_layout_from_the_mesh_of_dtensor_parameters(one_process_group):
    """A model parallelised with torch's tensor-parallel API over a slice of a named 2-D
    mesh: the degrees are read from the root mesh its parameters live on."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel()})
    assert mesh_degrees(mesh["tp"]) == {"dp": 1, "tp": 1}  # the root mesh, not the slice
    layout = detect_layout(model, world_size=1)
    assert layout == ParallelLayout(tp=1, pp=1, dp=1, cp=1)
    # a given degree wins over the mesh; the explicit mesh is read as the model's would be
    assert detect_layout(model, device_mesh=mesh, tp=1, cp=2, world_size=1).cp == 2
    out = model(torch.randn(3, 4))  # the model still trains as parallelised
    assert out.shape == (3, 2)


def test_interconnect_names_infinity_fabric_on_amd_nodes(monkeypatch):
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    with fake_amdsmi([FakeAmdGPU() for _ in range(8)]):
        assert interconnect([0], gpus_per_node=8, nodes=1) == "infinity_fabric"
        assert interconnect([0], gpus_per_node=8, nodes=2) == "infinity_fabric+network"
    with fake_amdsmi([FakeAmdGPU(xgmi=False) for _ in range(2)]):
        assert interconnect([0], gpus_per_node=2, nodes=1) == "pcie"  # no xGMI: PCIe
