"""The memory format of a tracked convolutional network: read from its ``Conv2d`` weights,
logged as ``gpuopt.memory_format`` and ``profile.json``'s ``memory_format``, and fed by
``predict --run-id`` into the workload (docs/metrics.md). Real training of a small conv net on
CPU under ``gpuopt.track()`` into a sqlite store."""

from __future__ import annotations

import json

import mlflow
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from click.testing import CliRunner
from torch import nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import gpuopt as gpuopt_cli
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.tracking.model_facts import memory_format_of
from support.tracking import params_and_profile

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}


def conv_net() -> nn.Module:
    """A small ResNet-like stem and block: 3x3 and 1x1 convolutions, BatchNorm, ReLU."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def train_tracked(model, channels_last: bool, steps: int = 4) -> str:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(steps):
            x = torch.randn(4, 3, 16, 16).contiguous(memory_format=fmt)
            loss = F.cross_entropy(model(x), torch.randint(0, 10, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert t.run_id
    return t.run_id



def predict_tf32_a100(run_id: str) -> float:
    r = CliRunner().invoke(gpuopt_cli, ["predict", "--run-id", run_id, "--gpu",
                                        "A100-80GB-SXM4", "--gpus", "1", "--micro-batch", "64",
                                        "--precision", "tf32", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["throughput_samples_per_s"]


def test_memory_format_of_reads_the_conv_weights():
    net = conv_net()
    assert memory_format_of(net) == "contiguous"
    net.to(memory_format=torch.channels_last)
    # the 1x1 kernel's weight is both formats at once; the 3x3 ones tell
    assert net[3].weight.is_contiguous() and net[3].weight.is_contiguous(
        memory_format=torch.channels_last)
    assert memory_format_of(net) == "channels_last"
    assert memory_format_of(nn.Sequential(nn.Linear(4, 4))) is None

    class Unreadable:  # stands for a sharded weight whose strides cannot be asked
        def dim(self):
            return 4

        def is_contiguous(self, memory_format=None):
            raise RuntimeError("not a local tensor")

    del net[0].weight
    net[0].weight = Unreadable()
    assert memory_format_of(net) == "channels_last"  # the other 3x3 kernel still tells


def test_tracked_conv_net_logs_its_memory_format_and_predict_uses_it(tracking_uri):
    nchw = train_tracked(conv_net(), channels_last=False)
    nhwc = train_tracked(conv_net().to(memory_format=torch.channels_last), channels_last=True)
    for rid, fmt in ((nchw, "contiguous"), (nhwc, "channels_last")):
        params, profile = params_and_profile(rid)
        assert profile["memory_format"] == fmt
        assert params[contract.PARAM_MEMORY_FORMAT] == fmt
        assert load_run_inputs([rid]).workload.memory_format == fmt
    # From the profile alone on an A100 in TF32: the NCHW run pays the transposes. (The
    # channels-last run dispatches more operators on CPU, its input copies, so its host
    # overhead is the larger: only the transposes can make the NCHW run the slower.)
    assert predict_tf32_a100(nchw) < predict_tf32_a100(nhwc)


def test_a_model_without_convolutions_logs_no_memory_format(tracking_uri):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(3):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    params, profile = params_and_profile(t.run_id)
    assert profile["memory_format"] is None
    assert contract.PARAM_MEMORY_FORMAT not in params
    assert load_run_inputs([t.run_id]).workload.memory_format is None


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_profile_param_fills_a_missing_profile_key(tracking_uri, fmt):
    """A run whose profile.json lacks the key (written before it existed) takes the param."""
    rid = train_tracked(conv_net(), channels_last=False, steps=3)
    params, profile = params_and_profile(rid)
    client = mlflow.MlflowClient()
    other = client.create_run(mlflow.get_run(rid).info.experiment_id).info.run_id
    for k, v in params.items():
        client.log_param(other, k, fmt if k == contract.PARAM_MEMORY_FORMAT else v)
    for k, v in mlflow.get_run(rid).data.metrics.items():
        client.log_metric(other, k, v)
    client.log_dict(other, {k: v for k, v in profile.items() if k != "memory_format"},
                    "gpuopt/profile.json")
    assert load_run_inputs([other]).workload.memory_format == fmt
