"""A measured matmul share of the traffic (a tracked run's profile) is the share that hides
under the matmuls' arithmetic in the roofline, in place of the 0.5 default; a described
transformer keeps the default its efficiencies were derived with."""

from __future__ import annotations

import dataclasses

import pytest

from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Hardware, Workload
from mlflow_gpuopt.workload_files import workload_from_dict

HW = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2.0e12,
              peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                "bf16": 312e12},
              intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
# A convolutional network's tracked profile: 24 GFLOPs and 0.8 GB a sample, 0.2 GB of it
# the convolutions' own operands.
CNN = Workload(params=25_000_000, flops_per_sample=24e9, precision="fp32",
               memory_traffic_bytes_per_sample=8e8, matmul_traffic_bytes_per_sample=2e8)


def roofline_s(flops: float, traffic_bytes: float, share: float, peak: float) -> float:
    """max(T_matmul, h·T_traffic) + (1 − h)·T_traffic, written out."""
    t_mm = flops / (peak * compute.tensor_efficiency(HW.gpu, "fp16"))
    t_mem = traffic_bytes / (HW.memory_bandwidth_bytes_per_s * compute.MEMORY_EFFICIENCY)
    return max(t_mm, share * t_mem) + (1 - share) * t_mem


def test_the_measured_share_replaces_the_default():
    assert compute.hidden_traffic_share(CNN) == pytest.approx(0.25)
    # at fp16 the bytes halve; the share is a ratio and stays
    expected = roofline_s(24e9, 4e8, 0.25, 312e12)
    assert compute.per_sample_time_prior_s(CNN, HW, "fp16") == pytest.approx(expected)
    # more of the traffic adds than with the default: the prior is slower
    unmeasured = dataclasses.replace(CNN, matmul_traffic_bytes_per_sample=None)
    assert compute.hidden_traffic_share(unmeasured) == compute.MATMUL_HIDDEN_TRAFFIC_SHARE
    assert compute.per_sample_time_prior_s(unmeasured, HW, "fp16") == pytest.approx(
        roofline_s(24e9, 4e8, 0.5, 312e12))
    assert (compute.per_sample_time_prior_s(CNN, HW, "fp16")
            > compute.per_sample_time_prior_s(unmeasured, HW, "fp16"))


def test_operator_classes_split_the_same_roofline():
    classes = compute.operator_class_times_s(CNN, HW, "fp16", micro_batch=64)
    t_mem = 4e8 / (HW.memory_bandwidth_bytes_per_s * compute.MEMORY_EFFICIENCY)
    weights = compute.weight_traffic_time_s(CNN.params, HW, "fp16", CNN)
    assert classes["memory"] == pytest.approx(64 * 0.75 * t_mem + weights)
    assert classes["matmuls"] + classes["memory"] - weights == pytest.approx(
        64 * compute.per_sample_time_prior_s(CNN, HW, "fp16"))


def test_a_described_transformer_keeps_the_default():
    bert = dataclasses.replace(CNN, num_layers=24, hidden_size=1024, tokens_per_sample=128,
                               num_heads=16, vocab_size=30522)
    assert compute.hidden_traffic_share(bert) == compute.MATMUL_HIDDEN_TRAFFIC_SHARE


@pytest.mark.parametrize(("matmul", "share"), [(0.0, 0.0), (9e8, 1.0)])
def test_the_share_is_bounded(matmul, share):
    assert compute.hidden_traffic_share(
        dataclasses.replace(CNN, matmul_traffic_bytes_per_sample=matmul)) == share


def test_a_profile_document_carries_it_into_the_workload():
    doc = {"name": "cnn", "params": 25_000_000, "flops_per_sample": 24e9,
           "precision": "fp32", "memory_traffic_bytes_per_sample": 8e8,
           "matmul_traffic_bytes_per_sample": 2e8}
    assert workload_from_dict(doc, "profile.json").matmul_traffic_bytes_per_sample == 2e8
