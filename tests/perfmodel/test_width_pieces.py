"""An interval is the quadrature sum of the pieces a prediction had to assume, each counted
once (docs/models.md#uncertainty-uncertaintypy)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from support.perfmodel import A100

from mlflow_gpuopt.perfmodel import Hardware, Observation, ParallelConfig, Workload, fit
from mlflow_gpuopt.perfmodel import uncertainty as unc

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 67e12, "tf32": 495e12, "fp16": 989e12,
                                  "bf16": 989e12, "fp8": 1979e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9, gpus_per_node=8)
HW = {"A100-80GB-SXM4": A100, "H100-SXM5-80GB": H100}
# A Llama-2-7B-shaped decoder described by its architecture.
LLAMA = Workload(params=6.7e9, flops_per_sample=6 * 6.7e9 * 4096 + 12 * 32 * 4096 * 4096**2,
                 precision="bf16", micro_batch=1, optimizer="adamw", tokens_per_sample=4096,
                 num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008,
                 mlp="swiglu", vocab_size=32000, dropout=0.0)


def test_a_transformer_carried_far_in_layout_takes_the_independent_bound_alone():
    # Measured on 8 A100s (one node, DDP, micro-batch 1); predicted on 32 H100s on 4 nodes
    # with FSDP at micro-batch 2. The pair spread with the layout, replica and node pieces
    # beside it would exceed the Ampere -> Hopper bound, the spread of whole runs of other
    # sizes, layouts and GPU counts (which holds those changes): the bound alone.
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=8 * 0.7,
                       micro_batch=1, strategy="fsdp", precision="bf16")]
    cfg = ParallelConfig(gpus_per_node=8, nodes=4, strategy="ddp", micro_batch=2,
                         precision="bf16")
    p = fit(LLAMA, obs, HW).predict(cfg, H100)
    names = {name for name, _ in p.width_terms}
    assert unc.TERM_TRANSFORMER_TRANSFER in names
    assert dict(p.width_terms)[unc.TERM_TRANSFORMER_TRANSFER] == pytest.approx(
        math.hypot(unc.TRANSFORMER_MFU_SPREAD[("ampere", "bf16")],
                   unc.TRANSFORMER_MFU_SPREAD[("hopper", "bf16")]))
    assert not names & {unc.TERM_BEYOND, unc.TERM_BATCH, unc.TERM_STRATEGY,
                        unc.TERM_MULTINODE}
    # on the measured GPU type itself they are the assumptions, so they are added
    same = fit(LLAMA, obs, HW).predict(cfg, A100)
    assert {unc.TERM_BEYOND, unc.TERM_BATCH, unc.TERM_STRATEGY,
            unc.TERM_MULTINODE} <= {name for name, _ in same.width_terms}
    # a workload not described as a transformer keeps them on another GPU type too
    bare = dataclasses.replace(LLAMA, num_heads=None, vocab_size=None)
    names = {n for n, _ in fit(bare, obs, HW).predict(cfg, H100).width_terms}
    assert unc.TERM_OTHER_GPU in names and unc.TERM_MULTINODE in names
    for pred in (p, same):
        assert pred.log_sigma == pytest.approx(
            math.sqrt(sum(v * v for _, v in pred.width_terms)))


def test_a_transformer_carried_to_another_gpu_keeps_its_pair_spread():
    # Measured on 4 A100s of one node (DDP, micro-batch 1); predicted on 8 H100s of one node,
    # DDP, micro-batch 2: the same model's pair spread, one doubling of replicas beside it
    # (0.061 ⊕ 0.035 < the 0.0995 bound), no micro-batch piece (the generation pairs
    # changed micro-batch themselves).
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=4, throughput_samples_per_s=4 * 0.7,
                       micro_batch=1, strategy="ddp", precision="bf16")]
    cfg = ParallelConfig(gpus_per_node=8, nodes=1, strategy="ddp", micro_batch=2,
                         precision="bf16")
    terms = dict(fit(LLAMA, obs, HW).predict(cfg, H100).width_terms)
    assert terms[unc.TERM_TRANSFORMER_TRANSFER] == pytest.approx(
        unc.SIGMA_TRANSFORMER_GENERATION_PAIR)
    assert terms[unc.TERM_BEYOND] == pytest.approx(unc.SIGMA_PER_DOUBLING_BEYOND * 1.0)
    assert not {unc.TERM_BATCH, unc.TERM_STRATEGY, unc.TERM_MULTINODE} & set(terms)
    # on the measured GPU type at FP8: the independent Hopper bf16 -> fp8 bound, the
    # micro-batch change inside it
    h100 = fit(LLAMA, [dataclasses.replace(obs[0], gpu="H100-SXM5-80GB")], HW)
    terms = dict(h100.predict(dataclasses.replace(cfg, precision="fp8"), H100).width_terms)
    assert terms[unc.TERM_TRANSFORMER_TRANSFER] == pytest.approx(math.hypot(0.063, 0.126))
    assert unc.TERM_BATCH not in terms and unc.TERM_BEYOND not in terms


def test_narrowed_prior_cov_is_the_posterior_under_the_narrower_prior():
    # Independently: a linear model with one observation of g·x (sd 0.01) and priors
    # N(0, w_i²): the posterior covariance is (Hᵀ H / 0.01² + diag(1 / w²))⁻¹. The fit's
    # covariance with weak priors (1.5), narrowed to 0.4 on the second parameter, must be
    # the covariance with that prior from the start.
    g = np.array([[0.7, 0.3]])
    weak = np.diag([1 / 1.5 ** 2, 1 / 1.5 ** 2])
    narrow = np.diag([1 / 1.5 ** 2, 1 / 0.4 ** 2])
    data = g.T @ g / 0.01 ** 2
    fit_cov = np.linalg.inv(data + weak)
    expected = np.linalg.inv(data + narrow)
    got = unc.narrowed_prior_cov(tuple(map(tuple, fit_cov)), [(1, 1.5, 0.4)])
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-12)
    # what the observation pinned stays pinned
    assert (g @ np.array(got) @ g.T).item() == pytest.approx((g @ fit_cov @ g.T).item(),
                                                            rel=0.05)
    # a spread no narrower than the fit's prior changes nothing
    assert np.allclose(unc.narrowed_prior_cov(tuple(map(tuple, fit_cov)), [(1, 1.5, 2.0)]),
                       fit_cov)


def test_moe_layers_widen_what_no_run_of_them_measured():
    """A mixture of experts with no run on the target's GPU type and precision adds the MoE
    layers' piece, once; measured on that GPU type it is not added."""
    moe_llama = dataclasses.replace(LLAMA, num_experts=8, experts_per_token=2,
                                    expert_ffn_hidden_size=11008)
    cfg = ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp", micro_batch=1, precision="bf16")
    alone = fit(moe_llama, [], HW).predict(cfg, H100)
    dense = fit(LLAMA, [], HW).predict(dataclasses.replace(cfg, strategy="fsdp"), H100)
    terms = dict(alone.width_terms)
    assert terms[unc.TERM_MOE] == unc.SIGMA_MOE_LAYERS
    assert unc.TERM_MOE not in dict(dense.width_terms)
    assert alone.log_sigma == pytest.approx(math.hypot(dense.log_sigma, unc.SIGMA_MOE_LAYERS))
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=8 * 0.5,
                       micro_batch=1, strategy="ep8xfsdp", precision="bf16")]
    carried = fit(moe_llama, obs, HW)
    # a run of the MoE model on another GPU type measured its layers: the transfer's piece
    assert dict(carried.predict(cfg, H100).width_terms)[unc.TERM_MOE] == unc.SIGMA_MOE_TRANSFER
    assert unc.SIGMA_MOE_TRANSFER <= unc.SIGMA_MOE_LAYERS
    assert unc.TERM_MOE not in dict(carried.predict(cfg, A100).width_terms)
