"""The GEMMs' wave quantisation: half a wave of one tile per matrix product (128 x 128 on the
SIMT units, 128 x 256 on the tensor cores), at one SM's share of that path's attainable peak,
added to the batch-independent term ``a``."""

from __future__ import annotations

import dataclasses

import pytest

from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

A100 = Hardware(gpu="A100-40GB-SXM4", memory_bytes=40e9, memory_bandwidth_bytes_per_s=1.555e12,
                peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                  "bf16": 312e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
V100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9, memory_bandwidth_bytes_per_s=900e9,
                peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=12.5e9)
# a recurrent network of 9 LSTM layers run one after another, hidden 1,024, over 27 steps
REDUCTION = 9 * 27 * (1024 + 4096)
RNN = Workload(params=160_000_000, flops_per_sample=2e10, precision="fp32",
               kernels_per_micro_step=186, gemm_reduction_per_micro_step=REDUCTION)


def test_half_a_wave_of_one_tile_per_product_at_one_sms_share_of_the_peak():
    # A100 TF32 on the tensor cores: 156 TF at 60 % over 108 SMs; one 128 x 256 tile is
    # 2 x 32,768 FLOPs per K
    per_sm = 156e12 * 0.6 / 108
    assert compute.wave_tail_time_s(RNN, A100, "tf32") == pytest.approx(
        0.5 * 2 * 32768 * REDUCTION / per_sm)
    # V100 FP32 on the SIMT units (85 % of 15.7 TF) over 80 SMs, a 128 x 128 tile
    per_sm = 15.7e12 * 0.85 / 80
    assert compute.wave_tail_time_s(RNN, V100, "fp32") == pytest.approx(
        0.5 * 2 * 16384 * REDUCTION / per_sm)
    # 1.24 M of reduction: 47 ms a micro-step on the A100, 125 ms on the V100
    assert 0.04 < compute.wave_tail_time_s(RNN, A100, "tf32") < 0.055
    assert 0.12 < compute.wave_tail_time_s(RNN, V100, "fp32") < 0.13


def test_the_path_decides_the_tile_and_the_rate():
    # plain FP32 on an A100 stays on the SIMT units: 19.5 TF at 85 %, 128 x 128
    assert compute.wave_tail_time_s(RNN, A100, "fp32") == pytest.approx(
        0.5 * 2 * 16384 * REDUCTION / (19.5e12 * 0.85 / 108))
    # a V100 has no TF32: its tf32 runs FP32 on the SIMT units
    assert compute.wave_tail_time_s(RNN, V100, "tf32") == pytest.approx(
        compute.wave_tail_time_s(RNN, V100, "fp32"))
    # V100 FP16 on the HMMA units: 125 TF at 60 %, 128 x 256
    assert compute.wave_tail_time_s(RNN, V100, "fp16") == pytest.approx(
        0.5 * 2 * 32768 * REDUCTION / (125e12 * 0.6 / 80))
    assert compute.gemm_tile_elements(V100, "fp32") == 128 * 128
    assert compute.gemm_tile_elements(A100, "tf32") == 128 * 256
    assert compute.gemm_tile_elements(A100, "bf16") == 128 * 256


def test_nothing_without_a_recorded_reduction():
    plain = dataclasses.replace(RNN, gemm_reduction_per_micro_step=None)
    assert compute.wave_tail_time_s(plain, A100, "tf32") == 0.0
    assert compute.wave_tail_time_s(None, A100, "tf32") == 0.0
    assert compute.fixed_time_prior_s(plain.params, A100, "tf32", 186, plain) == pytest.approx(
        186 * compute.KERNEL_DISPATCH_S
        + compute.weight_traffic_time_s(plain.params, A100, "tf32", plain))


def test_it_is_part_of_a_and_of_the_matmul_class_not_of_the_per_sample_time():
    plain = dataclasses.replace(RNN, gemm_reduction_per_micro_step=None)
    tail = compute.wave_tail_time_s(RNN, A100, "tf32")
    assert compute.fixed_time_prior_s(RNN.params, A100, "tf32", 186, RNN) == pytest.approx(
        compute.fixed_time_prior_s(plain.params, A100, "tf32", 186, plain) + tail)
    assert compute.per_sample_time_prior_s(RNN, A100, "tf32") == (
        compute.per_sample_time_prior_s(plain, A100, "tf32"))
    for m in (1, 128):
        with_tail = compute.operator_class_times_s(RNN, A100, "tf32", m)
        without = compute.operator_class_times_s(plain, A100, "tf32", m)
        assert with_tail["matmuls"] - without["matmuls"] == pytest.approx(tail)
        assert {k: v for k, v in with_tail.items() if k != "matmuls"} == pytest.approx(
            {k: v for k, v in without.items() if k != "matmuls"})


def test_sixteen_bit_halves_it_on_tensor_cores():
    assert compute.wave_tail_time_s(RNN, A100, "fp16") == pytest.approx(
        compute.wave_tail_time_s(RNN, A100, "tf32") / 2)


def test_sm_counts_by_name_prefix():
    assert compute.sm_count("H100-PCIe-80GB") == 114
    assert compute.sm_count("H100-SXM5-80GB") == 132
    assert compute.sm_count("A10G-24GB") == 80
    assert compute.sm_count("A10") == 72
    assert compute.sm_count("some-new-gpu") == compute.SMS_DEFAULT


def test_a_workload_file_gives_the_figure_and_refuses_a_negative_one():
    from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

    doc = {"params": 1000, "flops_per_sample": 1e9, "precision": "fp32"}
    assert workload_from_dict({**doc, "gemm_reduction_per_micro_step": "2.5e6"}
                              ).gemm_reduction_per_micro_step == 2.5e6
    with pytest.raises(WorkloadFileError, match="gemm_reduction_per_micro_step"):
        workload_from_dict({**doc, "gemm_reduction_per_micro_step": -1})
