"""A tracked run with frozen layers (real PyTorch on the CPU, a real MLflow store, the fake
NVML A100): its profile counts only the work the step runs, and ``predict --run-id`` charges
gradients and optimizer state only for the parameters that train."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.cli import gpuopt as cli
from mlflow_gpuopt.testing import FakeGPU, fake_nvml

WIDTHS = (1024, 2048, 2048, 16)
MB = 16


def _frozen_run() -> str:
    torch.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:], strict=False)]
    model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
    for layer in layers[:2]:  # a frozen base, one trainable head (as a probe or adapter)
        layer.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    with (contextlib.redirect_stdout(io.StringIO()), fake_nvml([FakeGPU()]),
          gpuopt.track(model, opt, interval_s=0.1) as t):
        for _ in range(8):
            x = torch.randn(MB, WIDTHS[0], generator=gen)
            y = torch.randint(0, 16, (MB,), generator=gen)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return t.run_id


def test_frozen_layers_train_no_gradient_and_hold_no_optimizer_state(tracking_uri):
    run_id = _frozen_run()
    weights = [a * b for a, b in zip(WIDTHS, WIDTHS[1:], strict=False)]
    biases = list(WIDTHS[1:])
    total = sum(weights) + sum(biases)
    trainable = weights[-1] + biases[-1]
    r = CliRunner().invoke(cli, ["predict", "--run-id", run_id, "--gpu", "A100-80GB-SXM4",
                                 "--gpus", "1", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["memory"]
    # fp32 run: 4-byte weights for all, a 4-byte gradient and AdamW's 8 bytes for the head
    # (a full fine-tune would hold 4 + 8 bytes for each of the 6.3 M, not the 33 k)
    assert m["weights_bytes"] == pytest.approx(4 * total)
    assert m["gradients_bytes"] == pytest.approx(4 * trainable)
    # (the profile measures the state after a step: m, v and AdamW's step counters)
    assert m["optimizer_bytes"] == pytest.approx(8 * trainable, rel=1e-3)
    # The profile counts what ran: every forward product (2 FLOPs per weight), and in the
    # backward only the head's weight gradient: nothing before it needs a gradient.
    import mlflow

    flops = float(mlflow.get_run(run_id).data.params["gpuopt.flops_per_sample"])
    assert flops == pytest.approx(2 * sum(weights) + 2 * weights[-1], rel=0.01)
    assert flops < 0.4 * 6 * sum(weights)  # a full fine-tune's 6 FLOPs per weight
