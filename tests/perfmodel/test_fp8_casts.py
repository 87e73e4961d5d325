"""FP8 scale-and-cast traffic per linear layer (``compute.fp8_cast_bytes`` and the
``fp8_casts`` operator class): bytes from the GEMM shapes and the recipe, seconds at the
memory bandwidth, shapes that shrink with tensor parallelism while the casts do not shrink
as much. Expected values are worked by hand from torchao's per-operand byte counts
(docs/models.md#networks-as-rented-fp8-and-gpu-generations)."""

from __future__ import annotations

import pytest

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, Workload, compute, fit
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms

M, K, N = 8192, 4096, 14336  # a Llama-3-8B MLP up projection over one 8,192-token sample


def _h100():
    return hardware_for_gpu(load_gpus()["H100-SXM5-80GB"], gpus_per_node=8)


def _llama3_8b(**kw) -> Workload:
    base = dict(params=int(8.0e9), flops_per_sample=(6 * 8.0e9 + 12 * 32 * 4096 * 8192) * 8192,
                precision="bf16", optimizer="adamw", tokens_per_sample=8192, num_layers=32,
                hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                vocab_size=128256, mlp="swiglu", attention="sdpa", dropout=0.0)
    base.update(kw)
    return Workload(**base)


def test_one_linear_casts_by_recipe_bytes_and_seconds():
    # tensorwise: 6·M·K + 8·K·N + 6·M·N = 201,326,592 + 469,762,048 + 704,643,072
    assert compute.fp8_cast_bytes(M, K, N, "tensorwise") == 1_375_731_712
    # rowwise: 8·M·K + 10·K·N + 8·M·N = 268,435,456 + 587,202,560 + 939,524,096
    assert compute.fp8_cast_bytes(M, K, N, "rowwise") == 1_795_162_112
    # rowwise_with_gw_hp: 3·M·K + 6·K·N + 3·M·N = 100,663,296 + 352,321,536 + 352,321,536
    assert compute.fp8_cast_bytes(M, K, N, "rowwise_with_gw_hp") == 805_306_368
    assert compute.fp8_cast_bytes(M, K, N, "te") == 0.0  # fused into the neighbouring kernels
    # seconds: the bytes at 75 % of the H100 SXM's 3.35 TB/s
    hw = _h100()
    one_linear = Workload(params=K * N, flops_per_sample=6 * K * N * M, precision="fp8",
                          tokens_per_sample=M, num_layers=1, hidden_size=K, num_heads=32,
                          ffn_hidden_size=N, fp8_recipe="tensorwise")
    shapes = compute.fp8_linear_shapes(one_linear)
    assert (K, N) in shapes
    per_token, per_step = compute.fp8_cast_traffic_bytes(one_linear, "fp8")
    assert per_token == pytest.approx(sum(6 * k + 6 * n for k, n in shapes))
    assert per_step == pytest.approx(sum(8 * k * n for k, n in shapes))
    seconds = compute.fp8_cast_time_s(one_linear, hw, "fp8", M)
    assert seconds == pytest.approx((per_token * M + per_step) / (3.35e12 * 0.75))
    # bf16 and Transformer Engine have none
    assert compute.fp8_cast_time_s(one_linear, hw, "bf16", M) == 0.0
    assert compute.fp8_cast_time_s(Workload(**{**one_linear.__dict__, "fp8_recipe": "te"}),
                                   hw, "fp8", M) == 0.0


def test_linear_shapes_split_by_tensor_parallelism_and_casts_grow_against_the_gemms():
    w = _llama3_8b(fp8_recipe="tensorwise")
    # Q/K/V (8 of 32 heads for K and V): N = (1 + 2/4)·4096 = 6,144; gated MLP: up and gate
    assert compute.fp8_linear_shapes(w) == (
        (4096, 6144), (4096, 4096), (4096, 14336), (4096, 14336), (14336, 4096))
    assert compute.fp8_linear_shapes(w, tp=8) == (
        (4096, 768), (512, 4096), (4096, 1792), (4096, 1792), (1792, 4096))
    # per token on one of 8 GPUs, 32 layers, 6 bytes per input and gradient element:
    # 6·[(4096 + 768) + (512 + 4096) + 2·(4096 + 1792) + (1792 + 4096)] = 6·27,136
    per_token_tp8, per_step_tp8 = compute.fp8_cast_traffic_bytes(w, "fp8", tp=8)
    assert per_token_tp8 == pytest.approx(32 * 6 * 27_136)
    # weights: 8 bytes per element of each GPU's 1/8 of the layer's 3·4096·14336 + 4096·6144
    # + 4096·4096 weights
    assert per_step_tp8 == pytest.approx(32 * 8 * (3 * 4096 * 14336 + 4096 * 6144
                                                   + 4096 * 4096) / 8)
    per_token_tp1, _ = compute.fp8_cast_traffic_bytes(w, "fp8", tp=1)
    # The GEMMs split 8 ways; the casts of the full-width operands (a column-parallel
    # linear's input, a row-parallel one's output gradient) do not: 8 GPUs move 2.9x the bytes
    # of one (tp1: 6,144 + 4,096 + 4,096 + 4,096 + 2·(4,096 + 14,336) + 14,336 + 4,096 = 73,728)
    assert per_token_tp1 == pytest.approx(32 * 6 * 73_728)
    assert 8 * per_token_tp8 / per_token_tp1 == pytest.approx(8 * 27_136 / 73_728)


def test_casts_enter_the_micro_step_and_its_fp8_casts_class():
    hw = _h100()
    w = _llama3_8b(fp8_recipe="rowwise", precision="fp8")
    te = _llama3_8b(fp8_recipe="te", precision="fp8")
    shape = model_shape(w)
    for tp in (1, 8):
        layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy=f"tp{tp}xzero1"
                                               if tp > 1 else "ddp"))
        calib = Calibration(compute_scale=1.3)
        with_casts = step_terms(w, hw, "fp8", layout, 2, 1, shape, 12.0, calib)
        # te has the same GEMM time at a rowwise factor of 1: compare at equal kernel speed
        saved = dict(compute.FP8_RECIPE_EFFICIENCY)
        compute.FP8_RECIPE_EFFICIENCY["rowwise"] = 1.0
        try:
            no_casts = step_terms(te, hw, "fp8", layout, 2, 1, shape, 12.0, calib)
            same_kernels = step_terms(w, hw, "fp8", layout, 2, 1, shape, 12.0, calib)
        finally:
            compute.FP8_RECIPE_EFFICIENCY.clear()
            compute.FP8_RECIPE_EFFICIENCY.update(saved)
        expected = 1.3 * compute.fp8_cast_time_s(w, hw, "fp8", 2 * 8192, tp)
        assert same_kernels.compute_s - no_casts.compute_s == pytest.approx(expected, rel=1e-9)
        assert with_casts.compute_s > same_kernels.compute_s
    classes = compute.operator_class_times_s(w, hw, "fp8", 2, compute_scale=1.3)
    assert classes["fp8_casts"] == pytest.approx(
        1.3 * compute.fp8_cast_time_s(w, hw, "fp8", 2 * 8192))
    assert compute.operator_class_times_s(te, hw, "fp8", 2)["fp8_casts"] == 0.0


def test_rowwise_with_gw_hp_keeps_the_weight_gradient_gemm_in_bf16():
    assert compute.normalize_fp8_recipe("rowwise_with_gw_hp") == "rowwise_with_gw_hp"
    hw = _h100()
    gw_hp, rowwise = (_llama3_8b(fp8_recipe=r) for r in ("rowwise_with_gw_hp", "rowwise"))
    t_gw, t_row = (compute.matmul_time_s(w, hw, "fp8") for w in (gw_hp, rowwise))
    # attention is bf16 in both; a third of the linear time moves from the FP8 kernel at
    # rowwise's factor to bf16: linear_gw = (2·linear_row + linear_bf16) / 3
    attn = compute.matmul_time_s(rowwise, hw, "fp8") - compute._tensor_time_s(
        rowwise.flops_per_sample * (1 - compute.attention_flops_share(rowwise)), hw, "fp8"
    ) / compute.FP8_RECIPE_EFFICIENCY["rowwise"]
    linear_row = t_row - attn
    linear_bf16 = compute._tensor_time_s(
        rowwise.flops_per_sample * (1 - compute.attention_flops_share(rowwise)), hw, "bf16")
    assert t_gw - attn == pytest.approx((2 * linear_row + linear_bf16) / 3, rel=1e-9)
    assert t_gw > t_row  # bf16 GEMM slower than the row-scaled FP8 one
    assert compute.fp8_cast_traffic_bytes(gw_hp, "fp8")[0] < \
        compute.fp8_cast_traffic_bytes(rowwise, "fp8")[0]


def test_bf16_run_carried_to_fp8_names_the_new_fp8_casts_class():
    hw = _h100()
    w = _llama3_8b(fp8_recipe="tensorwise")
    obs = [Observation(gpu=hw.gpu, gpu_count=1, throughput_samples_per_s=0.6, micro_batch=1,
                       strategy="single", precision="bf16")]
    pred = fit(w, obs, {hw.gpu: hw})
    config = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=1,
                            precision="fp8")
    rows = {r["class"]: r for r in pred.transfer_classes(config, hw)}
    assert rows["fp8_casts"]["source_s"] == 0.0 and rows["fp8_casts"]["target_s"] > 0
    note = [n for n in pred.predict(config, hw).assumptions if "operator class" in n]
    assert note and "fp8_casts" in note[0]
