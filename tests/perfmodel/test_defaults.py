"""Defaults follow the information: what the architecture decides, the FLOPs-only fallbacks
only without it, and then a carried prediction's interval widens."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.perfmodel import A100, V100

from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, Workload, fit
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms
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
    extra = [v for _, v in pred._carried_fallback_spread(("A100-80GB-SXM4", "fp16"), A100, 8)]
    assert extra and all(x > 0 for x in extra)
    assert bare == pytest.approx(math.sqrt(described**2 + sum(x * x for x in extra)), rel=0.05)
    assert [d.kind for d in pred.defaults if d.fallback][:2] == ["traffic", "kernels"]
    # the interval names them: one piece per fallback default
    named = dict(pred.predict(cfg, A100).width_terms)
    assert named["carried default: DRAM traffic per sample"] == pytest.approx(extra[0])


def test_a_carried_fallback_is_moved_both_ways():
    # The traffic default's piece is the root-mean-square of how much more the traffic moved
    # up and down by its spread changes one micro-step on the target than on the measured
    # GPU (the fit absorbs what both share), at the prior calibration: computed here from
    # the step model with the traffic given at default × e^(±spread).
    obs = [Observation(gpu="V100-SXM2-16GB", gpu_count=1, throughput_samples_per_s=20.0,
                       micro_batch=8)]
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8, precision="fp16")
    traffic = compute.memory_traffic_bytes_per_sample(BARE, "fp16")
    layout = resolve_layout(cfg)
    shape = model_shape(BARE)

    def step(w, hw):
        return step_terms(w, hw, "fp16", layout, 8, 1, shape, 8.0, Calibration()).step_s

    def move(factor):
        w = dataclasses.replace(BARE, memory_traffic_bytes_per_sample=traffic * factor)
        return (math.log(step(BARE, A100) / step(w, A100))
                - math.log(step(BARE, V100) / step(w, V100)))

    up, down = (move(math.exp(s * unc.SIGMA_TRAFFIC_FROM_FLOPS)) for s in (1, -1))
    assert abs(up) != pytest.approx(abs(down), rel=0.2)  # the roofline is not symmetric
    named = dict(fit(BARE, obs, HW).predict(cfg, A100).width_terms)
    assert named["carried default: DRAM traffic per sample"] == pytest.approx(
        math.sqrt((up * up + down * down) / 2), rel=1e-6)


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
    # the pieces are named, each only where assumed
    terms = dict(fit(DESCRIBED, [], HW).predict(cfg, V100).width_terms)
    assert terms == {unc.TERM_PRIOR_TRANSFORMER: unc.SIGMA_PRIOR_TRANSFORMER,
                     unc.TERM_GENERATION: unc.SIGMA_GENERATION_UNMEASURED}


def test_a_prior_on_several_nodes_adds_no_scaling_piece():
    # the prior's width is the spread of whole published runs, multi-node ones included: a
    # prediction without a GPU run on 4 nodes has the same width as on one GPU
    one = fit(DESCRIBED, [], HW).predict(
        ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8), A100)
    many = fit(DESCRIBED, [], HW).predict(
        ParallelConfig(gpus_per_node=8, nodes=4, strategy="ddp", micro_batch=8), A100)
    assert many.width_terms == one.width_terms
    assert many.log_sigma == pytest.approx(unc.SIGMA_PRIOR_TRANSFORMER)


def test_prior_width_of_a_tracked_profile_needs_both_its_traffic_and_its_kernel_count():
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=8)
    tracked = dataclasses.replace(BARE, memory_traffic_bytes_per_sample=2e9,
                                  kernels_per_micro_step=900)
    assert fit(tracked, [], HW).predict(cfg, A100).log_sigma == pytest.approx(
        unc.SIGMA_PRIOR_TRACKED)
    assert dict(fit(tracked, [], HW).predict(cfg, A100).width_terms) == {
        unc.TERM_PRIOR_TRACKED: unc.SIGMA_PRIOR_TRACKED}
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
