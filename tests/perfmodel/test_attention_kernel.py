"""Attention's fused kernel timed at its own share of peak per GPU generation
(``compute.ATTENTION_KERNEL_EFFICIENCY``), and the explanation of a cross-GPU prediction that
names it."""

from __future__ import annotations

import pytest

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, Workload, compute, fit
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

L, H, S = 32, 4096, 8192
ATTENTION_FLOPS = 12 * L * H * S * S  # QKᵀ and AV, forward + backward, per sample


def _hw(name: str):
    return hardware_for_gpu(load_gpus()[name], gpus_per_node=8)


def _llama(**kw) -> Workload:
    base = dict(params=int(8.0e9), flops_per_sample=6 * 8.0e9 * S + ATTENTION_FLOPS,
                precision="bf16", optimizer="adamw", tokens_per_sample=S, num_layers=L,
                hidden_size=H, num_heads=32, ffn_hidden_size=14336, vocab_size=128256,
                mlp="swiglu", attention="sdpa", dropout=0.0)
    base.update(kw)
    return Workload(**base)


def _split_time(w: Workload, hw, linear_eff: float, attn_eff: float) -> float:
    peak = hw.peak_flops_per_s["bf16"]
    return ((w.flops_per_sample - ATTENTION_FLOPS) / (peak * linear_eff)
            + ATTENTION_FLOPS / (peak * attn_eff))


def test_fa2_on_hopper_is_slower_than_the_gemms_and_fa3_faster():
    h100 = _hw("H100-SXM5-80GB")
    lin = compute.tensor_efficiency("H100-SXM5-80GB", "bf16")
    fa2 = compute.matmul_time_s(_llama(), h100, "bf16")
    fa3 = compute.matmul_time_s(_llama(attention_kernel="fa3"), h100, "bf16")
    assert fa2 == pytest.approx(_split_time(_llama(), h100, lin, 0.35))
    assert fa3 == pytest.approx(_split_time(_llama(), h100, lin, 0.61))
    flat = _llama().flops_per_sample / (h100.peak_flops_per_s["bf16"] * lin)
    assert fa3 < flat < fa2


def test_ampere_fa2_and_eager_attention_keep_the_gemm_efficiency():
    a100 = _hw("A100-80GB-SXM4")
    flat = _llama().flops_per_sample / (a100.peak_flops_per_s["bf16"]
                                        * compute.tensor_efficiency("A100-80GB-SXM4", "bf16"))
    assert compute.matmul_time_s(_llama(), a100, "bf16") == pytest.approx(flat)
    h100 = _hw("H100-SXM5-80GB")
    eager = _llama(attention="eager")
    assert compute.attention_efficiency(eager, h100, "bf16") is None
    assert compute.matmul_time_s(eager, h100, "bf16") == pytest.approx(
        eager.flops_per_sample / (h100.peak_flops_per_s["bf16"]
                                  * compute.tensor_efficiency("H100-SXM5-80GB", "bf16")))
    # fp32 / tf32 have no kernel figure either
    assert compute.attention_efficiency(_llama(), a100, "tf32") is None


def test_workload_file_reads_attention_kernel_and_rejects_unknown():
    doc = {"params": 1e9, "flops_per_sample": 1e12, "precision": "bf16"}
    assert workload_from_dict({**doc, "attention_kernel": "TE"}).attention_kernel == "fa3"
    assert workload_from_dict({**doc, "attention_kernel": "sdpa"}).attention_kernel == "fa2"
    assert workload_from_dict(doc).attention_kernel is None
    with pytest.raises(WorkloadFileError, match="attention_kernel"):
        workload_from_dict({**doc, "attention_kernel": "flash9"})


def test_a100_to_h100_prediction_names_attention_and_moves_by_it():
    a100, h100 = _hw("A100-80GB-SXM4"), _hw("H100-SXM5-80GB")
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=4.0,
                       micro_batch=1, strategy="fsdp", precision="bf16")]
    config = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=1, precision="bf16")
    fa2 = fit(_llama(), obs, {"A100-80GB-SXM4": a100}).predict(config, h100)
    fa3 = fit(_llama(attention_kernel="fa3"), obs,
              {"A100-80GB-SXM4": a100}).predict(config, h100)
    notes = [n for n in fa2.assumptions if n.startswith("attention (fa2")]
    assert len(notes) == 1 and "35%" in notes[0] and "A100-80GB-SXM4" in notes[0]
    assert fa2.throughput_samples_per_s < fa3.throughput_samples_per_s
    # no measurement: the note says what the kernel figure does against the linear layers'
    prior = fit(_llama(), [], {}).predict(config, h100)
    assert [n for n in prior.assumptions if n.startswith("attention (fa2")
            and n.endswith("against the linear layers' efficiency alone")]
    # measured on the GPU itself: nothing transferred, no such note
    same = fit(_llama(), obs, {"A100-80GB-SXM4": a100}).predict(config, a100)
    assert not [n for n in same.assumptions if n.startswith("attention (")]


def test_cross_gpu_width_adds_only_the_pieces_assumed():
    from mlflow_gpuopt.perfmodel import uncertainty as unc

    assert unc.other_gpu_sigma(False, False) == 0.0
    assert unc.other_gpu_sigma(True, False) == pytest.approx(0.06)
    # the same-GPU other-precision pairs' spread (uncertainty.SIGMA_OTHER_PRECISION)
    assert unc.other_gpu_sigma(False, True) == pytest.approx(0.14)
    assert unc.other_gpu_sigma(True, True) == pytest.approx((0.06 ** 2 + 0.14 ** 2) ** 0.5)
    # a CNN-like workload (no architecture): V100 amp carried to A100 amp is narrower than
    # V100 fp32 carried to A100 tf32, by the precision piece
    w = Workload(params=25_000_000, flops_per_sample=1.2e10, precision="fp16",
                 memory_traffic_bytes_per_sample=4e8, kernels_per_micro_step=600)
    v100 = hardware_for_gpu(load_gpus()["V100-SXM2-32GB"], gpus_per_node=8)
    a100 = _hw("A100-80GB-SXM4")

    def sigma(src: str, dst: str) -> float:
        obs = [Observation(gpu="V100-SXM2-32GB", gpu_count=1, throughput_samples_per_s=800.0,
                           micro_batch=64, strategy="single", precision=src)]
        cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=64,
                             precision=dst)
        return fit(w, obs, {"V100-SXM2-32GB": v100}).predict(cfg, a100).log_sigma

    same, changed = sigma("fp16", "fp16"), sigma("fp32", "tf32")
    assert same == pytest.approx((0.03 ** 2 + 0.06 ** 2) ** 0.5, abs=1e-6)
    assert changed == pytest.approx((0.03 ** 2 + 0.06 ** 2 + 0.14 ** 2) ** 0.5, abs=1e-6)
