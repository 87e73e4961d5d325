"""Proxy transfer: a small model's fit carried to a bigger model of the same family."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import Hardware, Observation, ParallelConfig, Workload, fit
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.transfer import fit_proxy, size_sigma, transfer

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3350e9,
                peak_flops_per_s={"fp32": 67e12, "tf32": 494e12, "fp16": 989e12,
                                  "bf16": 989e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9, gpus_per_node=8)
HW = {"H100-SXM5-80GB": H100}


def gpt(layers: int, hidden: int, seq: int = 2048, **kw) -> Workload:
    """A GPT-shaped workload as a model card gives it: 12·L·h² + embeddings, 6·N·T + attention."""
    vocab = 50304
    params = 12 * layers * hidden**2 + vocab * hidden
    flops = (6.0 * params + 12.0 * layers * hidden * seq) * seq
    return Workload(params=params, flops_per_sample=flops, precision="bf16",
                    name=f"gpt-{layers}x{hidden}", micro_batch=4, optimizer="adamw",
                    tokens_per_sample=seq, num_layers=layers, hidden_size=hidden,
                    num_heads=hidden // 128, vocab_size=vocab, mlp="gelu", attention="sdpa",
                    dropout=0.0, **kw)


SMALL, BIG, HUGE = gpt(16, 2048), gpt(24, 4096), gpt(48, 8192)
ONE = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=4)


def _prior(workload, config=ONE):
    return fit(workload, [], {}).predict(config, H100)


def _measured(workload, factor: float, config=ONE) -> list[Observation]:
    """One single-GPU run ``factor`` × faster than the prior predicts."""
    thr = _prior(workload, config).throughput_samples_per_s * factor
    return [Observation(gpu=H100.gpu, gpu_count=1, throughput_samples_per_s=thr, micro_batch=4,
                        strategy="single")]


def test_same_workload_transfers_to_the_fit_itself():
    obs = _measured(SMALL, 1.5)
    own = fit(SMALL, obs, HW).predict(ONE, H100)
    moved = transfer(fit(SMALL, obs, HW), SMALL).predict(ONE, H100)
    assert moved.throughput_samples_per_s == pytest.approx(own.throughput_samples_per_s,
                                                           rel=1e-9)
    assert moved.log_sigma == pytest.approx(own.log_sigma, rel=1e-9)  # no size ratio, no width


@pytest.mark.parametrize("factor", [0.9, 1.5])
def test_measured_efficiency_carries_to_the_bigger_model(factor):
    # On one GPU every term of the step is compute scaled by the fitted factor: a proxy
    # measured 1.5x faster than its prior makes the target 1.5x faster than its own prior.
    # (0.9: slower than the roofline, so part of it is carried as latency-bound work, whose
    # per-sample share scales with the FLOPs; the split keeps the ratio within 3 %.)
    got = fit_proxy(SMALL, _measured(SMALL, factor), HW, BIG).predict(ONE, H100)
    expected = _prior(BIG).throughput_samples_per_s * factor
    assert got.throughput_samples_per_s == pytest.approx(expected,
                                                         rel=1e-3 if factor > 1 else 0.03)
    assert got.basis == "measured"
    assert any(a.startswith("transferred from proxy gpt-16x2048") for a in got.assumptions)


def test_size_sigma_is_the_mfu_spread_over_the_share_of_its_span():
    # Hopper bf16: spread 0.063 measured over 1.7B-462B (log10 271.8 = 2.434 decades)
    assert size_sigma(1e9, 1e10, "H100-SXM5-80GB", "bf16") == pytest.approx(
        math.sqrt(2) * 0.063 * math.sqrt(1 / math.log10(462 / 1.7)))
    assert size_sigma(1e9, 1e9, "H100-SXM5-80GB", "bf16") == 0.0
    # beyond the span it stops growing
    assert size_sigma(1e8, 1e12, "H100-SXM5-80GB", "bf16") == pytest.approx(
        math.sqrt(2) * 0.063)
    # a generation without a measured spread: the generic cross-GPU width over two decades
    assert size_sigma(1e9, 1e10, "L4", "bf16") == pytest.approx(
        math.sqrt(2) * unc.SIGMA_OTHER_GPU * math.sqrt(0.5))


def test_interval_widens_with_the_size_ratio():
    obs = _measured(SMALL, 1.5)
    own = fit(SMALL, obs, HW).predict(ONE, H100)
    big = fit_proxy(SMALL, obs, HW, BIG).predict(ONE, H100)
    huge = fit_proxy(SMALL, obs, HW, HUGE).predict(ONE, H100)
    assert own.log_sigma < big.log_sigma < huge.log_sigma
    for target, pred in ((BIG, big), (HUGE, huge)):
        extra = size_sigma(SMALL.params, target.params, H100.gpu, "bf16")
        assert pred.log_sigma == pytest.approx(math.hypot(own.log_sigma, extra), rel=1e-6)


def test_kernels_per_layer_carry_to_the_target_shape():
    proxy = replace(SMALL, kernels_per_micro_step=2000.0)  # 16 layers: 125 per layer
    pred = fit_proxy(proxy, _measured(proxy, 1.2), HW, BIG)
    assert pred.workload.kernels_per_micro_step == pytest.approx(125.0 * 24)
    assert any("kernels per micro-step 3,000" in a for a in pred.assumptions)
    # a target that states its own count keeps it
    own = fit_proxy(proxy, _measured(proxy, 1.2), HW, replace(BIG, kernels_per_micro_step=7.0))
    assert own.workload.kernels_per_micro_step == 7.0


def test_the_autocast_count_carries_per_layer_with_the_kernels():
    # 16 layers: 125 kernels and 150 under autocast (the casts) per layer, to 24 layers
    proxy = replace(SMALL, kernels_per_micro_step=2000.0, amp_kernels_per_micro_step=2400.0)
    pred = fit_proxy(proxy, _measured(proxy, 1.2), HW, BIG)
    assert pred.workload.kernels_per_micro_step == pytest.approx(125.0 * 24)
    assert pred.workload.amp_kernels_per_micro_step == pytest.approx(150.0 * 24)
    plain = fit_proxy(replace(proxy, amp_kernels_per_micro_step=None),
                      _measured(proxy, 1.2), HW, BIG)
    assert plain.workload.amp_kernels_per_micro_step is None


def test_cpu_proxy_carries_only_its_kernels_per_layer():
    proxy = replace(SMALL, kernels_per_micro_step=800.0)  # 50 per layer
    cpu = [Observation(gpu="cpu", gpu_count=1, throughput_samples_per_s=3.0, micro_batch=4)]
    pred = fit_proxy(proxy, cpu, {}, BIG).predict(ONE, H100)
    # GPU speed is the prior's, for the target with the proxy's kernels per layer
    expected = _prior(replace(BIG, kernels_per_micro_step=50.0 * 24))
    assert pred.throughput_samples_per_s == pytest.approx(expected.throughput_samples_per_s,
                                                          rel=1e-9)
    assert pred.basis == "prior" and pred.log_sigma >= expected.log_sigma
    assert any("CPU only" in a for a in pred.assumptions)


def test_memory_is_the_targets_own_not_the_proxys_observed_fit():
    # The proxy "ran" at a micro-batch its estimate says does not fit: the fit scales its
    # activations down and calls it fitting. None of that may reach the target.
    proxy = replace(SMALL, micro_batch=64)
    config = replace(ONE, micro_batch=64)
    obs = [Observation(gpu=H100.gpu, gpu_count=1, throughput_samples_per_s=10.0,
                       micro_batch=64, strategy="single")]
    own = fit(proxy, obs, HW)
    assert any("activation estimate scaled" in a for a in own.assumptions)
    moved = transfer(own, replace(BIG, micro_batch=64)).predict(config, H100)
    alone = _prior(replace(BIG, micro_batch=64), config)
    assert moved.memory == alone.memory and moved.fits == alone.fits
    assert not any("activation estimate scaled" in a for a in moved.assumptions)


def test_communication_scale_carries():
    eight = ParallelConfig(gpus_per_node=8, strategy="ddp", micro_batch=4)
    obs = [*_measured(SMALL, 1.2),
           Observation(gpu=H100.gpu, gpu_count=8, micro_batch=4, strategy="ddp",
                       throughput_samples_per_s=_prior(SMALL, eight).throughput_samples_per_s
                       * 0.8),
           Observation(gpu=H100.gpu, gpu_count=16, nodes=2, micro_batch=4, strategy="ddp",
                       throughput_samples_per_s=_prior(
                           SMALL, replace(eight, nodes=2)).throughput_samples_per_s * 0.7)]
    proxy = fit(SMALL, obs, HW)
    moved = transfer(proxy, BIG)
    assert moved.result.comm_scale == proxy.result.comm_scale != 1.0
    assert moved.result.gamma == proxy.result.gamma


def test_the_size_width_is_carried_whole_where_communication_was_fitted():
    # A proxy measured on 8 GPUs (one multi-GPU run: κ fitted, the joint spread applies):
    # the size ratio's width adds to the fit's in quadrature there too. The fit's priors
    # are narrowed to their own spreads (uncertainty.narrowed_prior_cov); the size piece
    # is not part of the fit and is not narrowed with them.
    eight = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=4)
    thr = _prior(SMALL, eight).throughput_samples_per_s * 1.3
    obs = [Observation(gpu=H100.gpu, gpu_count=8, throughput_samples_per_s=thr, micro_batch=4,
                       strategy="fsdp")]
    own = fit(SMALL, obs, HW)
    assert own.result.param_cov  # κ was fitted
    moved = fit_proxy(SMALL, obs, HW, HUGE)
    extra = size_sigma(SMALL.params, HUGE.params, H100.gpu, "bf16")
    fit_piece = dict(moved.predict(eight, H100).width_terms)["fit"]
    own_piece = dict(own.predict(eight, H100).width_terms)["fit"]
    assert fit_piece >= extra
    assert fit_piece == pytest.approx(math.hypot(own_piece, extra), rel=0.25)
