"""A measured weight traffic per micro-step (a tracked run's profile) replaces the three
passes over the parameters in the batch-independent term ``a``."""

from __future__ import annotations

import dataclasses

import pytest

from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

HW = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2.0e12,
              peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                "bf16": 312e12},
              intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
RNN = Workload(params=28_000_000, flops_per_sample=8e10, precision="fp32")


def test_without_a_measurement_three_passes_at_the_precisions_element():
    bw = 2.0e12 * compute.MEMORY_EFFICIENCY
    assert compute.weight_traffic_time_s(1e6, HW, "fp32", RNN) == pytest.approx(1e6 * 12 / bw)
    assert compute.weight_traffic_time_s(1e6, HW, "fp16", RNN) == pytest.approx(1e6 * 6 / bw)


def test_a_measured_figure_is_used_per_parameter_and_rescaled_to_the_precision():
    measured = dataclasses.replace(RNN, weight_traffic_bytes_per_micro_step=2.8e11)
    bw = 2.0e12 * compute.MEMORY_EFFICIENCY
    # 2.8e11 bytes over 2.8e7 fp32 params: 1e4 bytes per param (2,500 passes of 4 bytes)
    assert compute.weight_traffic_time_s(RNN.params, HW, "fp32", measured) == pytest.approx(
        2.8e11 / bw)
    # half the weight element in mixed precision, and a shard of the params its share
    assert compute.weight_traffic_time_s(RNN.params / 4, HW, "fp16", measured) == (
        pytest.approx(2.8e11 / 2 / 4 / bw))
    assert compute.fixed_time_prior_s(RNN.params, HW, "fp32", None, measured) == (
        pytest.approx(compute.MICRO_STEP_OVERHEAD_S + 2.8e11 / bw))
