"""Kernels per micro-step under CUDA autocast (``amp_kernels_per_micro_step``): the cast
kernels tracking/traffic.py's autocast count puts before the operators, counted on a small
real model against a hand count from PyTorch's documented CUDA autocast policy; once per
forward for the weights under gradient accumulation; a step that ran 16-bit is not
converted twice; and the prior's reading of the figure (compute.kernel_count)."""

from __future__ import annotations

import dataclasses

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.perfmodel import compute, fitting
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

B, N_IN, H, N_OUT = 8, 12, 16, 10

#: Casts of one forward+backward of ``softmax(Linear2(LayerNorm(Linear1(x)))).pow(2).sum()``
#: under CUDA autocast (https://pytorch.org/docs/stable/amp.html#cuda-op-specific-behavior):
#: forward: Linear1 (16-bit list) casts x, its weight and its bias (3); LayerNorm (float32
#: list) casts its 16-bit input up (1; its own parameters are fp32 already); Linear2 casts
#: the normalised activations, its weight and bias (3); softmax casts its 16-bit input up
#: (1); pow and sum take the fp32 softmax output as it is (0). Backward: the softmax
#: gradient (fp32) is cast down once for Linear2's products (1); LayerNorm's backward casts
#: the 16-bit gradient up (1); Linear1's weight-gradient product casts LayerNorm's fp32
#: input gradient (1). The weights' copies and the saved activations' are reused.
CASTS_PER_MICRO_STEP = 3 + 1 + 3 + 1 + 1 + 1 + 1


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N_IN, H), nn.LayerNorm(H), nn.Linear(H, N_OUT),
                          nn.Softmax(-1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model, opt, steps: int, accum: int = 1, autocast: bool = False) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(accum):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(torch.randn(B, N_IN, generator=gen)).pow(2).sum()
            loss.backward()
        opt.step()
        opt.zero_grad()


def test_the_census_counts_the_casts_of_one_micro_step():
    from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode
    from mlflow_gpuopt.tracking.ops_seen import OpsSeen
    from mlflow_gpuopt.tracking.traffic import TrafficCount

    model, _ = model_and_opt()
    ops = OpsSeen()
    ops.traffic = count = TrafficCount(
        {p.untyped_storage().data_ptr() for p in model.parameters()})
    with kernel_count_mode(ops) as mode:
        model(torch.randn(B, N_IN)).pow(2).sum().backward()
    assert count.amp_casts == CASTS_PER_MICRO_STEP
    assert mode.count > count.amp_casts  # the eager operators themselves are not casts


def test_weights_are_cast_again_in_every_forward():
    from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode
    from mlflow_gpuopt.tracking.ops_seen import OpsSeen
    from mlflow_gpuopt.tracking.traffic import TrafficCount

    model, _ = model_and_opt()
    ops = OpsSeen()
    ops.traffic = count = TrafficCount(
        {p.untyped_storage().data_ptr() for p in model.parameters()})
    with kernel_count_mode(ops):
        model(torch.randn(B, N_IN)).pow(2).sum().backward()
        model(torch.randn(B, N_IN)).pow(2).sum().backward()  # one autocast region
    # without a new region the second forward reuses the 4 weight and bias copies
    assert count.amp_casts == 2 * CASTS_PER_MICRO_STEP - 4
    count.new_forward()
    with kernel_count_mode(ops):
        model(torch.randn(B, N_IN)).pow(2).sum().backward()
    assert count.amp_casts == 3 * CASTS_PER_MICRO_STEP - 4


@pytest.mark.parametrize("accum", [1, 2])
def test_track_logs_the_kernels_under_autocast(tracking_uri, accum):
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6, accum=accum)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["precision"] in ("fp32", "tf32")
    assert prof["amp_kernels_per_micro_step"] == pytest.approx(
        prof["kernels_per_micro_step"] + CASTS_PER_MICRO_STEP)
    workload = load_run_inputs([t.run_id], client=MlflowClient()).workload
    assert compute.kernel_count(workload, "fp16") == (
        pytest.approx(prof["amp_kernels_per_micro_step"]), "measured")
    assert compute.kernel_count(workload, "tf32")[0] == pytest.approx(
        prof["kernels_per_micro_step"])


def test_a_step_that_ran_under_autocast_keeps_its_count(tracking_uri):
    model, opt = model_and_opt()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6, autocast=True)
    prof = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert prof["precision"] == "bf16"
    # its casts ran as operators and are in the count already
    assert prof["amp_kernels_per_micro_step"] == prof["kernels_per_micro_step"]


FP32 = Workload(params=10**6, flops_per_sample=1e10, precision="fp32",
                kernels_per_micro_step=1000.0, amp_kernels_per_micro_step=1300.0)


@pytest.mark.parametrize("precision, kernels", [
    ("fp32", 1000.0), ("tf32", 1000.0), ("fp16", 1300.0), ("bf16", 1300.0), ("fp8", 1300.0),
    (None, 1000.0)])
def test_the_prior_reads_the_autocast_count_for_mixed_targets(precision, kernels):
    assert compute.kernel_count(FP32, precision) == (kernels, "measured")


def test_the_dispatch_terms_take_the_casts():
    hw = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2.0e12,
                  peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                    "bf16": 312e12},
                  intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=200e9)
    extra = 300 * compute.KERNEL_DISPATCH_S
    plain = dataclasses.replace(FP32, amp_kernels_per_micro_step=None)
    for p in ("fp16", "bf16"):
        got = compute.operator_class_times_s(FP32, hw, p, 8)["dispatch"]
        assert got - compute.operator_class_times_s(plain, hw, p, 8)["dispatch"] == (
            pytest.approx(extra))
        assert (fitting.dispatch_bound_s(FP32, p) - fitting.dispatch_bound_s(plain, p)
                == pytest.approx(extra))
    # a 16-bit workload's count has its casts: the autocast one is not read
    half = dataclasses.replace(FP32, precision="bf16")
    assert compute.kernel_count(half, "fp16") == (1000.0, "measured")
    # the model itself in 16 bits (apex O2): no per-operator casts
    o2 = dataclasses.replace(FP32, mixed_precision="master_weights")
    assert compute.kernel_count(o2, "fp16") == (1000.0, "measured")
    assert fitting.dispatch_bound_s(FP32, "fp32") == pytest.approx(
        1000 * compute.KERNEL_DISPATCH_S)
