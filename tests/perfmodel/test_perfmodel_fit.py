"""Fitting: observations reproduced, identifiable factors recovered, priors and intervals."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.perfmodel import A100, V100

from mlflow_gpuopt.perfmodel import (
    Observation,
    ParallelConfig,
    PerfModelError,
    Workload,
    fit,
)
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.compute import fixed_time_prior_s, per_sample_time_prior_s
from mlflow_gpuopt.perfmodel.fitting import fit_calibration
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms

RESNET = Workload(params=25_557_032, flops_per_sample=2.46e10, precision="fp16", micro_batch=256,
                  optimizer="SGD", optimizer_state_bytes_per_param=4,
                  activation_bytes_per_sample=1.1e8, name="resnet50")
HW = {"A100-80GB-SXM4": A100, "V100-SXM2-16GB": V100}


def _truth(workload, hw, n, m, calib, s=1, strategy=None):
    config = ParallelConfig(gpus_per_node=n, strategy=strategy or ("single" if n == 1 else "ddp"),
                            micro_batch=m, grad_accum=s)
    t = step_terms(workload, hw, workload.precision, resolve_layout(config), m, s,
                   model_shape(workload), 4.0, calib)
    return t.samples_per_step / t.step_s


def test_single_observation_is_reproduced_within_2_percent():
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470.0,
                       micro_batch=256, strategy="single")]
    p = fit(RESNET, obs, HW).predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100)
    assert p.throughput_samples_per_s == pytest.approx(2470.0, rel=0.02)
    assert p.low < 2470.0 < p.high
    assert not p.extrapolated


def test_multi_gpu_observation_is_reproduced_within_2_percent():
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470.0,
                       micro_batch=256),
           Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=16621.0,
                       micro_batch=256, strategy="ddp")]
    pred = fit(RESNET, obs, HW)
    one = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100)
    eight = pred.predict(ParallelConfig(gpus_per_node=8, strategy="ddp"), A100)
    assert one.throughput_samples_per_s == pytest.approx(2470.0, rel=0.02)
    assert eight.throughput_samples_per_s == pytest.approx(16621.0, rel=0.02)
    assert pred.result.comm_scale > 1.0  # the measured loss is more than the prior comm


def test_comm_scale_recovered_from_synthetic_runs():
    truth = Calibration(compute_scale=1.7, comm_scale=6.0)
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=n, micro_batch=64, strategy="ddp",
                       throughput_samples_per_s=_truth(RESNET, V100, n, 64, truth))
           for n in (1, 2)]
    pred = fit(RESNET, obs, HW)
    p8 = pred.predict(ParallelConfig(gpus_per_node=8, micro_batch=64), V100)
    assert p8.throughput_samples_per_s == pytest.approx(_truth(RESNET, V100, 8, 64, truth),
                                                        rel=0.03)


def test_fixed_cost_identified_from_two_micro_batches():
    truth = Calibration(compute_scale=1.3, fixed_scale=20.0)
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, micro_batch=m, strategy="single",
                       throughput_samples_per_s=_truth(RESNET, A100, 1, m, truth))
           for m in (16, 128)]
    pred = fit(RESNET, obs, HW)
    assert ("A100-80GB-SXM4", "fp16") in pred.result.log_fixed_scale
    p = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=4), A100)
    assert p.throughput_samples_per_s == pytest.approx(_truth(RESNET, A100, 1, 4, truth),
                                                       rel=0.03)


def test_other_gpu_is_extrapolated_with_a_wider_interval():
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=1200.0,
                       micro_batch=256)]
    pred = fit(RESNET, obs, HW)
    same = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), V100)
    other = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100)
    assert other.extrapolated and not same.extrapolated
    assert (same.basis, other.basis) == ("measured", "transferred")
    # at the same precision the transfer adds the cross-GPU piece (0.06) in quadrature, and
    # the interval is the quadrature sum of the pieces it names
    assert dict(same.width_terms) == {"fit": same.log_sigma}
    terms = dict(other.width_terms)
    assert terms["another GPU type"] == pytest.approx(0.06)
    assert "another precision" not in terms
    assert other.log_sigma == pytest.approx(math.sqrt(sum(v * v for v in terms.values())))
    assert other.log_sigma >= math.hypot(same.log_sigma, 0.06) - 1e-9
    # A100 is faster than V100 for the same workload, by less than the peak ratio
    assert 1.2 < other.throughput_samples_per_s / 1200.0 < 312 / 125 * 1.05


def test_transferred_prediction_at_another_micro_batch_widens_the_interval():
    # Fitted on V100 at micro-batch 64 only: the a/b split is not identified. On A100 (never
    # measured) the batch term must count the doublings from the batches seen on V100. The
    # kernels are counted, so no FLOPs-only fallback widens the interval by its own share.
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=1200.0,
                       micro_batch=64)]
    pred = fit(dataclasses.replace(RESNET, kernels_per_micro_step=500.0), obs, HW)

    def sigma(hw, m):
        return pred.predict(ParallelConfig(gpus_per_node=1, strategy="single",
                                           micro_batch=m), hw).log_sigma

    at_b, at_4b = sigma(A100, 64), sigma(A100, 256)
    assert pred.predict(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=256),
                        A100).basis == "transferred"
    two_doublings = 2 * unc.SIGMA_PER_BATCH_DOUBLING
    assert at_4b > at_b
    assert math.sqrt(at_4b**2 - at_b**2) == pytest.approx(two_doublings, rel=1e-6)
    # On the measured GPU the term is unchanged: nothing at the measured batch, the same
    # width per doubling away from it.
    v_b, v_4b = sigma(V100, 64), sigma(V100, 256)
    assert v_b == pytest.approx(pred.result.log_compute_sd[("V100-SXM2-16GB", "fp16")])
    assert math.sqrt(v_4b**2 - v_b**2) == pytest.approx(two_doublings, rel=1e-6)


def test_transferred_prediction_with_identified_split_has_no_batch_term_at_measured_batches():
    # Two batches measured on V100: on A100 a batch between them (64) is 2 doublings from the
    # nearest, a batch equal to one of them adds nothing. The kernels are counted (no
    # FLOPs-only fallback, whose widening would depend on the batch).
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=t,
                       micro_batch=m) for m, t in ((16, 900.0), (256, 1200.0))]
    pred = fit(dataclasses.replace(RESNET, kernels_per_micro_step=500.0), obs, HW)

    def sigma(m):
        return pred.predict(ParallelConfig(gpus_per_node=1, strategy="single",
                                           micro_batch=m), A100).log_sigma

    assert sigma(16) == pytest.approx(sigma(256))
    assert math.sqrt(sigma(64)**2 - sigma(16)**2) == pytest.approx(
        2 * unc.SIGMA_PER_BATCH_DOUBLING, rel=1e-6)


def test_more_gpus_than_observed_widens_the_interval():
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470.0,
                       micro_batch=256)]
    pred = fit(RESNET, obs, HW)
    s8 = pred.predict(ParallelConfig(gpus_per_node=8), A100).log_sigma
    s64 = pred.predict(ParallelConfig(gpus_per_node=8, nodes=8), A100).log_sigma
    s1 = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100).log_sigma
    assert s1 < s8 < s64


def test_cpu_only_observation_falls_back_to_prior_with_a_wide_interval():
    obs = [Observation(gpu="cpu", gpu_count=1, throughput_samples_per_s=3.5, micro_batch=8)]
    pred = fit(RESNET, obs, {})
    p = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100)
    assert pred.result.cpu_only
    assert p.basis == "prior"
    assert p.log_sigma >= unc.SIGMA_PRIOR_ONLY
    assert any("CPU" in a for a in p.assumptions)
    # prior = FLOPs/peak at prior efficiency + memory: between 10% and 100% of peak FLOPs rate
    mfu = p.throughput_samples_per_s * RESNET.flops_per_sample / 312e12
    assert 0.05 < mfu < 1.0


def test_prior_only_interval_is_the_prior_width_and_measured_stays_narrow():
    # No observation, one GPU: no other width applies, so the 90% interval is exactly
    # exp(±1.645 × SIGMA_PRIOR_ONLY) around the roofline: ×3.43 / ÷3.43 at σ = 0.75.
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=256)
    p = fit(RESNET, [], HW).predict(cfg, A100)
    assert p.basis == "prior"
    assert p.log_sigma == pytest.approx(0.75)
    assert p.high / p.throughput_samples_per_s == pytest.approx(3.4339, rel=1e-4)
    assert p.throughput_samples_per_s / p.low == pytest.approx(3.4339, rel=1e-4)
    # One run on that GPU: the measured interval is the fit's own spread, not the prior's.
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470.0,
                       micro_batch=256)]
    m = fit(RESNET, obs, HW).predict(cfg, A100)
    assert m.basis == "measured"
    assert m.log_sigma < 0.1


def test_grad_accumulation_amortises_communication():
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470.0,
                       micro_batch=256)]
    pred = fit(RESNET, obs, HW)
    s1 = pred.predict(ParallelConfig(gpus_per_node=8, nodes=4), A100)
    s8 = pred.predict(ParallelConfig(gpus_per_node=8, nodes=4, grad_accum=8), A100)
    assert s8.throughput_samples_per_s > s1.throughput_samples_per_s
    assert s8.exposed_comm_s / s8.step_time_s < s1.exposed_comm_s / s1.step_time_s
    assert s8.samples_per_step == 256 * 8 * 32


def test_pipeline_prediction_reports_the_bubble():
    w = Workload(params=1_300_000_000, flops_per_sample=6 * 1.3e9 * 1024, precision="bf16",
                 micro_batch=4, tokens_per_sample=1024, num_layers=24, hidden_size=2048,
                 optimizer="adamw")
    pred = fit(w, [], HW)
    p = pred.predict(ParallelConfig(gpus_per_node=4, strategy="pp", pp=4, grad_accum=8), A100)
    stage = p.bubble_s / 3
    assert p.bubble_s / ((8 + 3) * stage) == pytest.approx(3 / 11, rel=1e-6)
    assert p.tokens_per_s == pytest.approx(p.throughput_samples_per_s * 1024)


def test_max_micro_batch_is_the_largest_that_fits():
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=1200.0,
                       micro_batch=256)]
    pred = fit(RESNET, obs, HW)
    config = ParallelConfig(gpus_per_node=8)
    m = pred.max_micro_batch(config, V100)
    assert m > 0
    fits = pred.predict(ParallelConfig(gpus_per_node=8, micro_batch=m), V100)
    over = pred.predict(ParallelConfig(gpus_per_node=8, micro_batch=m + 1), V100)
    assert fits.fits and not over.fits
    assert fits.max_micro_batch == m


def test_errors_are_perfmodel_errors():
    with pytest.raises(PerfModelError, match="no hardware"):
        fit(RESNET, [Observation(gpu="H100", gpu_count=1, throughput_samples_per_s=1.0)], HW)
    with pytest.raises(PerfModelError, match="flops_per_sample"):
        fit(Workload(params=10, flops_per_sample=0, precision="fp32"), [], HW)
    with pytest.raises(PerfModelError, match="precision"):
        fit(Workload(params=10, flops_per_sample=1, precision="int3"), [], HW)
    with pytest.raises(ValueError):
        fit(RESNET, [], HW).predict(ParallelConfig(gpus_per_node=16), A100)


def test_fit_result_flags_what_was_observed():
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=16, nodes=2, strategy="zero2",
                       throughput_samples_per_s=30000.0, micro_batch=256)]
    res = fit_calibration(RESNET, obs, HW)
    assert res.observed_multinode and res.max_observed_dp == 16
    assert "zero2" in res.observed_strategies
    assert math.isfinite(res.comm_scale)


# -- latency-bound work (time beyond the roofline) ----------------------------------------------
SMALL = Workload(params=30_000_000, flops_per_sample=1.5e8, precision="fp16", micro_batch=128,
                 optimizer="Adam", optimizer_state_bytes_per_param=8,
                 activation_bytes_per_sample=4e4, num_layers=8, name="tiny-rnn")


def test_time_beyond_roofline_transfers_at_the_fp32_rate_not_the_tensor_peak():
    from mlflow_gpuopt.perfmodel import compute

    roof = _truth(SMALL, V100, 1, 128, Calibration())
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, micro_batch=128, strategy="single",
                       throughput_samples_per_s=roof / 20)]  # 20x slower than the roofline
    pred = fit(SMALL, obs, HW)
    same = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), V100)
    other = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), A100)
    assert same.throughput_samples_per_s == pytest.approx(roof / 20, rel=0.02)
    ratio = other.throughput_samples_per_s / same.throughput_samples_per_s
    # most of the V100 step is latency-bound and gets the FP32 ratio 20/15.7 = 1.27; the
    # roofline and the (memory-bound, equally slow) optimizer step get the bandwidth ratio
    # 2.2: well below the 2.56 tensor peak ratio the roofline alone would give
    assert 20 / 15.7 < ratio < 1.7
    fixed, per_sample = pred.result.latency_flops[("V100-SXM2-16GB", "fp16")]
    bound = 8 * compute.KERNELS_PER_LAYER_STEP * compute.KERNEL_DISPATCH_S
    assert fixed == pytest.approx(bound * 15.7e12)  # half the excess exceeds the dispatch cap
    assert per_sample > 0


def test_dispatch_bound_uses_the_profiled_kernel_count():
    from dataclasses import replace

    from mlflow_gpuopt.perfmodel.fitting import dispatch_bound_s, split_latency_bound

    # without a count: 8 layers x 100 kernels x 10 us = 8 ms
    assert dispatch_bound_s(SMALL) == pytest.approx(8 * 100 * 10e-6)
    # a 570-step decoder loop at ~120 kernels a step, counted: 68,400 x 10 us = 0.684 s
    counted = replace(SMALL, kernels_per_micro_step=68_400)
    assert dispatch_bound_s(counted) == pytest.approx(0.684)
    # the batch-independent share of a step 20x slower than the prior is half its excess, at
    # most the bound: the layer guess caps it at 8 ms, the count at 0.684 s. With a count the
    # prior itself already holds the 0.684 s of dispatch (in a), so the excess is 19x larger.
    b = per_sample_time_prior_s(SMALL, V100, "fp16")
    rate = 15.7e12  # V100 FP32, FLOP-equivalents per second of latency-bound work
    for w, bound in ((SMALL, 8e-3), (counted, 0.684)):
        a = fixed_time_prior_s(SMALL.params, V100, "fp16", w.kernels_per_micro_step)
        excess = 19 * (a + 128 * b)
        k, r, (x_fixed, x_sample) = split_latency_bound(w, V100, "fp16", 128, 20.0, 1.0, False)
        assert k == 1.0 and x_fixed == pytest.approx(min(0.5 * excess, bound) * rate)
        assert x_fixed + 128 * x_sample == pytest.approx(excess * rate)


#: A launch-bound workload: 20,000 kernels a micro-step (0.2 s of dispatch), almost no FLOPs.
LAUNCH_BOUND = Workload(params=1000, flops_per_sample=1e3, precision="fp16", micro_batch=8,
                        optimizer="SGD", optimizer_state_bytes_per_param=4, num_layers=2,
                        hidden_size=16, kernels_per_micro_step=20_000)


def test_prior_only_launch_bound_step_is_the_dispatch_time_on_every_gpu():
    pred = fit(LAUNCH_BOUND, [], HW)
    for hw in (A100, V100):
        p = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single"), hw)
        # 20,000 x 10 us = 0.2 s; weights, FLOPs and the optimizer step add well under 0.1%
        assert p.step_time_s == pytest.approx(0.2, rel=1e-3)
        assert p.basis == "prior"


def test_dispatch_time_fitted_on_one_gpu_carries_unchanged_to_another():
    # V100 measured at two micro-batches, its batch-independent part a quarter of the prior
    # (say a faster host than 10 us an operator): compute x fixed scale = 0.25 there. On the
    # A100 the fixed scale is not carried, but dispatch is CPU time: it stays 0.25 x 0.2 s.
    truth = Calibration(compute_scale=0.5, fixed_scale=0.5)
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, micro_batch=m, strategy="single",
                       throughput_samples_per_s=_truth(LAUNCH_BOUND, V100, 1, m, truth))
           for m in (8, 64)]
    pred = fit(LAUNCH_BOUND, obs, HW)
    assert ("V100-SXM2-16GB", "fp16") in pred.result.log_fixed_scale
    single = ParallelConfig(gpus_per_node=1, strategy="single")
    v100 = pred.predict(single, V100)
    a100 = pred.predict(single, A100)
    assert v100.step_time_s == pytest.approx(0.05, rel=0.02)
    assert a100.step_time_s == pytest.approx(v100.step_time_s, rel=1e-3)
    assert a100.basis == "transferred"


def test_split_reproduces_a_fit_with_two_micro_batches_at_every_batch():
    truth = Calibration(compute_scale=6.0, fixed_scale=3.0)
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, micro_batch=m, strategy="single",
                       throughput_samples_per_s=_truth(SMALL, V100, 1, m, truth))
           for m in (32, 256)]
    pred = fit(SMALL, obs, HW)
    assert ("V100-SXM2-16GB", "fp16") in pred.result.latency_flops
    for m in (16, 64, 512):
        p = pred.predict(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=m), V100)
        assert p.throughput_samples_per_s == pytest.approx(_truth(SMALL, V100, 1, m, truth),
                                                           rel=0.03)


def test_fitted_comm_scale_spread_widens_intervals_beyond_the_measured_replicas():
    truth = Calibration(compute_scale=1.7, comm_scale=6.0)
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=n, micro_batch=64, strategy="ddp",
                       throughput_samples_per_s=_truth(RESNET, V100, n, 64, truth))
           for n in (1, 2)]
    pred = fit(RESNET, obs, HW)
    assert pred.result.log_comm_sd > 0
    p8 = pred.predict(ParallelConfig(gpus_per_node=8, micro_batch=64), V100)
    share = p8.exposed_comm_s / p8.step_time_s
    # Beyond the measured replicas the floor on the communication scale's spread applies to
    # the exposed share, on top of the fit's own spread along this prediction.
    floor = unc.combine(unc.SIGMA_FLOOR, unc.SIGMA_COMM_FIT_FLOOR * share,
                        unc.scale_beyond(8, 2))
    assert p8.log_sigma >= floor - 1e-9
    p2 = pred.predict(ParallelConfig(gpus_per_node=2, micro_batch=64), V100)
    assert p8.log_sigma > p2.log_sigma + 0.01


def test_one_multi_gpu_run_pins_its_step_not_compute_and_comm_each():
    """One 8-GPU run fixes the step it measured; compute and communication scales alone
    are not identified, but a prediction of that configuration must not inherit their
    separate (prior-wide) spreads: the interval stays at the fit's noise floor."""
    truth = Calibration(compute_scale=1.3, comm_scale=2.0)
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=8, micro_batch=64, strategy="ddp",
                       throughput_samples_per_s=_truth(RESNET, V100, 8, 64, truth))]
    pred = fit(RESNET, obs, HW)
    assert pred.result.log_comm_sd > 0.5  # κ alone is barely identified
    same = pred.predict(ParallelConfig(gpus_per_node=8, micro_batch=64), V100)
    assert same.log_sigma < 0.1
    assert same.log_sigma >= unc.SIGMA_FLOOR
