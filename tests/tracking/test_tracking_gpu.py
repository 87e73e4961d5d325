"""On a real CUDA GPU: NVML + torch.cuda backends, CUDA-event step timing, MFU."""

from __future__ import annotations

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_training_is_measured(tracking_uri):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(256, 1024, device="cuda")
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        for _ in range(40):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    run = mlflow.get_run(t.run_id)
    p, m = run.data.params, run.data.metrics
    assert p["gpuopt.device"] == torch.cuda.get_device_name(0)
    assert p["gpuopt.device_count"] == "1" and p["gpuopt.precision"] == "bf16"
    macs = 1024 * 4096 * 2
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(6 * macs - 2 * 1024 * 4096,
                                                                rel=0.05)
    assert m["gpuopt/summary/peak_memory_bytes"] > 4 * sum(q.numel() for q in model.parameters())
    assert 0 < m["gpuopt/summary/step_time_p50_s"] < 1.0
    client = MlflowClient()
    assert client.get_metric_history(t.run_id, "gpuopt/gpu_0_utilization_percent")
    assert client.get_metric_history(t.run_id, "gpuopt/gpu_0_torch_reserved_bytes")
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["activation_bytes_per_sample"] > 0
    if "gpuopt/summary/mfu" in m:  # the GPU's peak is known
        assert 0 < m["gpuopt/summary/mfu"] < 1
