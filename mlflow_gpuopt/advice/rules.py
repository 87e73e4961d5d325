"""The advice rules over one run's measurements: each returns findings (with the measured
evidence and the line of PyTorch that fixes it) or says why it cannot be decided here.

Pure: :class:`~.types.RunFacts` in, :class:`~.types.Finding` / :class:`~.types.NotEvaluated`
out. The rules that need the plan's GPU take its :class:`~mlflow_gpuopt.catalog.schema.GpuSpec`
(``None``: no GPU known, they say so). Pricing the findings is :mod:`.worth`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.advice.types import Evidence, Finding, NotEvaluated, RunFacts

#: A step that waits this share of its time for the next batch is input-bound. The loader's
#: wait is time the GPU has nothing queued (less what the previous step still runs).
INPUT_WAIT_FRACTION = 0.10
#: GPU utilisation below this with host CPUs above CPU_BUSY_PERCENT: the host cannot feed it.
GPU_UTIL_LOW_PERCENT = 50.0
CPU_BUSY_PERCENT = 80.0
#: Tensor cores run 16-bit GEMMs whose dimensions are multiples of 8 (FP8: 16); NVIDIA's
#: "Matrix Multiplication Background" guide (docs.nvidia.com/deeplearning/performance).
ALIGN_16BIT = 8
ALIGN_FP8 = 16
#: Vocabulary-sized dimensions are padded to 64 (Megatron's make-vocab-size-divisible-by
#: default is 128 per tensor-parallel rank; 64 is what nanoGPT and the NVIDIA guide use).
VOCAB_PAD = 64
#: Unaligned GEMMs below this share of the matmul FLOPs are not worth a finding.
GEMM_SHARE_MIN = 0.05
#: Host dispatch above this share of the step: torch.compile's fusion and CUDA graphs pay.
DISPATCH_SHARE_MIN = 0.25
#: Exposed communication above this share of the step: bucket and overlap settings pay.
EXPOSED_COMM_MIN = 0.20
#: Measured exposed communication this far (a share of the step) above the scaling model's
#: share for the same configuration is a finding. The model's communication term is uncertain
#: by about 40% of itself (``perfmodel.uncertainty.SIGMA_COMM_FIT_FLOOR``); 10 points of the
#: step exceed that spread for any modelled share up to 25%, so a smaller gap is within what
#: the model itself does not know.
EXPOSED_COMM_MARGIN = 0.10
#: Models this large gain from FP8 (smaller ones are dominated by non-GEMM work);
#: the recommender's own threshold for tensor/pipeline parallelism.
FP8_MIN_PARAMS = 1_000_000_000

FIX_AUTOCAST = ("with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):  "
                "# around the forward and the loss")
FIX_AUTOCAST_FP16 = ("with torch.autocast(device_type=\"cuda\", dtype=torch.float16):  "
                     "# with torch.amp.GradScaler(\"cuda\") around backward/step")
FIX_TF32 = "torch.set_float32_matmul_precision(\"high\")  # TF32 matmuls, before training"
FIX_FP8 = ("from torchao.float8 import convert_to_float8_training; "
           "convert_to_float8_training(model)  # or Transformer Engine's te.Linear")
FIX_LOADER = ("DataLoader(dataset, batch_size=..., num_workers=min(8, os.cpu_count() - 1), "
              "pin_memory=True, persistent_workers=True, prefetch_factor=4)")
FIX_DDP = ("model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])"
           "  # instead of nn.DataParallel; launch with torchrun --nproc-per-node N")
FIX_COMPILE = "model = torch.compile(model, mode=\"reduce-overhead\")"
FIX_BUCKETS = ("DistributedDataParallel(model, device_ids=[local_rank], bucket_cap_mb=100, "
               "gradient_as_bucket_view=True)")


def pad_to(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return int(math.ceil(n / multiple) * multiple)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


# -- input pipeline -----------------------------------------------------------------------------
def input_pipeline(f: RunFacts) -> list[Finding | NotEvaluated]:
    out: list[Finding | NotEvaluated] = []
    if f.input_wait_fraction is None:
        out.append(NotEvaluated("input_wait", "the run has no input-wait measurement (fewer "
                                "steps than the warm-up, steps marked without a model forward, "
                                "or tracked by an older gpuopt)"))
    elif f.input_wait_fraction >= INPUT_WAIT_FRACTION:
        ev = [Evidence(contract.SUMMARY_INPUT_WAIT_FRACTION, round(f.input_wait_fraction, 4),
                       f"{_pct(f.input_wait_fraction)} of each step waits for the next batch")]
        if f.input_wait_mean_s is not None:
            ev.append(Evidence(contract.SUMMARY_INPUT_WAIT_MEAN_S, f.input_wait_mean_s,
                               f"{f.input_wait_mean_s * 1e3:.1f} ms per step"))
        out.append(Finding(
            "input_wait", "Input pipeline starves the training step", tuple(ev), FIX_LOADER,
            change="input_wait", share=f.input_wait_fraction,
            detail="loading, decoding and collating run on the training thread between "
                   "steps; worker processes prefetch batches while the step runs (keep "
                   "workers off the training process's core: num_workers < cores)"))
    if f.gpu_utilization_mean_percent is None:
        out.append(NotEvaluated("gpu_idle_cpu_busy", "no GPU readings on this run (measured on "
                                f"{f.device}): GPU utilisation cannot be judged here"))
    elif (f.gpu_utilization_mean_percent < GPU_UTIL_LOW_PERCENT
          and (f.cpu_utilization_mean_percent or 0.0) >= CPU_BUSY_PERCENT):
        idle = 1.0 - f.gpu_utilization_mean_percent / 100.0
        out.append(Finding(
            "gpu_idle_cpu_busy", "GPU mostly idle while the host CPUs are busy",
            (Evidence(contract.SUMMARY_GPU_UTILIZATION, f.gpu_utilization_mean_percent,
                      f"GPU utilisation {f.gpu_utilization_mean_percent:.0f}%"),
             Evidence(contract.METRIC_CPU_UTILIZATION, f.cpu_utilization_mean_percent,
                      f"host CPU {f.cpu_utilization_mean_percent:.0f}%")),
            FIX_LOADER, change="input_wait" if f.input_wait_fraction else "none",
            share=min(idle, f.input_wait_fraction or idle),
            detail="data-loading threads compete with the training thread for the same "
                   "cores; move decoding to worker processes, or to the GPU"))
    return out


# -- precision ----------------------------------------------------------------------------------
def _tensor_core_speedup(spec: Any, precision: str) -> float:
    base = spec.peak_tflops("fp32")
    return spec.peak_tflops(precision) / base if base else 1.0


def precision(f: RunFacts, spec: Any | None) -> list[Finding | NotEvaluated]:
    """fp32 on a tensor-core GPU; FP8 for large 16-bit models on GPUs that have it."""
    if spec is None:
        return [NotEvaluated("precision", f"measured on {f.device} and no plan GPU: whether "
                             "the GPU has tensor cores for 16-bit math is unknown here")]
    p = (f.precision or "fp32").lower()
    ev = (Evidence(contract.PARAM_PRECISION, p, f"runs in {p} (no autocast)"),)
    out: list[Finding | NotEvaluated] = []
    if p in ("fp32", "tf32"):
        half = "bf16" if spec.bf16_tflops else "fp16"
        gain = _tensor_core_speedup(spec, half) / _tensor_core_speedup(spec, p)
        if gain >= 1.5:
            out.append(Finding(
                "precision_amp", f"{p} on a {spec.name} with {half} tensor cores",
                ev + (Evidence("gpu_peak_ratio", round(gain, 2),
                               f"{spec.name} {half} peak is {gain:.1f}x its {p} peak"),),
                FIX_AUTOCAST if half == "bf16" else FIX_AUTOCAST_FP16, change="precision",
                share=1.0 - 1.0 / gain, params={"precision": half},
                detail="mixed precision keeps fp32 master weights; bf16 needs no loss "
                       "scaling"))
        if p == "fp32" and spec.tf32_tflops and spec.tf32_tflops > 1.5 * spec.fp32_tflops:
            out.append(Finding(
                "precision_tf32", f"fp32 matmuls without TF32 on a {spec.name}",
                ev + (Evidence("gpu_peak_ratio", round(spec.tf32_tflops / spec.fp32_tflops, 2),
                               f"TF32 peak {spec.tf32_tflops:g} vs fp32 {spec.fp32_tflops:g} "
                               "TFLOP/s"),),
                FIX_TF32, change="precision",
                share=1.0 - spec.fp32_tflops / spec.tf32_tflops, params={"precision": "tf32"},
                detail="the smallest change: matmuls keep fp32 storage, TF32 inputs"))
    elif p in ("bf16", "fp16") and spec.fp8_tflops and (f.params or 0) >= FP8_MIN_PARAMS:
        gain = spec.fp8_tflops / spec.peak_tflops(p)
        out.append(Finding(
            "precision_fp8", f"a {f.params / 1e9:.1f}B-parameter model in {p} on a "
                             f"{spec.name} with FP8 tensor cores",
            ev + (Evidence(contract.PARAM_PARAMS, f.params, f"{f.params:,} parameters"),),
            FIX_FP8, change="precision", share=1.0 - 1.0 / gain, params={"precision": "fp8"}))
    return out


# -- GEMM shapes --------------------------------------------------------------------------------
def gemm_shapes(f: RunFacts, target_precision: str = "bf16") -> list[Finding | NotEvaluated]:
    """Matmul dimensions that tensor cores cannot tile (the profiled step's shapes)."""
    if not f.gemm_shapes:
        return [NotEvaluated("gemm_shapes", "the run's profile has no matmul shapes (profiled "
                             "by an older gpuopt, or no matmul ran)")]
    align = ALIGN_FP8 if target_precision == "fp8" else ALIGN_16BIT
    total = bad = 0.0
    dims: dict[int, int] = {}
    for m, k, n in f.gemm_shapes:
        flops = 2.0 * m * k * n
        total += flops
        # M is the batch × sequence dimension of a linear layer: the data, not the model;
        # K and N are the layer's own sizes. One below the alignment (a critic's or a
        # regression's scalar head, a 3-class classifier) is left alone: padding it would
        # multiply that product's work, and a product that thin is bound by memory anyway.
        odd = [d for d in (k, n) if d % align and d > align]
        if odd:
            bad += flops
            for d in odd:
                dims[d] = dims.get(d, 0) + 1
    share = bad / total if total else 0.0
    if share < GEMM_SHARE_MIN:
        return []
    biggest = max(dims)
    pads = ", ".join(f"{d} -> {pad_to(d, VOCAB_PAD if d == biggest else align)}"
                     for d in sorted(dims, reverse=True)[:4])
    return [Finding(
        "gemm_shapes", f"matmul dimensions not multiples of {align}",
        (Evidence("gpuopt/profile.gemm_shapes", share,
                  f"{_pct(share)} of the matmul FLOPs have dims {sorted(dims)[:4]} "
                  f"(not multiples of {align})"),),
        f"pad the layer sizes: {pads} (e.g. nn.Linear(d_in, {pad_to(biggest, VOCAB_PAD)}); "
        "for a vocabulary, vocab_size = pad to 64 and ignore the padded logits)",
        change="gemm_alignment", share=share * 0.5, params={"unaligned_flops_share": share},
        detail="cuBLAS tiles 16-bit GEMMs for tensor cores in multiples of 8 (FP8: 16); "
               "other shapes run padded or on slower kernels")]


# -- parallelism and compilation ----------------------------------------------------------------
def parallelism(f: RunFacts) -> list[Finding | NotEvaluated]:
    """nn.DataParallel, and exposed communication against the fixed threshold (no model)."""
    return [*data_parallel(f), *exposed_comm(f)]


def data_parallel(f: RunFacts) -> list[Finding | NotEvaluated]:
    out: list[Finding | NotEvaluated] = []
    if f.model_wrapper is None:
        out.append(NotEvaluated("data_parallel", "the run does not record its model wrapper "
                                "(tracked by an older gpuopt)"))
    elif f.model_wrapper == "DataParallel":
        out.append(Finding(
            "data_parallel", "nn.DataParallel instead of DistributedDataParallel",
            (Evidence(contract.PARAM_MODEL_WRAPPER, "DataParallel",
                      "the tracked model is an nn.DataParallel"),),
            FIX_DDP, change="ddp", share=0.3,
            detail="DataParallel runs every GPU from one Python thread, copies the weights "
                   "from GPU 0 to the others on each forward and gathers the gradients back "
                   "to it, none of it overlapped with compute"))
    return out


def exposed_comm(f: RunFacts, modelled_share: float | None = None
                 ) -> list[Finding | NotEvaluated]:
    """Exposed communication beyond what the scaling model predicts for the measured
    configuration (``modelled_share``: its predicted exposed communication over its predicted
    step) by ``EXPOSED_COMM_MARGIN`` of the step. Without a model of the run (no target, or
    a CPU run the models cannot place) the fixed ``EXPOSED_COMM_MIN`` stands in."""
    if f.world_size <= 1:
        return [NotEvaluated("exposed_comm", "a single process: no communication measured")]
    measured = f.exposed_comm_fraction
    if measured is None:
        return [NotEvaluated("exposed_comm", "the run has no exposed-communication "
                             "measurement")]
    ev = [Evidence(contract.SUMMARY_EXPOSED_COMM_FRACTION, measured,
                   f"{_pct(measured)} of the step waits on communication")]
    if modelled_share is None:
        if measured < EXPOSED_COMM_MIN:
            return []
        excess = measured
        detail = (f"no model of the measured configuration (fixed {_pct(EXPOSED_COMM_MIN)} "
                  "threshold)")
    else:
        excess = measured - modelled_share
        if excess < EXPOSED_COMM_MARGIN:
            return []
        ev.append(Evidence("predicted_exposed_comm_share", round(modelled_share, 4),
                           f"the model predicts {_pct(modelled_share)} for this "
                           f"configuration: {_pct(excess)} of the step beyond it"))
        detail = ("DDP overlaps each gradient bucket's all-reduce with the rest of the "
                  "backward; more exposed time than the model's share means the buckets "
                  "wait (too small or too many, copies into the bucket, a bucket per "
                  "unused parameter)")
    return [Finding("exposed_comm", "gradient communication not hidden behind the backward",
                    tuple(ev), FIX_BUCKETS, change="exposed_comm", share=excess,
                    params={"excess_share": excess}, detail=detail)]


def compile_dispatch(f: RunFacts, step_time_s: float | None = None,
                     grad_accum: int | None = None) -> list[Finding | NotEvaluated]:
    """Eager kernel dispatch above ``DISPATCH_SHARE_MIN`` of the step (``step_time_s``: the
    plan's predicted step; default the measured one, which only means something on a GPU)."""
    from mlflow_gpuopt.perfmodel.compute import KERNEL_DISPATCH_S

    if f.model_wrapper == "compiled" or f.compiled:
        return []
    if not f.kernels_per_micro_step:
        return [NotEvaluated("compile", "the profile has no kernels-per-micro-step count")]
    if step_time_s is None:
        if f.device == "cpu":
            return [NotEvaluated("compile", "measured on a CPU: kernel launch cost on a GPU "
                                 "is judged on the plan (give a target)")]
        step_time_s = f.step_time_mean_s
    accum = grad_accum or f.grad_accum or 1
    if not step_time_s:
        return []
    dispatch_s = f.kernels_per_micro_step * KERNEL_DISPATCH_S * accum
    share = min(1.0, dispatch_s / step_time_s)
    if share < DISPATCH_SHARE_MIN:
        return []
    return [Finding(
        "compile", "eager kernel launches are a large share of the step",
        (Evidence(contract.PARAM_KERNELS_PER_MICRO_STEP, f.kernels_per_micro_step,
                  f"{f.kernels_per_micro_step:,.0f} kernels per micro-step, "
                  f"~{dispatch_s * 1e3:.1f} ms of launches ({_pct(share)} of the step)"),),
        FIX_COMPILE, change="dispatch", share=share, params={"dispatch_s": dispatch_s})]


def cheap_findings(f: RunFacts, spec: Any | None = None) -> list[Finding | NotEvaluated]:
    """Every rule that needs no catalog or prediction (``spec``: the measured GPU's, if the
    catalog knows it), for the end-of-run summary."""
    return [*input_pipeline(f), *precision(f, spec), *gemm_shapes(f), *parallelism(f),
            *compile_dispatch(f)]


def top_finding(items: Sequence[Finding | NotEvaluated]) -> Finding | None:
    """The finding with the largest step-time share at stake, or ``None``."""
    found = [x for x in items if isinstance(x, Finding)]
    return max(found, key=lambda x: x.share) if found else None
