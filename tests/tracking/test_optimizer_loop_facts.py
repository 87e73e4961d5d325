"""How a tracked optimizer's step runs on CUDA and over how many parameter tensors
(``optimizer_param_tensors``, ``optimizer_impl``: tracking/optimizers.py), read from real
``torch.optim`` objects and logged by track() into a real sqlite store."""

from __future__ import annotations

import mlflow
import pytest
import torch
import torch.nn as nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking.optimizers import optimizer_loop_facts


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # 4 tensors
    return model


class FusedAdam(torch.optim.Adam):
    """An apex-style fused optimizer, by its class name."""


def test_the_cuda_implementation_each_optimizer_resolves_to():
    model = _model()
    params = list(model.parameters())
    major = int(torch.__version__.split(".")[0])
    default = "foreach" if major >= 2 else "for-loop"
    assert optimizer_loop_facts(torch.optim.Adam(params)) == (4, default)
    assert optimizer_loop_facts(torch.optim.SGD(params, lr=0.1, foreach=False)) == (4,
                                                                                  "for-loop")
    assert optimizer_loop_facts(torch.optim.AdamW(params, foreach=True)) == (4, "foreach")
    assert optimizer_loop_facts(FusedAdam(params)) == (4, "fused")
    assert optimizer_loop_facts(torch.optim.LBFGS(params)) == (4, None)  # no foreach form
    # a frozen tensor in the groups is not updated
    params[0].requires_grad_(False)
    assert optimizer_loop_facts(torch.optim.Adam(params, foreach=False)) == (3, "for-loop")
    assert optimizer_loop_facts(object()) == (None, None)


@pytest.mark.parametrize("foreach, impl", [(False, "for-loop"), (True, "foreach")])
def test_track_logs_the_tensors_and_the_implementation(tracking_uri, foreach, impl):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
    batches = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        for x in batches:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert (prof["optimizer_param_tensors"], prof["optimizer_impl"]) == (4, impl)
