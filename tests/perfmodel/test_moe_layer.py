"""A MoE layer's own work beyond its dense part (``moe.layer_time_s``): permutation traffic,
expert GEMMs at small M, the router's and experts' launches and the dropless host sync, each
worked out by hand from the constants docs/models.md#mixture-of-experts states."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import moe, step
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import Shape
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)
H, F, L, E, K, SEQ = 4096, 14336, 32, 8, 2, 4096
MIXTRAL = Workload(params=46_702_792_704, flops_per_sample=3.4e14, precision="bf16",
                   micro_batch=1, tokens_per_sample=SEQ, num_layers=L, hidden_size=H,
                   num_heads=32, num_kv_heads=8, vocab_size=32000, ffn_hidden_size=K * F,
                   mlp="swiglu", num_experts=E, experts_per_token=K, expert_ffn_hidden_size=F,
                   optimizer="adamw")
EP8 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ep8xfsdp"))
#: 75% of the datasheet bandwidth (compute.MEMORY_EFFICIENCY); Hopper bf16 GEMMs at 60% of
#: peak x Hopper's MFU over Ampere's (0.46 / 0.538, compute.tensor_efficiency)
STREAM_BPS = 3.35e12 * 0.75
BF16_RATE = 989.4e12 * 0.6 * 0.46 / 0.538


def test_permutation_traffic_is_sixteen_passes_over_the_routed_copies():
    parts = moe.layer_parts_s(MIXTRAL, EP8, H100, "bf16", 1, SEQ)
    # 32 layers x 16 passes x 4096 tokens x 2 experts x 4096 hidden x 2 bytes
    assert parts["permute"] == pytest.approx(32 * 16 * 4096 * 2 * 4096 * 2 / STREAM_BPS)
    dropping = moe.layer_parts_s(replace(MIXTRAL, capacity_factor=1.25), EP8, H100, "bf16",
                                 1, SEQ)
    assert dropping["permute"] == pytest.approx(1.25 * parts["permute"])
    pp2 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="pp2xep4xfsdp"))
    assert moe.layer_parts_s(MIXTRAL, pp2, H100, "bf16", 1, SEQ)["permute"] == pytest.approx(
        parts["permute"] / 2)  # a stage holds half the layers


def test_expert_gemms_lose_efficiency_at_small_m_and_shallow_k():
    # Mixtral's 8 experts on 8 ranks: each expert takes 4096 x 2 x 8 / 8 = 8192 rows, more
    # than the dense layers' 4096, and reduces over 4096-28672: no penalty
    assert moe.tokens_per_expert(MIXTRAL, EP8, 1, SEQ) == 8192
    assert moe.layer_parts_s(MIXTRAL, EP8, H100, "bf16", 1, SEQ)["expert_gemm"] == 0.0
    # 64 experts: 4096 x 2 x 8 / 64 = 1024 rows per expert
    fine = replace(MIXTRAL, num_experts=64)
    assert moe.tokens_per_expert(fine, EP8, 1, SEQ) == 1024
    # K0 at bf16 on this H100 (its SMs x clock are the reference's): 720 x 989.4 / 1978.9
    k0 = 720.0 * 989.4 / 1978.9

    def eff(m, k):  # rows term x depth term, written out
        return (1.0 if m is None else m / (m + 128.0)) * k / (k + k0)

    # gate+up (2/3 of the FLOPs): forward K 4096, input gradient K 28672, weight gradient K =
    # the 1024 rows; down (1/3): forward K 14336, input gradient K 4096, weight gradient 1024
    expert_time = (2 / 3 / 3 * (1 / eff(1024, 4096) + 1 / eff(1024, 28672) + 1 / eff(None, 1024))
                   + 1 / 3 / 3 * (1 / eff(1024, 14336) + 1 / eff(1024, 4096)
                                  + 1 / eff(None, 1024)))
    # dense layers: 4096 rows at K 6656 (forward, input gradient), weight gradient over 4096
    dense_time = (2 / eff(4096, 6656) + 1 / eff(None, 4096)) / 3
    ratio = dense_time / expert_time
    assert moe.expert_gemm_ratio(fine, EP8, H100, "bf16", 1, SEQ) == pytest.approx(ratio)
    flops = 6 * 4096 * 2 * 3 * 4096 * 14336 * 32
    got = moe.layer_parts_s(fine, EP8, H100, "bf16", 1, SEQ)["expert_gemm"]
    assert got == pytest.approx(flops / BF16_RATE * (1 / ratio - 1))
    assert moe.gemm_efficiency(128) == pytest.approx(0.5)
    assert moe.gemm_efficiency(128, 720.0, 720.0) == pytest.approx(0.25)
    # tp2 x ep4, the experts' tensor parallel 1: an expert takes 4096 / 2 x 2 x 4 / 64 = 256
    # rows; the dense layers keep the micro-batch's 4096 (sequence parallel gathers them
    # before the column-parallel GEMMs)
    tp2 = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp2xep4xfsdp"))
    etp1 = replace(fine, expert_tensor_parallel=1)
    assert moe.tokens_per_expert(etp1, tp2, 1, SEQ) == 256
    expert_time = (2 / 3 / 3 * (1 / eff(256, 4096) + 1 / eff(256, 28672) + 1 / eff(None, 256))
                   + 1 / 3 / 3 * (1 / eff(256, 14336) + 1 / eff(256, 4096)
                                  + 1 / eff(None, 256)))
    assert moe.expert_gemm_ratio(etp1, tp2, H100, "bf16", 1, SEQ) == pytest.approx(
        dense_time / expert_time)
    # Megatron's default, the experts split over tp too: each of the pair takes both ranks'
    # tokens (gathered after the all-to-all) for half the outputs: 512 rows
    assert moe.tokens_per_expert(fine, tp2, 1, SEQ) == 512


def test_half_depth_scales_with_the_tensor_rate_per_sm_and_clock():
    # the reference is H800 / H100 SXM FP8 (1978.9 TFLOP/s over 66.9 x 64 / 128 TFLOP/s)
    assert moe.half_efficiency_k(H100, "fp8") == pytest.approx(720.0)
    assert moe.half_efficiency_k(H100, "bf16") == pytest.approx(720.0 * 989.4 / 1978.9)
    b200 = replace(H100, gpu="B200", peak_flops_per_s={"fp32": 75e12, "bf16": 2250e12,
                                                       "fp8": 4500e12})
    # 148 SMs at 1.98 GHz: FP32 75 TFLOP/s at 128 lanes -> 37.5 at the latency rate
    assert moe.half_efficiency_k(b200, "bf16") == pytest.approx(
        720.0 * (2250 / 37.5) / (1978.9 / 33.45))


def test_half_depth_fits_deepgemm_table():
    # DeepGEMM README (first release, FP8 on H800), M = 4096, N filling whole waves:
    # 1/rate = 1/peak + K0 / (peak K): least squares by hand over (1/K, 1/rate)
    ks = [512.0, 1536.0, 2048.0, 7168.0, 16384.0]
    rates = [590.0, 990.0, 1025.0, 1304.0, 1358.0]
    xs, ys = [1 / k for k in ks], [1 / r for r in rates]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    peak = 1 / (my - slope * mx)
    assert slope * peak == pytest.approx(moe.GEMM_HALF_EFFICIENCY_K, rel=0.01)
    for k, r in zip(ks, rates, strict=True):
        assert peak * k / (k + moe.GEMM_HALF_EFFICIENCY_K) == pytest.approx(r, rel=0.03)


def test_launches_count_the_router_and_each_local_experts_gemms():
    # ep8 of 8 experts: 1 local expert, 70 + 6 launches per layer at 10 us
    assert moe.layer_parts_s(MIXTRAL, EP8, H100, "bf16", 1, SEQ)["dispatch"] == pytest.approx(
        32 * (70 + 6) * 10e-6)
    # FP8 adds 4 casts per local expert; 64 experts on 8 ranks: 8 local
    fine = replace(MIXTRAL, num_experts=64)
    assert moe.layer_parts_s(fine, EP8, H100, "fp8", 1, SEQ)["dispatch"] == pytest.approx(
        32 * (70 + 10 * 8) * 10e-6)


def test_a_profiled_kernel_count_already_has_the_launches():
    counted = replace(MIXTRAL, kernels_per_micro_step=9000.0)
    parts = moe.layer_parts_s(counted, EP8, H100, "bf16", 1, SEQ)
    assert parts["dispatch"] == 0.0 and parts["sync"] > 0.0


def test_only_a_dropless_layer_syncs_with_the_host():
    assert moe.layer_parts_s(MIXTRAL, EP8, H100, "bf16", 1, SEQ)["sync"] == pytest.approx(
        32 * 2 * 10e-6)
    assert moe.layer_parts_s(replace(MIXTRAL, capacity_factor=1.0), EP8, H100, "bf16", 1,
                             SEQ)["sync"] == 0.0


def test_a_dense_model_has_none_of_it():
    dense = replace(MIXTRAL, num_experts=None, experts_per_token=None,
                    expert_ffn_hidden_size=None)
    single = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="fsdp"))
    assert moe.layer_time_s(dense, single, H100, "bf16", 1, SEQ) == 0.0
    assert set(moe.layer_parts_s(dense, single, H100, "bf16", 1, SEQ).values()) == {0.0}


def test_the_step_adds_it_to_every_micro_steps_compute(monkeypatch):
    shape = Shape(num_layers=L, hidden_size=H, seq_len=SEQ, largest_layer_params=1e9,
                  assumptions=())
    calib = step.Calibration(compute_scale=1.3, fixed_scale=1.0, overhead_scale=0.7)
    with_moe = step.step_terms(MIXTRAL, H100, "bf16", EP8, 1, 4, shape, 12.0, calib)
    p = moe.layer_parts_s(MIXTRAL, EP8, H100, "bf16", 1, SEQ)
    own = 1.3 * (p["permute"] + p["expert_gemm"]) + 0.7 * (p["dispatch"] + p["sync"])
    monkeypatch.setattr(moe, "layer_time_s", lambda *a, **k: 0.0)
    without = step.step_terms(MIXTRAL, H100, "bf16", EP8, 1, 4, shape, 12.0, calib)
    assert with_moe.compute_s - without.compute_s == pytest.approx(4 * own)


def _measured(workload, strategy, gpus, micro_batch, slower):
    """A run of ``workload`` on 8 H100s ``slower`` × the prior's step time."""
    from mlflow_gpuopt.perfmodel.predictor import fit
    from mlflow_gpuopt.perfmodel.types import Observation

    config = ParallelConfig(gpus_per_node=gpus, strategy=strategy, micro_batch=micro_batch,
                            grad_accum=4)
    prior = fit(workload, [], {}).predict(config, H100).throughput_samples_per_s
    obs = Observation(gpu=H100.gpu, gpu_count=gpus, throughput_samples_per_s=prior / slower,
                      micro_batch=micro_batch, strategy=strategy, precision="bf16",
                      grad_accum=4)
    return config, obs


@pytest.mark.parametrize("strategy", ["ep8xfsdp", "pp2xep4xzero1"])
def test_a_slow_moe_run_is_reproduced_by_its_own_fit(strategy):
    """The fit's split into roofline and latency-bound work counts the MoE layers' own terms
    (fitting.moe_split_terms) and the weights ep keeps off the GPU, so the measured
    configuration predicts what was measured (a 64-expert Mixtral shape, 1.8× slower than
    its prior: the split applies)."""
    from mlflow_gpuopt.perfmodel.predictor import fit

    fine = replace(MIXTRAL, num_experts=64)
    config, obs = _measured(fine, strategy, 8, 1, 1.8)
    got = fit(fine, [obs], {H100.gpu: H100}).predict(config, H100).throughput_samples_per_s
    assert got == pytest.approx(obs.throughput_samples_per_s, rel=1e-3)


def test_the_split_puts_the_moe_layers_into_the_roofline():
    """By hand: with the MoE terms the split's excess is what the fitted scale adds to the
    dense roofline and to the MoE layers' host (× pp) and GPU (× tp·pp·cp) seconds."""
    from mlflow_gpuopt.perfmodel import compute, fitting

    fine = replace(MIXTRAL, num_experts=64)
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="pp2xep4xzero1"))
    parts = moe.layer_parts_s(fine, layout, H100, "bf16", 1, SEQ)
    host, gpu = fitting.moe_split_terms(fine, layout, H100, "bf16", 1.0, SEQ)
    weights = (compute.weight_traffic_time_s(moe.params_per_shard(fine, layout) * 2, H100,
                                             "bf16", fine)
               - compute.weight_traffic_time_s(fine.params, H100, "bf16", fine))
    assert host == pytest.approx((parts["dispatch"] + parts["sync"]) * 2 + weights)
    assert gpu == pytest.approx((parts["permute"] + parts["expert_gemm"]) * 2)
    a = compute.fixed_time_prior_s(fine.params, H100, "bf16",
                                   compute.kernel_count(fine)[0], fine) + host
    b = compute.per_sample_time_prior_s(fine, H100, "bf16") + gpu
    k, r, (x_fixed, x_sample) = fitting.split_latency_bound(fine, H100, "bf16", 1.0, 2.0, 1.0,
                                                            False, (host, gpu))
    rate = compute.latency_rate_flops_per_s(H100)
    assert (k, r) == (1.0, 1.0)
    assert (x_fixed + x_sample) / rate == pytest.approx(a + b)  # (2 - 1) x the roofline
    assert fitting.moe_split_terms(replace(fine, num_experts=None), layout, H100, "bf16",
                                   1.0, SEQ) == (0.0, 0.0)


def test_fp8_casts_of_the_experts_beyond_the_dense_gemms_share():
    """Qwen3-30B-A3B's experts (hidden 2,048, width 768, top-8) at 4,096 tokens: 32,768
    routed rows, each cast at 4 bytes an element for the gate/up input (2,048) and output
    gradient (1,536) and the down input (768) and output gradient (2,048): 839 MB; dense
    GEMMs 6,656 deep and wide cast 4 / 6 × 2 / 6,656 bytes per FLOP of the experts'
    6 × 32,768 × 3 × 2,048 × 768 FLOPs: 186 MB of it."""
    qwen = replace(MIXTRAL, hidden_size=2048, expert_ffn_hidden_size=768, num_experts=128,
                   experts_per_token=8, num_layers=48)
    rows = 4096 * 8
    total = 4.0 * rows * (2048 + 1536 + 768 + 2048)
    dense = 4.0 / 6.0 * 2.0 / 6656.0 * 6.0 * rows * 3 * 2048 * 768
    assert total == pytest.approx(838.86e6, rel=1e-5)
    assert moe.expert_cast_bytes(qwen, 4096) == pytest.approx(total - dense)
    assert moe.expert_cast_bytes(qwen, 4096) == pytest.approx(653.0e6, rel=1e-3)
    # per micro-step: every MoE layer of the stage at the streaming bandwidth, FP8 only
    parts = moe.layer_parts_s(qwen, EP8, H100, "fp8", 1, SEQ)
    assert parts["fp8_cast"] == pytest.approx(48 * (total - dense) / STREAM_BPS)
    assert moe.layer_parts_s(qwen, EP8, H100, "bf16", 1, SEQ)["fp8_cast"] == 0.0
    # Mixtral's wide experts (4,096 x 14,336) cast less per FLOP than the dense reference
    assert moe.expert_cast_bytes(MIXTRAL, 4096) == 0.0
