"""Terms the large-language-model validation rests on: torchtitan's per-op selective
checkpointing, FP8 recipes, the vendor factors on the compute/memory/link paths, and the
transformer transfer widths."""

from __future__ import annotations

import math

import pytest

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import ParallelConfig, Workload, fit, memory_per_gpu
from mlflow_gpuopt.perfmodel import comm, compute, vendor
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.activations import (
    TransformerDims,
    activation_bytes,
    normalize_recompute,
    recompute_time_factor,
    selective_op_bytes_per_token,
)
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

LLAMA3_8B = TransformerDims(num_layers=32, hidden_size=4096, seq_len=8192, num_heads=32,
                            ffn_hidden_size=14336, gated_mlp=True, vocab_size=128256)


def _llama3_8b(**kw) -> Workload:
    flops = (6 * 8.0e9 + 12 * 32 * 4096 * 8192) * 8192
    base = dict(params=int(8.0e9), flops_per_sample=flops, precision="bf16", optimizer="adamw",
                tokens_per_sample=8192, num_layers=32, hidden_size=4096, num_heads=32,
                ffn_hidden_size=14336, vocab_size=128256, mlp="swiglu", attention="sdpa",
                dropout=0.0)
    base.update(kw)
    return Workload(**base)


def test_selective_op_keeps_input_every_other_projection_and_sdpa_output():
    # torchtitan's policy: save mm outputs 1, 3, 5, 7 of wq, wk, wv, wo, w1, w3, w2 (wq, wv,
    # w1, w2), SDPA's output and log-sum-exp; the checkpoint keeps the block input.
    e, h, ffn, heads = 2.0, 4096.0, 14336.0, 32
    expected = e * (h + h + h + ffn + h + h) + 4.0 * heads
    assert selective_op_bytes_per_token(LLAMA3_8B, e) == pytest.approx(expected)
    assert selective_op_bytes_per_token(LLAMA3_8B, e, tp=8) == pytest.approx(expected / 8)
    none = activation_bytes(LLAMA3_8B, 1, e, 0.0, recompute="none").stored_bytes
    sac = activation_bytes(LLAMA3_8B, 1, e, 0.0, recompute="selective-op")
    full = activation_bytes(LLAMA3_8B, 1, e, 0.0, recompute="full")
    assert full.stored_bytes < sac.stored_bytes < 0.5 * none
    # the backward rebuilds one layer at a time, as under full recomputation
    assert sac.recompute_bytes == pytest.approx(full.recompute_bytes)


def test_selective_op_spellings_and_time_cost():
    for name in ("selective-op", "op", "selective_op", "selective(per-op)"):
        assert normalize_recompute(name) == "selective-op"
    with pytest.raises(ValueError, match="selective-op"):
        normalize_recompute("sometimes")
    flops = (6 * 8.0e9 + 12 * 32 * 4096 * 8192) * 8192
    factor = recompute_time_factor("selective-op", "flash", flops, LLAMA3_8B)
    # wk, wo and w3 forward again: 2·h·(h + h + ffn) per token per layer, ~9% of the step
    extra = 2 * 4096 * (4096 + 4096 + 14336) * 32 * 8192 / flops
    assert factor == pytest.approx(1 + extra)
    assert 1.05 < factor < recompute_time_factor("full", "flash", flops, LLAMA3_8B)


def test_torchtitan_llama3_8b_local_batch_2_fits_96gb_with_per_op_sac_only():
    """torchtitan's published run (8 x H100 96 GB, FSDP, local batch 2, selective AC = per
    op) reports 77-82 GiB; without recomputation it would not fit."""
    config = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=2)
    sac = memory_per_gpu(_llama3_8b(recompute="selective-op"), config, 96e9)
    none = memory_per_gpu(_llama3_8b(recompute="none"), config, 96e9)
    assert sac.total_bytes < 96e9 < none.total_bytes
    assert 55e9 < sac.total_bytes < 96e9


def _hw(name: str):
    return hardware_for_gpu(load_gpus()[name], gpus_per_node=8)


def test_fp8_recipes_order_te_tensorwise_rowwise():
    hw = _hw("H100-SXM5-80GB")
    times = {r: compute.matmul_time_s(_llama3_8b(fp8_recipe=r), hw, "fp8")
             for r in ("te", "tensorwise", "rowwise")}
    assert times["te"] < times["tensorwise"] < times["rowwise"]
    assert compute.matmul_time_s(_llama3_8b(), hw, "fp8") == times["te"]
    # bf16 does not depend on the FP8 recipe
    assert compute.matmul_time_s(_llama3_8b(fp8_recipe="rowwise"), hw, "bf16") == \
        compute.matmul_time_s(_llama3_8b(), hw, "bf16")


def test_workload_file_takes_fp8_recipe_and_rejects_unknown_ones():
    doc = dict(params=8e9, flops_per_sample=1e15, precision="bf16", fp8_recipe="RowWise")
    assert workload_from_dict(doc).fp8_recipe == "rowwise"
    with pytest.raises(WorkloadFileError, match="fp8_recipe"):
        workload_from_dict({**doc, "fp8_recipe": "blockwise-magic"})


def test_amd_vendor_factors_reach_compute_memory_and_links():
    mi = _hw("MI300X")
    w = _llama3_8b()
    peak = mi.peak_flops_per_s["bf16"]
    assert compute.matmul_time_s(w, mi, "bf16") == pytest.approx(
        w.flops_per_sample / (peak * vendor.attainable_fraction("MI300X")))
    assert compute.traffic_time_s(w, mi, "bf16") == pytest.approx(
        compute.memory_traffic_bytes_per_sample(w, "bf16")
        / (mi.memory_bandwidth_bytes_per_s * vendor.attainable_memory_fraction("MI300X")))
    assert compute.weight_traffic_time_s(1e9, mi, "bf16") == pytest.approx(
        1e9 * 6 / (mi.memory_bandwidth_bytes_per_s * 0.81))
    rccl = vendor.collective_bus_efficiency("MI300X", comm.BUS_EFFICIENCY)
    assert comm.intra_bus_efficiency(mi) == pytest.approx(314.0 / 448.0) == rccl
    tp = comm.tp_allreduce_s(32, 2, 8192, 4096, 2, 8, mi)
    assert tp == pytest.approx(4 * 32 * comm.ring_allreduce_s(
        2 * 8192 * 4096 * 2, 8, mi.intra_node_bytes_per_s * rccl))
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ddp"))
    assert comm.dp_link(mi, layout)[0] == pytest.approx(mi.intra_node_bytes_per_s * rccl)


def test_nvidia_paths_keep_their_own_efficiencies():
    h100 = _hw("H100-SXM5-80GB")
    w = _llama3_8b()
    peak = h100.peak_flops_per_s["bf16"]
    # Linear layers at the generation's GEMM efficiency, attention's 12·L·h·s² per sample at
    # FlashAttention-2's 35% of an H100's peak (the FlashAttention-3 paper).
    attention = 12 * 32 * 4096 * 8192 * 8192
    assert compute.matmul_time_s(w, h100, "bf16") == pytest.approx(
        (w.flops_per_sample - attention)
        / (peak * compute.tensor_efficiency("H100-SXM5-80GB", "bf16"))
        + attention / (peak * 0.35))
    assert compute.weight_traffic_time_s(1e9, h100, "bf16") == pytest.approx(
        1e9 * 6 / (h100.memory_bandwidth_bytes_per_s * compute.MEMORY_EFFICIENCY))
    assert comm.intra_bus_efficiency(h100) == comm.BUS_EFFICIENCY


def test_mi300x_prediction_moves_with_vendor_factors_and_h100_does_not(monkeypatch):
    traffic = 6.0 * activation_bytes(LLAMA3_8B, 1, 2.0, 0.0).stored_bytes
    w = _llama3_8b(recompute="selective-op", memory_traffic_bytes_per_sample=traffic)
    config = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=1)

    def predict(gpu):
        return fit(w, [], {}).predict(config, _hw(gpu)).throughput_samples_per_s

    with_vendor = {g: predict(g) for g in ("MI300X", "H100-SXM5-80GB")}
    # the same models with the vendor lookups switched off (the NVIDIA-calibrated path)
    monkeypatch.setattr(vendor, "attainable_fraction", lambda gpu: None)
    monkeypatch.setattr(vendor, "attainable_memory_fraction", lambda gpu: None)
    monkeypatch.setattr(vendor, "is_amd", lambda gpu: False)
    without = {g: predict(g) for g in ("MI300X", "H100-SXM5-80GB")}
    assert with_vendor["H100-SXM5-80GB"] == without["H100-SXM5-80GB"]
    # compute-bound: 0.45 of peak instead of 0.6 makes MI300X about a quarter slower
    assert with_vendor["MI300X"] < 0.85 * without["MI300X"]


def test_transformer_transfer_width_keeps_the_models_own_deviation():
    # Independent of each other the two groups' spreads add: Ampere bf16 0.077, Hopper bf16
    # 0.063, Hopper fp8 0.126 (the derivation set's MFU spreads).
    ampere_hopper = math.hypot(0.077, 0.063)
    hopper_bf16_fp8 = math.hypot(0.063, 0.126)
    assert unc.transformer_transfer_bound(("ampere", "bf16"), ("hopper", "bf16")) == \
        pytest.approx(ampere_hopper)
    # the same model on another generation keeps most of its deviation: the pair spread,
    # below the independent sum
    bf16 = unc.transformer_transfer_sigma(("ampere", "bf16"), ("hopper", "bf16"))
    assert bf16 == pytest.approx(unc.SIGMA_TRANSFORMER_GENERATION_PAIR)
    assert bf16 < ampere_hopper
    # fp16 is bf16's group; another GPU type of the same generation is the same pair
    assert unc.transformer_transfer_sigma(("hopper", "fp16"), ("hopper", "bf16")) == \
        pytest.approx(bf16)
    # another precision: no pair set pins the same model's spread down, so the two groups'
    # spreads stay independent (bf16 -> fp8 on Hopper; and A100 bf16 -> H100 fp8)
    assert unc.transformer_transfer_sigma(("hopper", "bf16"), ("hopper", "fp8")) == \
        pytest.approx(hopper_bf16_fp8)
    assert unc.transformer_transfer_sigma(("ampere", "bf16"), ("hopper", "fp8")) == \
        pytest.approx(math.hypot(0.077, 0.126))
    # Blackwell takes Hopper's spreads: H100 -> B200 at fp8 is the same pair spread
    assert unc.transformer_transfer_sigma(("hopper", "fp8"), ("blackwell", "fp8")) == \
        pytest.approx(unc.SIGMA_TRANSFORMER_GENERATION_PAIR)
    assert unc.transformer_transfer_sigma(("volta", "fp16"), ("hopper", "bf16")) is None
    assert bf16 < unc.SIGMA_OTHER_GPU


def test_transformer_transfer_never_exceeds_the_independent_bound(monkeypatch):
    monkeypatch.setattr(unc, "SIGMA_TRANSFORMER_GENERATION_PAIR", 0.5)
    assert unc.transformer_transfer_sigma(("ampere", "bf16"), ("hopper", "bf16")) == \
        pytest.approx(math.hypot(0.077, 0.063))


def test_transformer_transfer_terms_add_layout_pieces_up_to_the_bound():
    beyond = (unc.TERM_BEYOND, 0.035)
    kept = unc.transformer_transfer_terms(0.061, 0.0995, (beyond,))
    assert kept == ((unc.TERM_TRANSFORMER_TRANSFER, 0.061), beyond)
    # 0.061 ⊕ 0.07 ⊕ 0.1 ⊕ 0.08 = 0.158 > 0.0995: the bound alone, the others at zero
    far = unc.transformer_transfer_terms(
        0.061, 0.0995, ((unc.TERM_BEYOND, 0.07), (unc.TERM_STRATEGY, 0.1),
                        (unc.TERM_MULTINODE, 0.08)))
    assert far == ((unc.TERM_TRANSFORMER_TRANSFER, 0.0995), (unc.TERM_BEYOND, 0.0),
                   (unc.TERM_STRATEGY, 0.0), (unc.TERM_MULTINODE, 0.0))
