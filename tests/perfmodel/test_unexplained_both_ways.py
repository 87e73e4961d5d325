"""A mixture of experts' measured time beyond the roofline, carried to another GPU type both
ways (``fitting.unexplained_halfway``): halfway between the latency-bound reading and the
throughput one, the width ``unexplained time, nature unknown`` half the log distance between
them (docs/models.md#latency-bound-work). Dense workloads keep the latency-bound reading."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import fitting
from mlflow_gpuopt.perfmodel import uncertainty as unc
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


def test_halfway_by_hand():
    # one micro-batch: the split keeps k' = 1, r' = r; halfway k = (1 + 1.6) / 2
    k, r, x = fitting.unexplained_halfway((1.0, 1.0, (3e11, 2e9)), (1.6, 1.0))
    assert (k, r, *x) == pytest.approx((1.3, 1.0, 1.5e11, 1e9))
    # two: k·r the mean of 0.9·1.2 and 1.5·2.0 over k = 1.2
    k, r, x = fitting.unexplained_halfway((0.9, 1.2, (4e11, 0.0)), (1.5, 2.0))
    assert (k, k * r, *x) == pytest.approx((1.2, (1.08 + 3.0) / 2, 2e11, 0.0))


@pytest.mark.parametrize("identified", [False, True])
def test_halfway_reproduces_the_fit_on_the_measured_gpu(identified):
    """k·(r·a + b·m) + X / rate is the fitted k_f·(r_f·a + b·m) for the split, and so for
    the point halfway (a, b from the priors, by hand). One measured micro-batch fits no
    ``r`` (1)."""
    from mlflow_gpuopt.perfmodel import compute

    w = replace(QWEN_MOE, num_experts=None)
    m, k_f, r_f = 2.0, 1.7, 1.4 if identified else 1.0
    a = compute.fixed_time_prior_s(w.params, H100, "bf16", compute.kernel_count(w)[0], w)
    b = compute.per_sample_time_prior_s(w, H100, "bf16")
    split = fitting.split_latency_bound(w, H100, "bf16", m, k_f, r_f, identified)
    k, r, (xf, xs) = fitting.unexplained_halfway(split, (k_f, r_f))
    rate = compute.latency_rate_flops_per_s(H100)
    assert k * (r * a + b * m) + (xf + xs * m) / rate == pytest.approx(k_f * (r_f * a + b * m))


def _slow_run(workload: Workload, slower: float) -> list[Observation]:
    prior = fit(workload, [], {}).predict(CONFIG, H100).throughput_samples_per_s
    return [Observation(gpu=H100.gpu, gpu_count=8, throughput_samples_per_s=prior / slower,
                        micro_batch=1, strategy="ep8xzero1", precision="bf16", grad_accum=8)]


def _throughput_reading(p: Predictor) -> Predictor:
    """The same fit with the excess left in the compute scale (no split): the throughput
    hypothesis, built from the fit's own scales before the split."""
    res = p.result
    return Predictor(p.workload, replace(res, latency_flops={}, fitted_scales={},
                                         log_compute_scale=dict(res.log_optimizer_scale)),
                     hardware={H100.gpu: H100})


def test_a_moe_excess_moves_halfway_with_the_width_between(monkeypatch):
    obs = _slow_run(QWEN_MOE, 1.8)
    both = fit(QWEN_MOE, obs, {H100.gpu: H100})
    assert both.result.fitted_scales  # the run was slower than the roofline: a split
    got = both.predict(CONFIG, B200)
    thru = _throughput_reading(both).predict(CONFIG, B200).throughput_samples_per_s
    monkeypatch.setattr("mlflow_gpuopt.perfmodel.predictor.unexplained_nature_unknown",
                        lambda w: False)
    lat = fit(QWEN_MOE, obs, {H100.gpu: H100}).predict(CONFIG, B200).throughput_samples_per_s
    # B200's peaks are 2.3x H100's, its SMs x clock 1.2x: the throughput reading is faster
    assert lat < got.throughput_samples_per_s < thru
    widths = dict(got.width_terms)
    assert widths[unc.TERM_UNEXPLAINED] == pytest.approx(0.5 * math.log(thru / lat), rel=1e-6)
    # on the measured GPU all three readings are the measurement
    here = both.predict(CONFIG, H100)
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
