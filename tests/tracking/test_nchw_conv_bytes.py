"""The channels-first convolutions' operand bytes (``nchw_conv_bytes_per_sample``,
tracking/traffic.py): what cuDNN's tensor-core kernels transpose, counted on real CPU
training under track() into a real sqlite store against bytes derived by hand, and read back
by ``predict --run-id``'s reader."""

from __future__ import annotations

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.tracking.traffic import channels_first_convolution

B, C_IN, C_MID, L, HW = 4, 3, 8, 10, 6  # batch, channels, 1-D length, 2-D side
F32 = 4


class Net(nn.Module):
    """A weight-normed Conv1d over (B, 3, 10), then a contiguous (NCHW) Conv2d and a
    channels-last one over (B, 8, 6, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.utils.parametrizations.weight_norm(nn.Conv1d(C_IN, C_MID, 3, padding=1))
        self.nchw = nn.Conv2d(C_MID, C_MID, 3, padding=1)
        self.nhwc = nn.Conv2d(C_MID, C_MID, 1).to(memory_format=torch.channels_last)
        self.nhwc.weight.data = torch.randn(C_MID, C_MID, 3, 3).to(
            memory_format=torch.channels_last)
        self.nhwc.padding = (1, 1)

    def forward(self, x1, x2):
        y = self.c1(x1)
        z = self.nchw(x2)
        w = self.nhwc(z.contiguous(memory_format=torch.channels_last))
        return y.sum() + w.sum()


def test_the_channels_first_convolutions_input_and_output_bytes_per_sample(tracking_uri):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(B, C_IN, L, generator=gen), torch.randn(B, C_MID, HW, HW,
                                                                   generator=gen))
               for _ in range(6)]
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        for x1, x2 in batches:
            model(x1, x2).backward()
            opt.step()
            opt.zero_grad()
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    # per sample: the Conv1d reads x1 (3 x 10) and writes y (8 x 10), its weight-normed
    # weight and its bias are weights; the NCHW Conv2d reads x2 and writes z (8 x 6 x 6
    # each); the channels-last one is not counted
    expected = F32 * ((C_IN * L + C_MID * L) + 2 * C_MID * HW * HW)
    assert expected == 2744  # summed once by hand: 4 x (30 + 80 + 576)
    assert prof["nchw_conv_bytes_per_sample"] == pytest.approx(expected)
    workload = load_run_inputs([t.run_id], client=MlflowClient()).workload
    assert workload.nchw_conv_bytes_per_sample == pytest.approx(expected)


@pytest.mark.parametrize("x, w, first", [
    (torch.ones(2, 4, 10), torch.ones(8, 4, 3), True),  # 1-D: always NCHW for cuDNN
    (torch.ones(2, 4, 5, 5), torch.ones(8, 4, 3, 3), True),  # contiguous 2-D
    (torch.ones(2, 4, 5, 5).to(memory_format=torch.channels_last), torch.ones(8, 4, 3, 3),
     False),  # a channels-last input makes the call NHWC
    (torch.ones(2, 4, 5, 5), torch.ones(8, 4, 3, 3).to(memory_format=torch.channels_last),
     False),  # so does a channels-last weight
    (torch.ones(2, 4, 3, 5, 5).to(memory_format=torch.channels_last_3d),
     torch.ones(8, 4, 1, 3, 3), False),  # 3-D, channels-last
    (torch.ones(2, 4, 3, 5, 5), torch.ones(8, 4, 1, 3, 3), True),
])
def test_which_convolutions_run_channels_first(x, w, first):
    assert channels_first_convolution((x, w, None)) is first
