"""The profiled step's memory traffic (tracking/traffic.py): counted on real CPU training
under track() into a real sqlite store, against bytes derived by hand, and read back by
``predict --run-id``'s reader."""

from __future__ import annotations

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.tracking.traffic import TrafficCount

B, N_IN, N_OUT = 8, 16, 32  # batch, Linear in, Linear out
F32 = 4


def expected_bytes(batch: int) -> tuple[int, int, int]:
    """(activation bytes, their matmul part, weight bytes) of one forward+backward of
    ``sum(relu(Linear(x)))`` on a ``(batch, N_IN)`` fp32 input that needs no gradient, each
    operator reading its inputs and writing its outputs once:

    forward  addmm   reads x (bi) [bias o, W oi: weights], writes y (bo)
             relu    reads y (bo), writes r (bo)
             sum     reads r (bo), writes the loss (1)
    backward ones    reads the loss (1), writes its gradient (1)
             thr_bw  reads the gradient (one element expanded: 1) and r (bo), writes g (bo)
             mm      reads g (bo) and x (bi), writes dW (oi: a weight gradient)
             sum     reads g (bo), writes db (o: a weight gradient)
    """
    b, i, o = batch, N_IN, N_OUT
    activations = F32 * ((b * i + b * o) + 2 * b * o + (b * o + 1) + 2 + (1 + 2 * b * o)
                         + (b * o + b * i) + b * o)
    matmul = F32 * (2 * b * i + 2 * b * o)
    weights = F32 * 2 * (o * i + o)  # W and bias read, dW and db written
    return activations, matmul, weights


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N_IN, N_OUT), nn.ReLU())
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train(model, opt, steps: int, accum: int = 1) -> None:
    gen = torch.Generator().manual_seed(1)
    # made before: a batch drawn inside the step is the step's traffic too (its write)
    batches = iter([torch.randn(B, N_IN, generator=gen) for _ in range(steps * accum)])
    for _ in range(steps):
        for _ in range(accum):
            model(next(batches)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_hand_derived_bytes_of_linear_relu():
    assert expected_bytes(8) == (9232, 3072, 4352)  # the derivation, summed once by hand


@pytest.mark.parametrize("accum", [1, 2])
def test_track_logs_the_step_traffic_per_sample(tracking_uri, accum):
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6, accum=accum)
    activations, matmul, weights = expected_bytes(B)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    # the optimizer's own step (momentum buffers, weight update) is not counted; under
    # accumulation the second micro-batch's gradient is added into .grad: weight traffic
    assert prof["memory_traffic_bytes_per_sample"] == pytest.approx(activations / B)
    assert prof["matmul_traffic_bytes_per_sample"] == pytest.approx(matmul / B)
    # grad += new_grad per later micro-batch: two reads and a write of W's and b's size
    accumulate = F32 * 3 * (N_OUT * N_IN + N_OUT) * (accum - 1) / accum
    assert prof["weight_traffic_bytes_per_micro_step"] == pytest.approx(weights + accumulate)
    workload = load_run_inputs([t.run_id], client=MlflowClient()).workload
    assert workload.memory_traffic_bytes_per_sample == pytest.approx(activations / B)


def test_an_in_place_operator_reads_and_writes_its_self():
    count = TrafficCount()
    count.observe("relu", (torch.ones(4),), None, torch.ones(4))
    assert count.activation_bytes == 2 * 4 * F32
    x = torch.ones(4)
    count.observe("add_", (x, x), None, x)  # x + x in place: read once, written once
    assert count.activation_bytes == 2 * 4 * F32 + 2 * 4 * F32


def test_a_census_failure_never_reaches_training(tracking_uri, monkeypatch):
    def boom(self, *args):
        raise RuntimeError("census broke")

    monkeypatch.setattr(TrafficCount, "observe", boom)
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["memory_traffic_bytes_per_sample"] is None
    assert prof["kernels_per_micro_step"] > 0  # the rest of the profile is kept


def test_a_weight_used_at_two_steps_has_its_summed_gradient_counted_as_weight_traffic():
    """An RNN cell's weight: autograd adds the gradients of its two uses (``add``) and stores
    the sum in ``.grad``; both partial gradients, the sum's reads and its write are weight
    traffic, the activations the products read stay activations."""
    n, b = 8, 4
    w = torch.ones(n, n)
    count = TrafficCount({w.untyped_storage().data_ptr()})
    g1, g2, x1, x2 = (torch.ones(b, n) for _ in range(4))
    d1, d2 = torch.ones(n, n), torch.ones(n, n)
    count.observe("mm", (g1.t(), x1), None, d1)  # reads g1, x1 (b·n each), writes d1 (n·n)
    count.observe("mm", (g2.t(), x2), None, d2)
    total = torch.ones(n, n)
    count.observe("add", (d1, d2), None, total)  # reads d1, d2, writes the sum
    count.finish({total.untyped_storage().data_ptr()})
    assert count.activation_bytes == F32 * 4 * b * n
    assert count.matmul_bytes == F32 * 4 * b * n
    assert count.weight_bytes == F32 * (2 + 3) * n * n
