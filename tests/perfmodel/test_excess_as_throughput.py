"""A mixture of experts' measured time beyond the roofline, carried to another GPU type as GPU
throughput work (``fitting.excess_as_throughput``): the host's launch seconds stay as
measured, the excess joins the GPU's roofline terms and moves with them; the width
``unexplained time, nature unknown`` is 0.34 of the log distance to the latency-bound reading
(docs/models.md#latency-bound-work). Dense workloads keep the latency-bound reading."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import compute, fitting, moe
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.predictor import Predictor, fit
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig, Workload

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)
B200 = Hardware(gpu="B200-SXM-180GB", memory_bytes=180e9, memory_bandwidth_bytes_per_s=8e12,
                peak_flops_per_s={"fp32": 80e12, "bf16": 2250e12, "fp8": 4500e12},
                intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=400e9)
H, F, SEQ = 2048, 768, 4096
QWEN_MOE = Workload(params=30_500_000_000, flops_per_sample=8.5e13, precision="bf16",
                    micro_batch=1, tokens_per_sample=SEQ, num_layers=48, hidden_size=H,
                    num_heads=32, num_kv_heads=4, vocab_size=151936, ffn_hidden_size=8 * F,
                    mlp="swiglu", num_experts=128, experts_per_token=8,
                    expert_ffn_hidden_size=F, optimizer="adamw")
CONFIG = ParallelConfig(gpus_per_node=8, strategy="ep8xzero1", micro_batch=1, grad_accum=8,
                        precision="bf16")


def test_excess_as_throughput_by_hand():
    # one micro-batch (m = 2): the split's 0.01 s per micro-step and 2e11 / 3e13 s per sample
    # all join B = 0.5 s per sample: k = 1 + (0.01 / 2 + 0.0066667) / 0.5; A keeps k'·r'
    k, r = fitting.excess_as_throughput((1.0, 1.0, (3e11, 2e11)), (0.01, 0.5), 3e13, 2.0,
                                        False)
    assert k == pytest.approx(1.0 + (0.005 + 2.0 / 300.0) / 0.5)
    assert k * r == pytest.approx(1.0)
    # two: per sample 6e11 / 3e13 = 0.02 s joins B: k = 0.9 + 0.02 / 0.5 = 0.94; per
    # micro-step 0.01 s joins A = 0.02 s: k·r = (0.9 · 1.2 · 0.02 + 0.01) / 0.02 = 1.58
    k, r = fitting.excess_as_throughput((0.9, 1.2, (3e11, 6e11)), (0.02, 0.5), 3e13, 2.0,
                                        True)
    assert (k, k * r) == pytest.approx((0.94, 1.58))
    # nothing beyond the roofline: the split's scales
    assert fitting.excess_as_throughput((0.8, 1.1, (0.0, 0.0)), (0.02, 0.5), 3e13, 1.0,
                                        False) == pytest.approx((0.8, 1.1))


def test_roofline_gpu_terms_by_hand():
    """A: the weights this GPU's shard reads (the dense part whole, the routed experts over
    ep 8, counted here); B: the dense roofline per sample and the MoE layers' permutation
    and expert GEMMs per sample."""
    layout = resolve_layout(CONFIG)
    routed = 48 * 128 * 3 * H * F
    shard = QWEN_MOE.params - routed + routed / 8
    gpu_fixed, per_sample = fitting.roofline_gpu_terms_s(QWEN_MOE, layout, H100, "bf16", 1.0,
                                                         SEQ)
    passes = compute.weight_passes(QWEN_MOE, "bf16")
    assert gpu_fixed == pytest.approx(shard * passes / (3.35e12 * 0.75))
    parts = moe.layer_parts_s(QWEN_MOE, layout, H100, "bf16", 1.0, SEQ)
    assert per_sample == pytest.approx(compute.per_sample_time_prior_s(QWEN_MOE, H100, "bf16")
                                       + parts["permute"] + parts["expert_gemm"])
    assert parts["permute"] > 0 and parts["expert_gemm"] > 0


@pytest.mark.parametrize("identified", [False, True])
def test_the_throughput_reading_reproduces_the_split_where_measured(identified):
    """host·k'r' + k·r·A + k·B·m equals the split's host·k'r' + k'r'·A + k'·B·m + X / rate
    at the measured micro-batch (with two measured, at every one)."""
    split = (0.95, 1.3 if identified else 1.0, (4e11, 9e11))
    host, gpu_fixed, per_sample, rate = 0.3, 0.02, 0.4, 3.3e13
    k, r = fitting.excess_as_throughput(split, (gpu_fixed, per_sample), rate, 2.0, identified)
    k0, r0, (xf, xs) = split
    for m in ((1.0, 2.0, 4.0) if identified else (2.0,)):
        want = host * k0 * r0 + k0 * r0 * gpu_fixed + k0 * per_sample * m + (xf + xs * m) / rate
        assert host * k0 * r0 + k * r * gpu_fixed + k * per_sample * m == pytest.approx(want)


def _slow_run(workload: Workload, slower: float) -> list[Observation]:
    prior = fit(workload, [], {}).predict(CONFIG, H100).throughput_samples_per_s
    return [Observation(gpu=H100.gpu, gpu_count=8, throughput_samples_per_s=prior / slower,
                        micro_batch=1, strategy="ep8xzero1", precision="bf16", grad_accum=8)]


def _throughput_reading(p: Predictor) -> Predictor:
    """The same fit with the excess left in the compute scale (no split): the throughput
    hypothesis, built from the fit's own scales before the split."""
    res = p.result
    return Predictor(p.workload, replace(res, latency_flops={}, throughput_scales={},
                                         log_compute_scale=dict(res.log_optimizer_scale)),
                     hardware={H100.gpu: H100})


def test_a_moe_excess_is_carried_as_throughput_work(monkeypatch):
    obs = _slow_run(QWEN_MOE, 1.8)
    carried = fit(QWEN_MOE, obs, {H100.gpu: H100})
    assert carried.result.throughput_scales  # slower than the roofline: a split
    got = carried.predict(CONFIG, B200)
    # the fit's own scales spread the excess over the host's launches too, whose seconds a
    # carried calibration keeps: B200's faster GPU shortens less of the step
    spread = _throughput_reading(carried).predict(CONFIG, B200).throughput_samples_per_s
    monkeypatch.setattr("mlflow_gpuopt.perfmodel.predictor.excess_is_throughput",
                        lambda w: False)
    lat = fit(QWEN_MOE, obs, {H100.gpu: H100}).predict(CONFIG, B200).throughput_samples_per_s
    # B200's peaks are 2.3x H100's, its SMs x clock 1.2x: the latency-bound reading is slower
    assert lat < spread < got.throughput_samples_per_s
    widths = dict(got.width_terms)
    assert widths[unc.TERM_UNEXPLAINED] == pytest.approx(
        0.34 * math.log(got.throughput_samples_per_s / lat), rel=1e-6)
    # on the measured GPU every reading is the measurement
    here = carried.predict(CONFIG, H100)
    assert here.throughput_samples_per_s == pytest.approx(obs[0].throughput_samples_per_s,
                                                          rel=1e-3)
    assert unc.TERM_UNEXPLAINED not in dict(here.width_terms)


def test_a_dense_excess_stays_latency_bound():
    dense = replace(QWEN_MOE, num_experts=None, experts_per_token=None,
                    expert_ffn_hidden_size=None, params=3_300_000_000)
    config = replace(CONFIG, strategy="zero1")
    prior = fit(dense, [], {}).predict(config, H100).throughput_samples_per_s
    obs = [Observation(gpu=H100.gpu, gpu_count=8, throughput_samples_per_s=prior / 1.8,
                       micro_batch=1, strategy="zero1", precision="bf16", grad_accum=8)]
    p = fit(dense, obs, {H100.gpu: H100})
    assert p.result.latency_flops
    got = p.predict(config, B200)
    assert unc.TERM_UNEXPLAINED not in dict(got.width_terms)
    assert got.throughput_samples_per_s < _throughput_reading(p).predict(
        config, B200).throughput_samples_per_s
