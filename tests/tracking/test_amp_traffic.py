"""The profiled step's memory traffic under CUDA autocast (tracking/traffic.py's ``amp_*``):
a small real model trained on the CPU under track() into a real sqlite store, against bytes
derived by hand from PyTorch's documented autocast policy; a step that ran 16-bit already
(CPU autocast) is not converted twice; and the prior's reading of the figure
(compute.memory_traffic_bytes_per_sample, hidden_traffic_share)."""

from __future__ import annotations

import dataclasses

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Workload

B, N_IN, H, N_OUT = 8, 12, 16, 10  # batch, input, hidden (LayerNorm), output (softmax)


def expected_amp_bytes(b: int, i: int, h: int, o: int) -> tuple[int, int]:
    """(activation bytes, their matmul part) of one forward+backward of
    ``softmax(Linear2(LayerNorm(Linear1(x)))).pow(2).sum()`` under CUDA autocast, from its
    policy (https://pytorch.org/docs/stable/amp.html#cuda-op-specific-behavior): Linear and
    mm (16-bit list) cast each fp32 input in a kernel of its own (read 4, write 2) and read
    it at 2, write 2; LayerNorm, softmax and sum (float32 list) cast a 16-bit input up (read
    2, write 4) and read it at 4, write 4; pow and mul (not listed) run at their input's
    type. The backward reads what its forward saved (the casts' copies) and casts gradients
    only. Weights and the weight gradients left out (weight traffic). Per element:

    forward  addmm    x: cast 4+2, read 2 (8bi); writes y1 half (2bh)
             layer    y1: cast up 2+4, read 4 (10bh); writes n (4bh), mean, rstd (4b each)
             addmm    n: cast 8bh; writes z half (2bo)
             softmax  z: cast up 10bo; writes s (4bo)
             pow      reads s, writes s² (8bo)
             sum      reads s² (4bo), writes the loss (4)
    backward ones     reads the loss, writes its gradient (8)
             pow      reads s, writes s¹ (8bo); mul by 2 (8bo); mul by the gradient,
                      one element expanded (8bo + 4)
             softmax  reads the gradient and s, writes gz (12bo)
             mm       gz: an fp32 gradient, cast 8bo; writes dn half (2bh)
             mm       gz's copy (2bo), n's saved copy (2bh); writes dW2 (weights)
             sum      reads gz (4bo); writes db2 (weights)
             layer    dn: cast up 10bh; y1's saved fp32 copy (4bh), mean, rstd (8b);
                      writes dy1 (4bh)
             mm       dy1: cast 8bh; x's saved copy (2bi); writes dW1 (weights)
             sum      reads dy1 (4bh); writes db1 (weights)
    """
    total = 10 * b * i + 58 * b * h + 78 * b * o + 16 * b + 16
    matmul = 10 * b * i + 22 * b * h + 12 * b * o
    return total, matmul


def test_hand_derivation_sums():
    # the derivation's terms, summed once more by hand for the batch of 4 of (8, 16, 6)
    assert expected_amp_bytes(4, 8, 16, 6) == (
        (8 * 32 + 2 * 64) + (10 * 64 + 4 * 64 + 32) + (8 * 64 + 2 * 24) + 14 * 24 + 8 * 24
        + (4 * 24 + 4) + 8 + 3 * 8 * 24 + 4 + 12 * 24 + (8 * 24 + 2 * 64) + (2 * 24 + 2 * 64)
        + 4 * 24 + (14 * 64 + 4 * 64 + 32) + (8 * 64 + 2 * 32) + 4 * 64,
        (8 * 32 + 2 * 64) + (8 * 64 + 2 * 24) + (8 * 24 + 2 * 64) + (2 * 24 + 2 * 64)
        + (8 * 64 + 2 * 32))


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N_IN, H), nn.LayerNorm(H), nn.Linear(H, N_OUT), nn.Softmax(-1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model, opt, steps: int, autocast: bool = False) -> None:
    gen = torch.Generator().manual_seed(1)
    batches = iter([torch.randn(B, N_IN, generator=gen) for _ in range(steps)])
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(next(batches)).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_track_logs_the_step_traffic_under_autocast(tracking_uri):
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6)
    total, matmul = expected_amp_bytes(B, N_IN, H, N_OUT)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["precision"] in ("fp32", "tf32")
    assert prof["amp_traffic_bytes_per_sample"] == pytest.approx(total / B)
    assert prof["amp_matmul_traffic_bytes_per_sample"] == pytest.approx(matmul / B)
    # the fp32 figure is its own count, not this one halved
    assert prof["memory_traffic_bytes_per_sample"] != pytest.approx(total / B / 2, rel=0.1)
    workload = load_run_inputs([t.run_id], client=MlflowClient()).workload
    assert workload.amp_traffic_bytes_per_sample == pytest.approx(total / B)
    assert compute.memory_traffic_bytes_per_sample(workload, "fp16") == pytest.approx(total / B)
    assert compute.memory_traffic_bytes_per_sample(workload, "fp32") == pytest.approx(
        prof["memory_traffic_bytes_per_sample"])


def test_a_step_that_ran_under_autocast_is_not_converted_again(tracking_uri):
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6, autocast=True)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["precision"] == "bf16"
    assert prof["amp_traffic_bytes_per_sample"] == prof["memory_traffic_bytes_per_sample"]
    assert prof["amp_matmul_traffic_bytes_per_sample"] == prof["matmul_traffic_bytes_per_sample"]
    workload = load_run_inputs([t.run_id], client=MlflowClient()).workload
    measured = prof["memory_traffic_bytes_per_sample"]
    assert compute.memory_traffic_bytes_per_sample(workload, "fp16") == pytest.approx(measured)


FP32 = Workload(params=10**6, flops_per_sample=1e10, precision="fp32",
                memory_traffic_bytes_per_sample=8e8, matmul_traffic_bytes_per_sample=2e8,
                amp_traffic_bytes_per_sample=6e8, amp_matmul_traffic_bytes_per_sample=1e8)


@pytest.mark.parametrize("precision, traffic, share", [
    ("fp32", 8e8, 0.25), ("tf32", 8e8, 0.25), ("bf16", 6e8, 1 / 6), ("fp16", 6e8, 1 / 6),
    ("fp8", 6e8 * 27 / 34, 1 / 6)])
def test_the_prior_reads_the_autocast_bytes_for_mixed_targets(precision, traffic, share):
    assert compute.memory_traffic_bytes_per_sample(FP32, precision) == pytest.approx(traffic)
    assert compute.hidden_traffic_share(FP32, precision) == pytest.approx(share)


def test_without_the_figure_the_prior_halves():
    plain = dataclasses.replace(FP32, amp_traffic_bytes_per_sample=None,
                                amp_matmul_traffic_bytes_per_sample=None)
    assert compute.memory_traffic_bytes_per_sample(plain, "bf16") == pytest.approx(4e8)
    assert compute.hidden_traffic_share(plain, "bf16") == pytest.approx(0.25)
    # a 16-bit workload's own figure is already 16-bit: the autocast one is not read
    half = dataclasses.replace(FP32, precision="bf16")
    assert compute.memory_traffic_bytes_per_sample(half, "fp16") == pytest.approx(8e8)


def expected_dropout_amp_bytes(b: int, i: int, h: int) -> tuple[int, int]:
    """(activation bytes, their matmul part) under CUDA autocast of one forward+backward of
    ``Linear2(dropout(Linear1(x))).mean()``, where everything after the first cast stays
    16-bit: the CPU's dropout mask (``empty_like(y1).bernoulli_().div_()``) has ``y1``'s
    dtype, ``mean`` and the backward's ``sum`` (not autocast: autocast is off in the
    backward) run at their 16-bit inputs' type, and the loss's 0-dim gradient is 16-bit:

    forward  addmm     x: cast 4+2, read 2 (8bi); writes y1 (2bh)
             bernoulli_, div_   the mask in place: read and write (4bh each)
             mul       y1, mask; writes d (6bh)
             addmm     d; writes z (4bh)
             mean      z; writes the loss (2bh + 2)
    backward ones      the loss, its gradient (4); div spreads it: 2 + 2bh
             mm        gz, writes gd (4bh); mm gzᵀ, d (4bh, dW2: weights); sum gz (2bh)
             mul       gd, mask; writes gy1 (6bh)
             mm        gy1ᵀ, x's saved copy (2bh + 2bi; dW1: weights); sum gy1 (2bh)
    """
    return 10 * b * i + 44 * b * h + 8, 10 * b * i + 16 * b * h


def test_dropout_and_the_backward_stay_16_bit():
    from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode
    from mlflow_gpuopt.tracking.ops_seen import OpsSeen
    from mlflow_gpuopt.tracking.traffic import TrafficCount

    torch.manual_seed(0)
    first, second = nn.Linear(N_IN, H), nn.Linear(H, H)
    params = [*first.parameters(), *second.parameters()]
    ops = OpsSeen()
    ops.traffic = count = TrafficCount({p.untyped_storage().data_ptr() for p in params})
    x = torch.randn(B, N_IN)
    with kernel_count_mode(ops):
        second(nn.functional.dropout(first(x), 0.5, True)).mean().backward()
    count.finish({p.grad.untyped_storage().data_ptr() for p in params})
    total, matmul = expected_dropout_amp_bytes(B, N_IN, H)
    assert count.amp_activation_bytes == pytest.approx(total)
    assert count.amp_matmul_bytes == pytest.approx(matmul)
    # all 16-bit after the input's cast: about half the fp32 bytes, the cast above it
    assert count.amp_activation_bytes < 0.6 * count.activation_bytes
