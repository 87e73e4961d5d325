"""Defaults follow the information: what the architecture decides, the FLOPs-only fallbacks
only without it, and then a carried prediction's interval widens."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.perfmodel import A100, V100

from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, Workload, fit
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel import uncertainty as unc

HW = {"A100-80GB-SXM4": A100, "V100-SXM2-16GB": V100}
# A GPT-2-medium-shaped decoder: 24 layers, h 1024, 16 heads, GELU MLP 4h, vocabulary 50257.
ARCH = dict(num_layers=24, hidden_size=1024, tokens_per_sample=1024, num_heads=16,
            vocab_size=50257, mlp="gelu", dropout=0.0)
FLOPS = 6 * 355e6 * 1024 + 12 * 24 * 1024 * 1024**2
BARE = Workload(params=355_000_000, flops_per_sample=FLOPS, precision="fp16", micro_batch=8,
                optimizer="adamw")
DESCRIBED = dataclasses.replace(BARE, **ARCH)


def test_traffic_and_kernels_come_from_the_architecture_only_when_it_is_given():
    assert compute.traffic_source(BARE) == "flops"
    assert compute.memory_traffic_bytes_per_sample(BARE, "fp16") == pytest.approx(
        FLOPS / 30 / 2)
    assert compute.kernel_count(BARE) == (None, "flat")
    assert compute.traffic_source(DESCRIBED) == "architecture"
    act = compute.formula_activation_bytes_per_sample(DESCRIBED, "fp16")
    assert compute.memory_traffic_bytes_per_sample(DESCRIBED, "fp16") == pytest.approx(6 * act)
    # far less than FLOPs / 30: a 355M transformer is not memory-bound
    assert 6 * act < FLOPS / 30 / 2 / 3
    assert compute.kernel_count(DESCRIBED) == (100 * 24 + 40, "architecture")
    # a measured figure is used as it is
    measured = dataclasses.replace(DESCRIBED, memory_traffic_bytes_per_sample=1e9,
                                   kernels_per_micro_step=777.0)
    assert compute.memory_traffic_bytes_per_sample(measured, "fp16") == 1e9
    assert compute.kernel_count(measured) == (777.0, "measured")


def test_fallbacks_widen_a_carried_interval_and_the_architecture_does_not():
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=20.0,
                       micro_batch=8)]
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8)

    def sigma(w):
        return fit(w, obs, HW).predict(cfg, A100).log_sigma

    bare, described = sigma(BARE), sigma(DESCRIBED)
    # the architecture-described one carries no fallback term: the transfer width alone
    # (Volta has no MFU spread, so the generic other-GPU width) plus the fit's spread
    assert described < bare
    pred = fit(BARE, obs, HW)
    extra = pred._carried_fallback_spread(("A100-80GB-SXM4", "fp16"), A100, 8)
    assert extra and all(x > 0 for x in extra)
    assert bare == pytest.approx(math.sqrt(described**2 + sum(x * x for x in extra)), rel=0.05)
    assert [d.kind for d in pred.defaults if d.fallback][:2] == ["traffic", "kernels"]


def test_prior_width_is_narrower_for_a_transformer_on_a_generation_with_a_published_mfu():
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8)
    assert fit(DESCRIBED, [], HW).predict(cfg, A100).log_sigma == pytest.approx(
        unc.SIGMA_PRIOR_TRANSFORMER)
    assert fit(BARE, [], HW).predict(cfg, A100).log_sigma == pytest.approx(unc.SIGMA_PRIOR_ONLY)
    # Volta has no GENERATION_MFU figure: Ampere's is carried, with the generations' spread
    volta = fit(DESCRIBED, [], HW).predict(cfg, V100).log_sigma
    assert volta == pytest.approx(unc.combine(unc.SIGMA_PRIOR_TRANSFORMER,
                                              unc.SIGMA_GENERATION_UNMEASURED))
    assert volta < unc.SIGMA_PRIOR_ONLY


def test_prior_width_of_a_tracked_profile_needs_both_its_traffic_and_its_kernel_count():
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8)
    tracked = dataclasses.replace(BARE, memory_traffic_bytes_per_sample=2e9,
                                  kernels_per_micro_step=900)
    assert fit(tracked, [], HW).predict(cfg, A100).log_sigma == pytest.approx(
        unc.SIGMA_PRIOR_TRACKED)
    assert unc.SIGMA_PRIOR_TRACKED < unc.SIGMA_PRIOR_ONLY
    for one in (dataclasses.replace(BARE, memory_traffic_bytes_per_sample=2e9),
                dataclasses.replace(BARE, kernels_per_micro_step=900)):
        assert fit(one, [], HW).predict(cfg, A100).log_sigma == pytest.approx(
            unc.SIGMA_PRIOR_ONLY)
    # a described transformer keeps its own prior width, measured figures or not
    described = dataclasses.replace(DESCRIBED, memory_traffic_bytes_per_sample=2e9,
                                    kernels_per_micro_step=900)
    assert fit(described, [], HW).predict(cfg, A100).log_sigma == pytest.approx(
        unc.SIGMA_PRIOR_TRANSFORMER)
