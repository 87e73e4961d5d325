"""AMD GPUs priced and recommended: the Azure MI300X offer, the vendor data of the models, and
a recommendation over a real tracked run that an AMD offer wins when it is cheapest."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner
from support.sqlite_store import sqlite_uri

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.cli import gpuopt as gpuopt_cli
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import comm, compute, vendor

ROCM_SENTENCE = "ROCm/RCCL; PyTorch ROCm build required"


@pytest.fixture(autouse=True)
def _shipped_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(tmp_path / "cache"))  # no user cache


def test_pricing_show_lists_the_azure_mi300x_offer():
    res = CliRunner().invoke(gpuopt_cli, ["pricing", "show", "--gpu", "AMD Instinct MI300X",
                                          "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    offers = json.loads(res.stdout)
    assert [o["instance_type"] for o in offers] == ["Standard_ND96isr_MI300X_v5"]
    o = offers[0]
    assert o["provider"] == "azure" and o["gpu"] == "MI300X" and o["gpu_count"] == 8
    assert o["gpu_memory_gb"] == 192 and o["intra_node_link"] == "infinity_fabric"
    assert o["price_per_hour_usd"] == pytest.approx(48.0) and o["is_estimate"] is True
    assert o["as_of"] and "cliffcenter.com" in o["source"]


def test_vendor_data_and_the_mi300x_node_in_the_models():
    assert vendor.gpu_vendor("MI300X") == "amd" and vendor.gpu_vendor("H100-SXM5-80GB") == "nvidia"
    link = vendor.intra_node_link("MI300X")
    assert link.kind == "infinity_fabric" and link.collective == "rccl"
    assert link.aggregate_gb_per_s_each_way == pytest.approx(448.0)  # 7 × 64 GB/s
    assert vendor.collective_bus_efficiency("MI300X", comm.BUS_EFFICIENCY) == pytest.approx(
        314 / 448)
    assert vendor.collective_bus_efficiency("A100-80GB-SXM4", 0.75) == 0.75  # not measured here
    assert vendor.attainable_fraction("MI300X") == pytest.approx(0.45)
    assert vendor.attainable_fraction("H100-SXM5-80GB") is None
    assert vendor.relative_to_nvidia("MI300X", compute.COMPUTE_EFFICIENCY_TENSOR) < 1.0
    cat = load_catalog()
    offer = next(o for o in cat.offers if o.gpu == "MI300X")
    hw = hardware_for_gpu(cat.gpus["MI300X"], gpus_per_node=8, offer=offer)
    assert hw.intra_node_bytes_per_s == pytest.approx(448e9)  # catalog 896 is bidirectional
    assert hw.peak_flops_per_s["bf16"] == pytest.approx(1307.4e12)
    assert hw.memory_bytes == pytest.approx(192e9)


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory):
    """A real tracked training run (CPU) in a sqlite MLflow store: (tracking uri, run id)."""
    import mlflow

    tmp = tmp_path_factory.mktemp("amd_rec")
    uri = sqlite_uri(tmp / "mlflow.db")
    mlflow.set_tracking_uri(uri)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
            for _ in range(12):
                loss = model(torch.randn(256, 1024)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
        return uri, t.run_id
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)


def _recommend(uri, run_id, monkeypatch, *args):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    res = CliRunner().invoke(gpuopt_cli, ["recommend", "--run-id", run_id, "--provider", "azure",
                                          "--json", "--no-log", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_amd_offer_wins_when_cheapest_for_the_deadline(measured_run, monkeypatch):
    uri, run_id = measured_run
    # 40B samples in 6 h (median time, as no GPU was measured the interval is wide) at the
    # run's per-GPU batch of 256 (kept on every GPU): one 8-GPU A100 node needs ~8 h; the
    # MI300X node 4.6 h, two A100 nodes 4.2 h at 2 % more, one H100 node 3.9 h at 1.7x the
    # cost. At a batch of 64 the GEMMs' 64 rows fill 16 of the MI300X's 304 CUs per wave
    # (compute.wave_tail_time_s), and the A100 node wins.
    doc = _recommend(uri, run_id, monkeypatch, "--samples", "40B", "--deadline", "6h",
                     "--confidence", "0.5", "--no-spot", "--keep-micro-batch")
    win = doc["winner"]
    ranked = [(c["instance_type"], c["predicted_cost_usd"], c["meets_deadline"])
              for c in doc["candidates"]]
    assert win is not None and win["gpu"] == "MI300X", ranked
    assert win["instance_type"] == "Standard_ND96isr_MI300X_v5"
    # it is the cheapest plan that meets the deadline, NVIDIA ones included
    meeting = [c for c in doc["candidates"] if c["meets_deadline"]]
    assert win["predicted_cost_usd"] == min(c["predicted_cost_usd"] for c in meeting)
    assert any(c["gpu"] != "MI300X" for c in doc["candidates"])  # NVIDIA plans were ranked
    text = "\n".join(doc["explanation"])
    assert ROCM_SENTENCE in text and "MI300X is an AMD GPU" in text
    assert "AMD GPU: ROCm/RCCL" in win["why"]


def test_explanation_names_rocm_only_when_an_amd_gpu_wins(measured_run, monkeypatch):
    """A job one cheap NVIDIA GPU finishes in time: no AMD sentence in the explanation."""
    uri, run_id = measured_run
    doc = _recommend(uri, run_id, monkeypatch, "--samples", "1M", "--deadline", "30d",
                     "--max-gpus", "1")
    assert doc["winner"] is not None and doc["winner"]["gpu"] != "MI300X"
    assert ROCM_SENTENCE not in "\n".join(doc["explanation"])
