"""Each term of the scaling model pinned against hand-computed values."""

from __future__ import annotations

import math

import pytest
from support.perfmodel import A100, V100

from mlflow_gpuopt.perfmodel import (
    ParallelConfig,
    PerfModelError,
    Workload,
    memory_per_gpu,
    validate_config,
)
from mlflow_gpuopt.perfmodel import comm, compute
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.memory import model_states_bytes


# -- compute ----------------------------------------------------------------------------------
def test_per_sample_prior_is_roofline_with_half_the_traffic_hidden_under_matmuls():
    w = Workload(params=1, flops_per_sample=1e12, precision="fp16",
                 memory_traffic_bytes_per_sample=2e9)
    # matmuls 1e12 / (320e12 * 0.6) = 5.2083 ms; traffic 2e9 / (2000e9 * 0.75) = 1.3333 ms,
    # half of it inside the (compute-bound) matmul kernels: 5.2083 + 0.6667 ms
    assert compute.per_sample_time_prior_s(w, A100, "fp16") == pytest.approx(
        1e12 / 192e12 + 0.5 * 2e9 / 1500e9)


def test_memory_bound_prior_is_the_traffic_time():
    w = Workload(params=1, flops_per_sample=1e9, precision="fp16",
                 memory_traffic_bytes_per_sample=3e9)
    # matmuls 5.2 us < half the traffic (1 ms): all 2 ms of traffic is on the critical path
    assert compute.per_sample_time_prior_s(w, A100, "fp16") == pytest.approx(3e9 / 1500e9)


def test_latency_bound_work_scales_with_the_fp32_rate():
    # 1.57e12 FP32-rate FLOPs per micro-step + 1e9 per sample, 10 samples: on V100 (15.7 TF)
    # 0.1 s + 10 * 1e9 / 15.7e12; on the A100 of this file (20 TF) 20/15.7 times faster
    v = compute.latency_time_s(1.57e12, 1e9, 10, V100)
    a = compute.latency_time_s(1.57e12, 1e9, 10, A100)
    assert v == pytest.approx(0.1 + 1e10 / 15.7e12)
    assert v / a == pytest.approx(20 / 15.7)


def test_latency_bound_work_scales_with_sms_times_clock_not_the_doubled_fp32_lanes():
    from dataclasses import replace

    # H100 SXM5: 132 SMs x 128 FP32 lanes x 2 x 1.98 GHz = 66.9 TF; an A100-class SM has 64
    # lanes, so SMs x clock is 67e12 / 2 = 33.5e12 at 64 lanes against the A100's 19.5e12
    # (108 x 64 x 2 x 1.41 GHz): 1.72x, not the FP32 peaks' 67 / 19.5 = 3.44x
    a100 = replace(A100, peak_flops_per_s={**A100.peak_flops_per_s, "fp32": 19.5e12})
    h100 = replace(A100, gpu="H100-SXM5-80GB",
                   peak_flops_per_s={**A100.peak_flops_per_s, "fp32": 67e12})
    assert compute.fp32_lanes_per_sm("H100-SXM5-80GB") == 128
    assert compute.fp32_lanes_per_sm("A100-80GB-SXM4") == 64
    assert compute.latency_rate_flops_per_s(h100) == pytest.approx(33.5e12)
    t_a = compute.latency_time_s(1e12, 0.0, 1, a100)
    t_h = compute.latency_time_s(1e12, 0.0, 1, h100)
    assert t_a / t_h == pytest.approx(33.5 / 19.5)
    # a GPU the table does not name counts 64 lanes: its FP32 peak as it is
    other = replace(A100, gpu="Mystery-GPU")
    assert compute.latency_rate_flops_per_s(other) == pytest.approx(
        A100.peak_flops_per_s["fp32"])


def test_fixed_prior_is_counted_dispatch_plus_weight_traffic():
    # 1e8 params in fp16 mixed precision: read twice + gradients written = 6 bytes/param,
    # 6e8 B / (2000e9 B/s x 0.75) = 0.4 ms; host side 5,000 kernels x 10 us = 50 ms
    assert compute.fixed_time_prior_s(1e8, A100, "fp16", 5000) == pytest.approx(0.050 + 0.0004)
    # without a count (None or 0): the flat 1 ms, unchanged
    for count in (None, 0):
        assert compute.fixed_time_prior_s(1e8, A100, "fp16", count) == pytest.approx(
            0.001 + 0.0004)
    assert compute.fixed_time_prior_s(1e8, A100, "fp16") == pytest.approx(0.0014)
    # the dispatch part is the same on a GPU with less than half the bandwidth: only the
    # weight traffic grows (6e8 / (900e9 x 0.75) = 0.8889 ms)
    assert compute.fixed_time_prior_s(1e8, V100, "fp16", 5000) == pytest.approx(
        0.050 + 6e8 / 675e9)


def test_step_keeps_the_dispatch_seconds_across_gpu_types():
    from mlflow_gpuopt.perfmodel.shape import model_shape
    from mlflow_gpuopt.perfmodel.step import Calibration, step_terms

    w = Workload(params=1000, flops_per_sample=1e3, precision="fp16", num_layers=2,
                 hidden_size=16, kernels_per_micro_step=20_000)
    layout = resolve_layout(ParallelConfig(gpus_per_node=1, strategy="single"))
    # a calibration carried from another GPU: compute x2 and fixed x3 for this GPU's roofline,
    # the host-side overhead at the measured 0.5: 0.5 x 20,000 x 10 us = 0.1 s on both GPUs
    calib = Calibration(compute_scale=2.0, fixed_scale=3.0, overhead_scale=0.5)
    for hw in (A100, V100):
        t = step_terms(w, hw, "fp16", layout, 1, 1, model_shape(w), 4.0, calib)
        assert t.compute_s == pytest.approx(0.1, rel=1e-3)
    # without overhead_scale the overhead takes compute x fixed scale (the measured GPU's own)
    t = step_terms(w, A100, "fp16", layout, 1, 1, model_shape(w), 4.0,
                   Calibration(compute_scale=2.0, fixed_scale=3.0))
    assert t.compute_s == pytest.approx(6 * 0.2, rel=1e-3)
    # a 2-stage pipeline: each stage dispatches half the kernels
    pp2 = resolve_layout(ParallelConfig(gpus_per_node=2, strategy="pp", pp=2))
    t = step_terms(w, A100, "fp16", pp2, 1, 1, model_shape(w), 4.0, Calibration())
    assert t.compute_s == pytest.approx(0.1, rel=1e-3)


def test_tf32_falls_back_to_fp32_on_v100_and_uses_simt_efficiency():
    w = Workload(params=1, flops_per_sample=1e12, precision="fp32",
                 memory_traffic_bytes_per_sample=0.0 + 1e-9)
    t = compute.per_sample_time_prior_s(w, V100, "tf32")
    assert t == pytest.approx(1e12 / (15.7e12 * compute.COMPUTE_EFFICIENCY_SIMT), rel=1e-6)


def test_activation_bytes_scale_with_precision():
    w = Workload(params=1, flops_per_sample=1.0, precision="fp16",
                 activation_bytes_per_sample=1e8)
    assert compute.activation_bytes_per_sample(w, "fp32") == (2e8, False)
    assert compute.memory_traffic_bytes_per_sample(w, "fp16") == pytest.approx(
        1e8 * compute.TRAFFIC_PER_ACTIVATION_BYTE)


# -- communication ----------------------------------------------------------------------------
def test_ring_allreduce_hand_computed():
    # 2(n-1)/n * S/B + 2(n-1)*alpha = 1.75 * 1e9/1e11 + 14 * 1e-5
    assert comm.ring_allreduce_s(1e9, 8, 1e11, 1e-5) == pytest.approx(0.0175 + 14e-5)
    assert comm.ring_allreduce_s(1e9, 1, 1e11) == 0.0


def _layout(strategy, gpn=8, nodes=1, tp=1, pp=1):
    return resolve_layout(ParallelConfig(gpus_per_node=gpn, nodes=nodes, strategy=strategy,
                                         tp=tp, pp=pp))


def test_dp_sync_volume_per_strategy():
    psi, nbytes = 1e9, 4
    bw = A100.intra_node_bytes_per_s * comm.BUS_EFFICIENCY
    ddp = 2 * 7 / 8 * psi * nbytes / bw + 2 * 7 * comm.INTRA_NODE_LATENCY_S
    assert comm.dp_sync_s(psi, nbytes, _layout("ddp"), A100) == pytest.approx(ddp)
    assert comm.dp_sync_s(psi, nbytes, _layout("zero1"), A100) == pytest.approx(ddp)
    assert comm.dp_sync_s(psi, nbytes, _layout("zero2"), A100) == pytest.approx(ddp)
    assert comm.dp_sync_s(psi, nbytes, _layout("zero3"), A100) == pytest.approx(1.5 * ddp)
    assert comm.dp_sync_s(psi, nbytes, _layout("fsdp"), A100) == pytest.approx(1.5 * ddp)


def test_multinode_ring_is_bounded_by_the_node_network():
    layout = _layout("ddp", gpn=8, nodes=2)
    assert layout.dp_spans_nodes
    bw, lat = comm.dp_link(A100, layout)
    assert bw == pytest.approx(50e9 * comm.BUS_EFFICIENCY)  # slower than 300 GB/s NVSwitch
    assert lat == comm.INTER_NODE_LATENCY_S
    # tp=8 inside each node: 8 rings share the NIC
    bw8, _ = comm.dp_link(A100, _layout("ddp", gpn=8, nodes=2, tp=8))
    assert bw8 == pytest.approx(50e9 * comm.BUS_EFFICIENCY / 8)


def test_tensor_parallel_allreduces_hand_computed():
    nbytes = 4 * 1024 * 4096 * 2
    bw = 300e9 * comm.BUS_EFFICIENCY
    one = 2 * 3 / 4 * nbytes / bw + 2 * 3 * comm.INTRA_NODE_LATENCY_S
    got = comm.tp_allreduce_s(24, 4, 1024, 4096, 2, 4, A100)
    assert got == pytest.approx(4 * 24 * one)
    assert comm.tp_allreduce_s(24, 4, 1024, 4096, 2, 1, A100) == 0.0


def test_pipeline_p2p():
    layout = _layout("pp", gpn=4, pp=4)
    assert comm.pp_p2p_s(1e6, layout, A100) == pytest.approx(
        2 * (1e6 / (300e9 * comm.BUS_EFFICIENCY) + comm.INTRA_NODE_LATENCY_S))


def test_overlap_limits():
    assert comm.overlap_s(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert comm.overlap_s(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert comm.overlap_s(3.0, 4.0, 10.0) == pytest.approx(4.0, rel=0.01)
    assert comm.overlap_s(3.0, 0.0, 2.0) == 3.0


def test_sync_overhead_per_doubling():
    assert comm.sync_overhead_s(1.0, 8) == pytest.approx(3 * comm.SYNC_OVERHEAD_PER_DOUBLING)
    assert comm.sync_overhead_s(1.0, 1) == 0.0


# -- memory: DeepSpeed's published estimators on a 1.5B-parameter model -------------------------
PSI = 1.5e9
LARGEST = 50257 * 1600  # GPT-2 XL's embedding, its largest layer


@pytest.mark.parametrize("n_gpus", [1, 4, 8, 16, 64])
def test_zero2_matches_deepspeed_estimate(n_gpus):
    # estimate_zero2_model_states_mem_needs, no offload: gpu = 4Ψ + 16Ψ/total_gpus
    deepspeed = 4 * PSI + 16 * PSI / n_gpus
    w = Workload(params=int(PSI), flops_per_sample=1e12, precision="fp16", optimizer="adam",
                 largest_layer_params=LARGEST, activation_bytes_per_sample=1.0)
    m = memory_per_gpu(w, ParallelConfig(gpus_per_node=n_gpus if n_gpus <= 8 else 8,
                                         nodes=max(1, n_gpus // 8), strategy="zero2",
                                         micro_batch=1))
    states = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes
    assert states == pytest.approx(deepspeed, rel=0.05)


@pytest.mark.parametrize("n_gpus", [1, 8, 16, 64])
def test_zero3_matches_deepspeed_estimate_and_fsdp_keeps_no_second_master(n_gpus):
    # estimate_zero3_model_states_mem_needs, no offload: gpu = 4L + 18Ψ/total_gpus
    deepspeed = 4 * LARGEST + 18 * PSI / n_gpus
    # PyTorch FSDP, bf16 compute: the fp32 shard is the master (4), fp32 gradient shard (4),
    # Adam m and v (8) per parameter / N; two 16-bit units gathered (2 x 2L) and one unit's
    # gradient reduce-scattered in fp32 (4L)
    fsdp = 16 * PSI / n_gpus + 2 * 2 * LARGEST + 4 * LARGEST
    w = Workload(params=int(PSI), flops_per_sample=1e12, precision="bf16", optimizer="AdamW",
                 largest_layer_params=LARGEST)
    for strategy, expected in (("zero3", deepspeed), ("fsdp", fsdp)):
        m = memory_per_gpu(w, ParallelConfig(gpus_per_node=min(n_gpus, 8),
                                             nodes=max(1, n_gpus // 8), strategy=strategy,
                                             micro_batch=1))
        states = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes
        assert states == pytest.approx(expected, rel=1e-9)


def test_model_states_per_strategy_hand_computed():
    # mixed-precision Adam: 16 bytes/param (ZeRO paper); ZeRO-1 4Ψ + 12Ψ/N
    assert sum(model_states_bytes(1e9, "fp16", "ddp", 8, 8)) == pytest.approx(16e9)
    assert sum(model_states_bytes(1e9, "fp16", "zero1", 8, 8)) == pytest.approx(4e9 + 12e9 / 8)
    # fp32 Adam: 4 + 4 + 8
    assert sum(model_states_bytes(1e9, "fp32", "ddp", 8, 8)) == pytest.approx(16e9)
    # fp32 SGD with momentum: 4 + 4 + 4
    assert sum(model_states_bytes(1e9, "tf32", "single", 1, 4)) == pytest.approx(12e9)
    assert sum(model_states_bytes(1e9, "fp32", "zero2", 4, 8)) == pytest.approx(4e9 + 12e9 / 4)


def test_activations_micro_batch_checkpointing_and_tp():
    w = Workload(params=1000, flops_per_sample=1e9, precision="bf16", num_layers=16,
                 activation_bytes_per_sample=1e8, optimizer="adam")
    base = memory_per_gpu(w, ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8))
    assert base.activations_bytes == pytest.approx(8e8)
    ckpt = memory_per_gpu(w, ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8,
                                            activation_checkpointing=True))
    assert ckpt.activations_bytes == pytest.approx(8e8 / 4)  # sqrt(16 layers)
    tp = memory_per_gpu(w, ParallelConfig(gpus_per_node=4, strategy="tp", micro_batch=8))
    assert tp.activations_bytes == pytest.approx(2e8)
    assert base.workspace_bytes > 0.5e9


# -- configuration checks ---------------------------------------------------------------------
@pytest.mark.parametrize("config, message", [
    (ParallelConfig(gpus_per_node=8, strategy="tp", tp=16), "larger than a node"),
    (ParallelConfig(gpus_per_node=8, nodes=2, strategy="tp", tp=16), "larger than a node"),
    (ParallelConfig(gpus_per_node=6, strategy="ddp", tp=4), "does not divide"),
    (ParallelConfig(gpus_per_node=8, strategy="zero4"), "unknown strategy"),
    (ParallelConfig(gpus_per_node=16, strategy="ddp"), "node has 8"),
    (ParallelConfig(gpus_per_node=4, strategy="single"), "runs on 1 GPU"),
    (ParallelConfig(gpus_per_node=8, strategy="ddp", grad_accum=0), "accumulation"),
])
def test_validate_config_rejects(config, message):
    with pytest.raises(PerfModelError, match=message):
        validate_config(config, A100)


def test_layout_degrees():
    lay = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=2, strategy="zero1", tp=2, pp=2))
    assert (lay.tp, lay.pp, lay.dp, lay.dp_strategy) == (2, 2, 4, "zero1")
    assert lay.dp_spans_nodes and not lay.pp_spans_nodes
    assert resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp")).tp == 8
    assert math.isclose(resolve_layout(ParallelConfig(gpus_per_node=4, strategy="pp")).pp, 4)
