"""Degrees of parallelism and the links between ranks, as a tracked job logs them.

The 4-process torchrun job on a real (dp, tp) ``DeviceMesh`` is in
``test_distributed_torchrun.py``; here: the layout from ``TrackConfig`` and from a real
one-process mesh, the compound strategy string, and the interconnect label on an AMD node
(fake AMD SMI under the real reader).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mlflow_gpuopt import contract
from mlflow_gpuopt.perfmodel.layout import is_strategy, parse_layout
from mlflow_gpuopt.testing import FakeAmdGPU, fake_amdsmi
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.distributed.job import interconnect
from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout, detect_layout, mesh_degrees
from mlflow_gpuopt.tracking.run_params import with_layout


@pytest.mark.parametrize("layout,dp_strategy,expected", [
    (ParallelLayout(tp=2, dp=4), "fsdp", "tp2xfsdp"),
    (ParallelLayout(tp=4, pp=2, dp=2), "ddp", "tp4xpp2xddp"),
    (ParallelLayout(tp=8), "ddp", "tp8"),  # no replicas
    # cp ranks reduce gradients with the data-parallel ones: the flavour is named with cp
    (ParallelLayout(tp=2, cp=2), "single", "tp2xcp2xddp"),
    (ParallelLayout(dp=4, cp=2), "fsdp", "cp2xfsdp"),
    (ParallelLayout(dp=8), "fsdp", "fsdp"),  # no model parallelism: unchanged
    (ParallelLayout(tp=2, dp=2), "tp2xzero3", "tp2xzero3"),  # the user's own layout wins
    (ParallelLayout(dp=4, ep=2), "fsdp", "ep2xfsdp"),  # ep ranks are data-parallel ranks
    (ParallelLayout(tp=2, dp=8, ep=4), "single", "tp2xep4xddp"),
])
def test_compound_strategy_string(layout, dp_strategy, expected):
    s = layout.strategy(dp_strategy)
    assert s == expected
    parse_layout(s)  # every string written is one --strategy accepts


@pytest.mark.parametrize("layout,dp_strategy,expected", [
    (ParallelLayout(dp=2, cp=2), "ddp", "cp2xddp"),
    (ParallelLayout(tp=2, pp=2, dp=2, cp=4, ep=2), "fsdp", "tp2xpp2xcp4xep2xfsdp"),
])
def test_context_parallel_degree_is_part_of_the_strategy_string(layout, dp_strategy, expected):
    s = layout.strategy(dp_strategy)
    assert s == expected
    if is_strategy("cp2xddp"):  # --strategy reads cpN where the models have the degree
        parse_layout(s)


def test_expert_degree_from_a_mesh_dimension_multiplies_data_parallel():
    """A (dp 2, ep 2) mesh is 4 data-parallel ranks whose experts are split in pairs (the
    ``ep2xddp`` layout the models take); ``TrackConfig.ep`` alone leaves dp to the world."""
    class Named:  # a mesh's names and shape, as mesh_degrees reads them (the real 4-rank
        # mesh is the torchrun job's, test_moe_parallel.py)
        mesh_dim_names, shape = ("dp", "ep"), (2, 2)

    assert mesh_degrees(Named()) == {"dp": 2, "ep": 2}
    layout = detect_layout(None, device_mesh=Named(), world_size=4)
    assert (layout.dp, layout.ep, layout.strategy("ddp")) == (4, 2, "ep2xddp")
    layout = detect_layout(None, ep=4, world_size=8)
    assert (layout.dp, layout.ep) == (8, 4)
    assert layout.params()[contract.PARAM_EP] == 4
    with pytest.raises(ValueError, match="ep must be"):
        TrackConfig(ep=0)


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


def test_torchtitan_mesh_with_a_flattened_ep_mesh(one_process_group):
    """torchtitan's expert-parallel mesh: ``dp_shard`` split into ``dp_shard_mod_ep`` x
    ``dp_shard_in_ep`` (both data parallel) and ``ep`` a mesh flattened from
    ``dp_shard_in_ep`` (with ``cp``), kept by the root mesh: its size is the degree, its
    ranks already in dp. On one process every size is 1; the shapes say the rest."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 1, 1, 1),
                            mesh_dim_names=("dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp"))
    assert "ep" not in mesh_degrees(mesh)  # not flattened yet: no degree
    mesh["dp_shard_in_ep", "cp"]._flatten("ep")
    assert mesh_degrees(mesh["tp"]) == {"dp": 1, "cp": 1, "tp": 1, "ep": 1}

    class Titan:  # the same names at (mod_ep 2, in_ep 4, cp 1, tp 2), ep flattened to 4
        mesh_dim_names, shape = ("dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp"), (2, 4, 1, 2)
        _flatten_mapping = {"ep": SimpleNamespace(size=lambda: 4)}

    layout = detect_layout(None, device_mesh=Titan(), world_size=16)
    assert (layout.dp, layout.ep, layout.tp) == (8, 4, 2)  # ep not multiplied into dp again
    assert layout.strategy("fsdp") == "tp2xep4xfsdp"
    parse_layout(layout.strategy("fsdp"))
