"""Compute time of one micro-step on one GPU: ``T_grad(m) = a + b·m`` (Pollux).

The priors are a roofline over matmul FLOPs (dense peak for the precision), DRAM traffic
(the matmuls' own share hidden under them, :func:`hidden_traffic_share`), the layout transposes of
NCHW convolutions on tensor cores (:func:`transpose_time_s`) and latency-bound work (which
scales with SM count × clock, Habitat's wave scaling; ``LATENCY_FIXED_SHARE`` of it is
batch-independent). ``a`` adds the weight and gradient traffic and the host's kernel launches
(``kernels_per_micro_step`` × ``KERNEL_DISPATCH_S``, else ``MICRO_STEP_OVERHEAD_S``): CPU time,
carried over unchanged between GPU types. Library efficiencies per GPU generation and
precision (:func:`tensor_efficiency`, ``GENERATION_MFU``, set on a derivation set that
``benchmarks/bench_llm.py`` never scores) and the rest:
docs/models.md#compute-of-one-micro-step-computepy. Observations then calibrate the priors
(:mod:`.fitting`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from mlflow_gpuopt.perfmodel.activations import DROPOUT_MASK_BYTES_CUDA, activation_bytes
from mlflow_gpuopt.perfmodel.precision import (
    ACTIVATION_BYTES,
    ELEMENT_BYTES,
    is_mixed,
    normalize_precision,
    peak_flops_per_s,
    uses_tensor_cores,
)
from mlflow_gpuopt.perfmodel import sequence_bins, vendor
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

#: Share of dense peak reached by the FLOP-heavy kernels: plain FP32 (SIMT) units get closer
#: to their peak (cuBLAS SGEMM ~85%) than tensor cores, whose peak assumes perfectly shaped
#: matmuls fed at full rate (~60% on real layer shapes).
COMPUTE_EFFICIENCY_SIMT = 0.85
COMPUTE_EFFICIENCY_TENSOR = 0.6
#: Model-FLOPs utilisation (model FLOPs / dense peak of the precision) of large transformer
#: pre-training, median per (architecture, precision), from the bench_llm derivation set:
#: - Ampere bf16 0.538: torchtitan docs/performance.md @3faaa1a (2024-08), Llama 2 13B/70B on
#:   64 A100-80GB, FSDP (MFU 0.505-0.611, 5 rows);
#: - Hopper bf16 0.46: Megatron-LM README @937571c (2024-07), GPT 1.7B-462B on 48-6144 H100
#:   (MFU 0.41-0.49, 11 rows);
#: - Hopper fp8 0.409: NeMo 24.07 performance_summary.md @8e3d65d (2024-09), GPT3/Llama 2/3/
#:   Nemotron on 8-512 H100 at FP8 (model TFLOP/s / 1978.9 = 0.28-0.45, median 0.38, 12
#:   rows). FP8 runs only the linear layers; attention stays bf16 (:func:`matmul_time_s`), so
#:   per row the linear layers' figure m8 solves ``1/MFU = (1−a)/m8 + 2a/m16`` with ``a`` the
#:   attention share of the FLOPs (``12·L·h·s / (6N + 12·L·h·s)``) and m16 Hopper bf16's 0.46;
#:   median of the 12 rows 0.409 (0.29-0.46).
#: Blackwell has no row outside the report set: it takes Hopper's figures (same tensor-core
#: feed design doubled), so bench_llm's B200 rows test that assumption.
GENERATION_MFU = {("ampere", "bf16"): 0.538, ("hopper", "bf16"): 0.46,
                  ("hopper", "fp8"): 0.409}
#: Architecture of each catalog GPU, by name prefix (the first that matches wins).
ARCHITECTURE_PREFIXES = (
    ("V100", "volta"), ("T4", "turing"), ("A100", "ampere"), ("A10G", "ampere"),
    ("A10", "ampere"), ("A40", "ampere"), ("RTX-A6000", "ampere"), ("RTX-3090", "ampere"),
    ("L40S", "ada"), ("L4", "ada"), ("RTX-4090", "ada"), ("H100", "hopper"),
    ("H200", "hopper"), ("B200", "blackwell"), ("MI300X", "cdna3"), ("MI325X", "cdna3"),
    ("MI250X", "cdna2"),
)
_SAME_AS = {"blackwell": "hopper"}
#: Share of a sample's DRAM traffic done by the matmul/convolution kernels themselves
#: (reading inputs and weights, writing outputs), which overlaps their arithmetic; the rest
#: is normalisation and element-wise kernels, which are bandwidth-bound and add. The default
#: where the share was not measured; a tracked run's profile measures it
#: (``matmul_traffic_bytes_per_sample`` of ``memory_traffic_bytes_per_sample``, 0.26-0.34 on
#: the not-described DeepLearningExamples models ``bench_accuracy.py --tracked`` tracks:
#: :func:`hidden_traffic_share`).
MATMUL_HIDDEN_TRAFFIC_SHARE = 0.5
#: Share of latency-bound work (time a measurement shows beyond the roofline) that does not
#: grow with the micro-batch, until two measured micro-batches say otherwise.
LATENCY_FIXED_SHARE = 0.5
#: ...but never more than launching the micro-step's kernels one after another could cost:
#: the kernels the profiler counted (``Workload.kernels_per_micro_step``) or, without a count,
#: about 100 per layer (forward ~30, backward ~60, plus the optimizer's), each at about 10 µs
#: of host-side dispatch. Eager PyTorch spends some 5-25 µs of CPU per operator before its
#: kernel runs (Python binding, autograd recording, the ATen dispatcher, then a
#: ``cudaLaunchKernel`` of a few µs); 10 µs sits in that range. A published order of
#: magnitude, not fitted to the accuracy benchmark. Where the kernels were counted, the same
#: count × 10 µs is also the prior's host-side overhead per micro-step
#: (:func:`micro_step_overhead_s`).
KERNELS_PER_LAYER_STEP = 100
KERNEL_DISPATCH_S = 10e-6
#: Share of datasheet memory bandwidth reached by streaming kernels (NVIDIA; an AMD GPU takes
#: its vendor figure, :func:`.vendor.attainable_memory_fraction`).
MEMORY_EFFICIENCY = 0.75
#: Speed of the FP8 linear layers' GEMMs per FP8 implementation and scaling recipe, relative
#: to Transformer Engine's per-tensor scaling (``te``: delayed or current scaling, as NeMo and
#: Megatron run it), on which ``GENERATION_MFU``'s Hopper FP8 figure was derived: what is left
#: of the recipe's cost once its scale-and-cast traffic is timed on its own
#: (:func:`fp8_cast_time_s`, ``FP8_CAST_BYTES_PER_ELEMENT``). torchao's float8 training
#: (``tensorwise``: one dynamic scale per tensor, torchao's default; ``rowwise``: a scale per
#: row, all three GEMMs in FP8; ``rowwise_with_gw_hp``: the weight-gradient GEMM in bf16)
#: runs ``torch._scaled_mm``, whose row-scaled variant is slower than the per-tensor one.
#: Derived from torchao's own end-to-end table, independent of the rows bench_llm scores
#: (pytorch/ao ``torchao/float8/README.md``, "Training benchmarks", NVIDIA H100: Llama 3 8B on
#: 8 × H100, torchtitan, FSDP2, per-op SAC, batch 1, seq 8192: bf16 6,150, tensorwise
#: 7,689.5 (+25.0%), rowwise 6,768 (+10.05%) tokens/s) by solving this module's FP8 time
#: split (linear layers at FP8, attention at bf16, the casts at the memory bandwidth, traffic
#: and the rest unchanged) for those speed-ups; ``benchmarks/bench_llm.py --derive-fp8``
#: prints the solution. ``rowwise_with_gw_hp`` (no H100 row in that table) takes ``rowwise``'s
#: factor: the same row-scaled kernel for its two FP8 GEMMs.
FP8_RECIPE_EFFICIENCY = {"te": 1.0, "tensorwise": 0.866, "rowwise": 0.727}
#: FP8 recipes (``Workload.fp8_recipe``) and the ``FP8_RECIPE_EFFICIENCY`` entry each takes.
FP8_RECIPES = ("te", "tensorwise", "rowwise", "rowwise_with_gw_hp")
_FP8_KERNEL_RECIPE = {"rowwise_with_gw_hp": "rowwise"}
#: DRAM bytes per element that scaling and casting one operand of a linear layer to FP8 moves
#: in its forward and backward, per recipe, as (input ``X`` (M × K), weight ``W`` (K × N),
#: output gradient ``dY`` (M × N)): torchao's own roofline of its float8 training kernels
#: (pytorch/ao ``torchao/testing/training/roofline_utils.py``,
#: ``get_tensor_memory_traffic_ovhd_s``, without fusion into the neighbouring op, the default
#: its README's speed-up tables are reproduced with), bf16 read (2 bytes), fp8 written (1):
#: - ``tensorwise``: ``X`` and ``dY`` an amax pass (read 2), then one cast reading bf16 and
#:   writing fp8 row- and column-major for the two GEMMs each enters (2 + 1 + 1): 6; ``W`` the
#:   amax pass and a cast each for the forward and the backward (2 + 3 + 3): 8;
#: - ``rowwise``: ``X`` and ``dY`` one kernel writing the row-scaled fp8 and a bf16 transpose
#:   (2 + 1 + 2), one casting the transpose column-scaled (2 + 1): 8; ``W`` the forward cast
#:   (2 + 1), a bf16 transpose (2 + 2) and its cast (2 + 1): 10;
#: - ``rowwise_with_gw_hp``: ``X`` and ``dY`` one row-scaled cast (2 + 1): 3 (the weight-
#:   gradient GEMM takes them in bf16); ``W`` a row-scaled cast for the forward and a tensor-
#:   scaled one for the backward (3 + 3): 6;
#: - ``te``: 0. Transformer Engine fuses the casts into the neighbouring kernels (LayerNorm and
#:   the activation emit FP8, the cast of a gradient comes with its transpose; its docs,
#:   "Operation fuser API": fusion matters most in low precision, "because it involves extra
#:   cast operations"); what is left of them is inside ``GENERATION_MFU``'s Hopper FP8
#:   figure, a whole-step figure derived on Transformer Engine runs.
#: Per layer the linears are Q/K/V as one (K = h, N = (1 + 2·k/a)·h / tp), the attention output
#: (h / tp, h), the MLP's up (and gate) projection (h, f / tp, twice gated) and its down
#: projection (f / tp, h) (:func:`fp8_linear_shapes`); the output projection stays in bf16
#: (torchtitan's float8 converter leaves ``output`` out).
FP8_CAST_BYTES_PER_ELEMENT = {"te": (0.0, 0.0, 0.0), "tensorwise": (6.0, 8.0, 6.0),
                              "rowwise": (8.0, 10.0, 8.0),
                              "rowwise_with_gw_hp": (3.0, 6.0, 3.0)}
#: Share of the dense 16-bit tensor-core peak attention's fused kernel reaches, forward +
#: backward, per GPU generation and kernel (:func:`attention_efficiency`). Attention's two
#: batched matmuls (``QKᵀ``, ``AV``, :func:`attention_flops_share`) run inside one fused kernel
#: with the softmax between them, and how much of the tensor cores it keeps busy depends on the
#: kernel's design per generation, not on the linear layers' GEMM efficiency:
#: - ``fa2`` (FlashAttention-2, PyTorch SDPA's flash backend on both Ampere and Hopper): on
#:   A100 50-73% of peak, "close to the efficiency of GEMM operations" (Dao 2023, FlashAttention-
#:   2 paper, abstract): 0.6, Ampere's GEMM figure (``COMPUTE_EFFICIENCY_TENSOR``); on H100
#:   35% (Shah et al. 2024, FlashAttention-3 paper, abstract: FA2 "achieves only 35%
#:   utilization on the H100", written for Ampere's synchronous pipeline, it uses neither TMA
#:   nor warp-specialised ``wgmma``);
#: - ``fa3`` (FlashAttention-3; Transformer Engine's cuDNN fused attention, ``te``/``cudnn``, is
#:   of the same design and what Megatron-LM / NeMo run on Hopper): 1.5-2.0× FA2 on H100, up to
#:   75% of peak in the forward (FlashAttention-3 paper): 0.35 × 1.75 = 0.61.
#: Blackwell takes Hopper's figures (as ``GENERATION_MFU``); a generation or kernel without a
#: figure (Volta, Turing, Ada, AMD; eager attention, which runs as ``bmm`` GEMMs) times the
#: attention FLOPs with the linear layers' efficiency.
ATTENTION_KERNEL_EFFICIENCY = {("ampere", "fa2"): 0.6, ("hopper", "fa2"): 0.35,
                               ("hopper", "fa3"): 0.61}
ATTENTION_KERNELS = ("fa2", "fa3")
_ATTENTION_KERNEL_ALIASES = {"fa2": "fa2", "flash2": "fa2", "flash-attention-2": "fa2",
                             "flash_attention_2": "fa2", "sdpa": "fa2",
                             "fa3": "fa3", "flash3": "fa3", "flash-attention-3": "fa3",
                             "flash_attention_3": "fa3", "te": "fa3", "cudnn": "fa3",
                             "transformer_engine": "fa3", "transformer-engine": "fa3"}
_FP8_RECIPE_ALIASES = {"te": "te", "transformer_engine": "te", "transformer-engine": "te",
                       "delayed": "te", "current": "te", "fp8-cs": "te",
                       "tensorwise": "tensorwise", "torchao": "tensorwise",
                       "rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise_with_gw_hp",
                       "rowwise-with-gw-hp": "rowwise_with_gw_hp"}
#: Memory formats of a convolutional network's activations (``Workload.memory_format``):
#: ``contiguous`` (PyTorch's default, NCHW) or ``channels_last`` (NHWC,
#: ``model.to(memory_format=torch.channels_last)``).
MEMORY_FORMATS = ("contiguous", "channels_last")
_MEMORY_FORMAT_ALIASES = {"contiguous": "contiguous", "contiguous_format": "contiguous",
                          "nchw": "contiguous", "channels_first": "contiguous",
                          "channels_last": "channels_last", "nhwc": "channels_last"}
#: How a 16-bit job keeps its weights (``Workload.mixed_precision``): ``autocast`` (fp32
#: weights; CUDA autocast's op lists keep the float32 list's outputs fp32, the measured
#: ``amp_traffic_bytes_per_sample``) or ``master_weights`` (the model cast to 16 bits, so
#: every activation is 16-bit, half the fp32 bytes; fp32 master weights and gradients in the
#: optimizer: apex AMP O2, which DeepLearningExamples' Transformer-XL runs by default, and
#: Megatron's fp16 module) or ``apex_o1`` (apex AMP O1: fp32 weights and casts before the
#: operators of its lists as autocast puts them, through Python wrappers whose host time
#: :func:`apex_o1_host_s` adds; DeepLearningExamples' Tacotron 2 and WaveGlow).
MIXED_PRECISION_MODES = ("autocast", "master_weights", "apex_o1")
_MIXED_PRECISION_ALIASES = {"autocast": "autocast", "amp": "autocast", "torch.amp": "autocast",
                            "torch_amp": "autocast", "native": "autocast",
                            "master_weights": "master_weights", "o2": "master_weights",
                            "apex_o2": "master_weights", "apex": "master_weights",
                            "fp16_module": "master_weights", "half_model": "master_weights",
                            "apex_o1": "apex_o1", "o1": "apex_o1"}
#: apex AMP O1 (``apex/amp/wrap.py``) replaces every function of its lists (torch's,
#: ``torch.Tensor``'s and ``torch.nn.functional``'s FP16, FP32, promote and sequence lists and
#: the RNN cells: matmuls, convolutions, linear layers, the arithmetic operators, cat/stack,
#: softmax, norms, losses) by a Python function that, on every forward call, looks each fp32
#: weight up in its cast cache and tests each argument's type before calling the original;
#: the backward runs in C++ through none of them. ``benchmarks/workloads/
#: measure_apex_o1_overhead.py`` re-implements those checks and measures, on a CPU, side by
#: side with a plain eager operator: a Tacotron 2 step at DeepLearningExamples' shapes (570
#: mel frames) makes 9,745 wrapped calls, 0.125 per operator the profiler counts (17 per mel
#: frame: five linear layers, four cats, three additions, the two LSTM cells, the location
#: convolution, softmax, bmm), each costing 4.7 plain eager operators of host time on
#: average (a linear layer's 5.5 and an LSTM cell's 16 with their cached weights, an
#: addition's 2.1, a cat's 1.3). Carried as multiples of ``KERNEL_DISPATCH_S``: the wrappers'
#: Python work is taken to scale with the host as an eager operator's host work does. A
#: workload's own share of wrapped calls is not known (the profile does not count them):
#: Tacotron 2's stands for every ``apex_o1`` job (docs/models.md#batch-independent-work-a).
APEX_O1_WRAPPED_CALLS_PER_KERNEL = 0.125
APEX_O1_EXTRA_OPERATORS_PER_CALL = 4.7
#: DRAM bytes per parameter one optimizer step moves beyond Adam's read and write of the
#: fp32 weight and its state and read of the gradient (``2·(4 + K) + 4``;
#: docs/models.md#optimizer-step):
#: - a trust-ratio optimizer (LAMB: apex ``FusedLAMB``, DeepLearningExamples' ``JITLamb``)
#:   needs the norms of the whole weight and the whole update before it applies the update,
#:   so the update is written (4), read for its norm (4) and read again to apply it (4), and
#:   the weight is read twice more, for its norm and in the weight-decay term (8): 20;
#: - clipping by the global gradient norm: the gradient read for the norm (4), read and
#:   written to scale it (8): 12 (fp32 gradients: autocast's, or the master gradients);
#: - mixed precision with ``master_weights``: the 16-bit gradient read (2) and unscaled into
#:   the fp32 master gradient (4), the updated master weight read (4) and written back as the
#:   model's 16-bit weight (2): 12; under ``autocast`` the 16-bit weight copy's write, 2.
TRUST_RATIO_EXTRA_BYTES_PER_PARAM = 20.0
GRAD_CLIP_BYTES_PER_PARAM = 12.0
MASTER_WEIGHT_BYTES_PER_PARAM = 12.0
AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM = 2.0
#: DRAM bytes the layout transposes move per byte of stored activations, for convolutions
#: that run on tensor cores with NCHW tensors (docs/models.md#convolutions-and-memory-format).
#: cuDNN's tensor-core convolutions work in NHWC and transpose NCHW operands around each call
#: (NVIDIA, "Convolutional Layers User's Guide", Tensor Layouts In Memory: "NCHW layouts can
#: still be operated on by Tensor Cores, but include some overhead due to automatic
#: transpose operations"). A training step makes three calls per convolution, each on two
#: activation-sized operands, each transposed by a read and a write: the forward (input
#: ``x`` in, output ``y`` back), the data gradient (``dy`` in, ``dx`` back) and the weight
#: gradient (``x`` and ``dy`` in): 3 × 2 × (|x| + |y|). What a convolutional network stores
#: for its backward is, per convolution, its input (kept for the weight gradient; the
#: previous ReLU's output) and its output (kept by the BatchNorm after it), so Σ(|x| + |y|)
#: over the convolutions is about the stored activations: 6 bytes moved per stored byte. The
#: weights' own transposes (params × element × 6 per micro-step) are left out: at the
#: batches convolutional networks train at they are a few MB a sample against hundreds.
TRANSPOSE_BYTES_PER_ACTIVATION_BYTE = 6.0


def activation_bytes_per_sample(workload: Workload, precision: str) -> tuple[float, bool]:
    """Stored activations per sample at ``precision`` and whether the number was estimated.

    The profile's figure was measured at the workload's own precision; 16-bit activations are
    half the size of fp32/tf32 ones, FP8 ones 27/34 of 16-bit (``ACTIVATION_BYTES``).
    Without a profile figure: traffic / 6.
    """
    p = normalize_precision(precision)
    if workload.activation_bytes_per_sample:
        own = normalize_precision(workload.precision)
        return (workload.activation_bytes_per_sample * ACTIVATION_BYTES[p]
                / ACTIVATION_BYTES[own], False)
    return memory_traffic_bytes_per_sample(workload, p) / TRAFFIC_PER_ACTIVATION_BYTE, True


#: Where a sample's DRAM traffic comes from (:func:`traffic_source`): the profile's measured
#: figure, the measured activations × ``TRAFFIC_PER_ACTIVATION_BYTE``, the transformer
#: architecture's activation formula × the same, or FLOPs / ``DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32``.
TRAFFIC_SOURCES = ("measured", "measured activations", "architecture", "flops")


def traffic_source(workload: Workload) -> str:
    """Which of ``TRAFFIC_SOURCES`` :func:`memory_traffic_bytes_per_sample` uses: the most
    specific information the workload has."""
    if workload.memory_traffic_bytes_per_sample:
        return "measured"
    if workload.activation_bytes_per_sample:
        return "measured activations"
    if formula_activation_bytes_per_sample(workload, "bf16") is not None:
        return "architecture"
    return "flops"


@functools.lru_cache(maxsize=256)  # pure; asked for every plan of a search
def formula_activation_bytes_per_sample(workload: Workload, precision: str) -> float | None:
    """Activations one sample stores without recomputation at ``precision``, from the
    transformer activation formula (:mod:`.activations`), or None where the workload does not
    give the architecture (layers, hidden size, sequence length). FP8 is the bf16 figure ×
    27/34 (only the linear layers' inputs are FP8: ``ACTIVATION_BYTES``)."""
    from mlflow_gpuopt.perfmodel.activations import transformer_dims

    dims = transformer_dims(workload)
    if dims is None:
        return None
    p = normalize_precision(precision)
    dropout = workload.dropout is None or workload.dropout > 0
    element = 2.0 if p == "fp8" else float(ELEMENT_BYTES[p])
    stored = activation_bytes(
        dims, 1, element, DROPOUT_MASK_BYTES_CUDA if dropout else 0.0,
        attention=workload.attention, attention_dropout=dropout,
        recompute="none").stored_bytes
    return stored * (ACTIVATION_BYTES[p] / 2.0 if p == "fp8" else 1.0)


def memory_traffic_bytes_per_sample(workload: Workload, precision: str) -> float:
    """DRAM bytes one sample moves in forward+backward at ``precision``: the measured figure;
    else ``TRAFFIC_PER_ACTIVATION_BYTE`` × the stored activations, measured or, for a
    transformer whose architecture is given, from the activation formula; only without either,
    FLOPs / ``DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32`` (:func:`traffic_source` says which).
    A 16-bit (or FP8) prediction of an fp32/TF32 workload takes its measured
    ``amp_traffic_bytes_per_sample`` (the step under CUDA autocast, FP8 at 27/34 of it) in
    place of halving: autocast keeps the float32 list's outputs fp32 and casts in kernels of
    their own (:func:`amp_traffic`)."""
    p = normalize_precision(precision)
    own = normalize_precision(workload.precision)
    amp = amp_traffic(workload, p)
    if amp is not None:
        return amp[0]
    if workload.memory_traffic_bytes_per_sample:
        return (workload.memory_traffic_bytes_per_sample * ACTIVATION_BYTES[p]
                / ACTIVATION_BYTES[own])
    if workload.activation_bytes_per_sample:
        return (workload.activation_bytes_per_sample * ACTIVATION_BYTES[p]
                / ACTIVATION_BYTES[own] * TRAFFIC_PER_ACTIVATION_BYTE)
    formula = formula_activation_bytes_per_sample(workload, p)
    if formula is not None:
        return formula * TRAFFIC_PER_ACTIVATION_BYTE
    return (workload.flops_per_sample / DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32
            * ACTIVATION_BYTES[p] / 4.0)


def amp_traffic(workload: Workload, precision: str) -> tuple[float, float | None] | None:
    """(DRAM bytes per sample, their matmul part) of an fp32/TF32 workload at a mixed
    ``precision`` (fp16, bf16; FP8's non-linear work is bf16, its activations 27/34 of it:
    ``ACTIVATION_BYTES``) from its measured autocast figures, or None where there are none
    or no conversion is asked (docs/metrics.md#artifacts-and-profilejson)."""
    p = normalize_precision(precision)
    amp = workload.amp_traffic_bytes_per_sample
    if (not amp or amp <= 0 or not is_mixed(p)
            or is_mixed(normalize_precision(workload.precision))
            or mixed_precision_mode(workload) == "master_weights"):
        return None
    scale = ACTIVATION_BYTES[p] / 2.0
    matmul = workload.amp_matmul_traffic_bytes_per_sample
    return amp * scale, matmul * scale if matmul is not None else None


#: DRAM bytes moved per byte of stored activations in a training step, counted per pass over
#: each saved tensor: written by its producer in the forward (1) and read by its consumer
#: (1); read back in the backward for the gradients (1); its gradient written (1) and read by
#: the backward of its producer twice, once for the input gradient and once for the weight
#: gradient of a matmul (2). Fused kernels (FlashAttention's, a compiled norm) move less,
#: unfused fp32 norm intermediates more; the spread of this count is
#: ``uncertainty.SIGMA_TRAFFIC_ARCHITECTURE``.
TRAFFIC_PER_ACTIVATION_BYTE = 6.0
#: Arithmetic intensity assumed when the profile says nothing about memory and the
#: architecture is not known (FLOPs per byte of DRAM traffic with fp32 activations; halves the
#: bytes at 16-bit). Its spread is ``uncertainty.SIGMA_TRAFFIC_FROM_FLOPS``.
DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32 = 30.0
#: Operators one forward + backward of a transformer decoder layer dispatches in eager
#: PyTorch, counted from how the layer runs: forward ~36 (two RMS/LayerNorms of ~8 element-wise
#: operators each with their casts, 7 projections, rotary embedding ~6, SDPA and its layout
#: copies ~2, two residual adds, the MLP's activation and gate product), backward about twice
#: that (two matmuls per projection, one or two operators per element-wise one): ~108, taken as
#: ``KERNELS_PER_LAYER_STEP`` (100). Outside the layers (embedding, final norm, output
#: projection, cross-entropy, forward and backward) ``KERNELS_OUTSIDE_LAYERS``. The profiler's
#: own count of a BERT-large-shaped model on CPU (no autocast casts) is 1,661 for 24 layers,
#: ~65 per layer (``benchmarks/workloads/measure_gemm_kernels.py``), the same order.
KERNELS_OUTSIDE_LAYERS = 40
#: Host-side cost of one micro-step (kernel launches, Python and framework overhead) when the
#: profile did not count the kernels: a guess, of the order of 100 operators at
#: ``KERNEL_DISPATCH_S``. With a count, count × ``KERNEL_DISPATCH_S`` replaces it
#: (:func:`micro_step_overhead_s`).
MICRO_STEP_OVERHEAD_S = 1.0e-3


def normalize_fp8_recipe(name: str | None) -> str:
    """``te``, ``tensorwise``, ``rowwise`` or ``rowwise_with_gw_hp`` (``FP8_RECIPES``) from the
    usual spellings; None means ``te`` (Transformer Engine, the figure ``GENERATION_MFU`` was
    derived on)."""
    if name is None or not str(name).strip():
        return "te"
    key = str(name).strip().lower()
    if key not in _FP8_RECIPE_ALIASES:
        raise ValueError(f"unknown fp8_recipe {name!r}; expected te, tensorwise, rowwise or "
                         "rowwise_with_gw_hp")
    return _FP8_RECIPE_ALIASES[key]


def fp8_recipe_efficiency(recipe: str | None) -> float:
    """``FP8_RECIPE_EFFICIENCY`` of a recipe (``rowwise_with_gw_hp`` takes ``rowwise``'s)."""
    r = normalize_fp8_recipe(recipe)
    return FP8_RECIPE_EFFICIENCY[_FP8_KERNEL_RECIPE.get(r, r)]


def fp8_linear_shapes(workload: Workload, tp: int = 1) -> tuple[tuple[float, float], ...]:
    """(K, N) of each linear layer's GEMM in one transformer layer on one GPU of a
    ``tp``-way tensor-parallel group (the forward ``X (M × K) @ W (K × N)``): Q/K/V as one
    column-parallel GEMM ``(h, (1 + 2·k/a)·h / tp)`` (or the architecture's ``qkv_width``), the
    attention output row-parallel ``(h / tp, h)``, the MLP's up projection ``(h, f / tp)``
    (twice for a gated MLP: up and gate) and its down projection ``(f / tp, h)``. Empty where
    the workload does not give the architecture (layers, hidden size, sequence length)."""
    from mlflow_gpuopt.perfmodel.activations import transformer_dims

    dims = transformer_dims(workload)
    if dims is None:
        return ()
    t = float(max(1, int(tp)))
    h, f = dims.hidden_size, dims.ffn_hidden_size
    qkv = dims.qkv_width or (1.0 + 2.0 * dims.kv_share) * h
    up = ((h, f / t),) * (2 if dims.gated_mlp else 1)
    return ((h, qkv / t), (h / t, h)) + up + ((f / t, h),)


def linear_gemm_times_s(workload: Workload, hardware: Hardware, precision: str,
                        tokens: float, tp: int = 1) -> tuple[float, float, float, float] | None:
    """Forward seconds, before calibration, of one transformer layer's QKV, attention-output,
    MLP-up (gate and up together) and MLP-down GEMMs on one GPU of a ``tp``-way group, for
    ``tokens`` rows (:func:`fp8_linear_shapes`: ``2·M·K·N`` FLOPs each, at the linear layers'
    speed in :func:`matmul_time_s`). None without the architecture."""
    shapes = fp8_linear_shapes(workload, tp)
    if not shapes:
        return None
    p = normalize_precision(precision)
    fp8 = p == "fp8"
    times = [_tensor_time_s(2.0 * tokens * k * n, hardware, "fp8" if fp8 else p)
             for k, n in shapes]
    if fp8:
        eff = fp8_recipe_efficiency(workload.fp8_recipe)
        times = [t / eff for t in times]
    qkv, out, *up, down = times
    return qkv, out, sum(up), down


def fp8_cast_bytes(tokens: float, k: float, n: float, recipe: str | None) -> float:
    """DRAM bytes that casting one linear layer's operands to FP8 moves in its forward and
    backward: ``bX·M·K + bW·K·N + bdY·M·N`` with ``M`` = ``tokens`` and the recipe's bytes per
    element (``FP8_CAST_BYTES_PER_ELEMENT``)."""
    bx, bw, bdy = FP8_CAST_BYTES_PER_ELEMENT[normalize_fp8_recipe(recipe)]
    return bx * tokens * k + bw * k * n + bdy * tokens * n


def fp8_cast_traffic_bytes(workload: Workload, precision: str,
                           tp: int = 1) -> tuple[float, float]:
    """(bytes per token, bytes per micro-step) of the FP8 casts over all the model's layers on
    one GPU of a ``tp``-way group (:func:`fp8_cast_bytes` over :func:`fp8_linear_shapes`):
    the input and gradient casts grow with the tokens of the micro-batch, the weights' casts
    run once per micro-step. (0, 0) below FP8, with Transformer Engine (``te``) or without the
    architecture."""
    if normalize_precision(precision) != "fp8":
        return 0.0, 0.0
    bx, bw, bdy = FP8_CAST_BYTES_PER_ELEMENT[normalize_fp8_recipe(workload.fp8_recipe)]
    shapes = fp8_linear_shapes(workload, tp)
    layers = float(workload.num_layers or 0)
    return (layers * sum(bx * k + bdy * n for k, n in shapes),
            layers * sum(bw * k * n for k, n in shapes))


def fp8_cast_time_s(workload: Workload, hardware: Hardware, precision: str, tokens: float,
                    tp: int = 1, layer_share: float = 1.0) -> float:
    """Seconds of one micro-step's FP8 scale-and-cast kernels on one GPU: ``tokens`` of the
    micro-batch on that GPU, ``layer_share`` of the layers (1 / pp), ``tp``-way tensor
    parallelism; :func:`fp8_cast_traffic_bytes` at the attainable memory bandwidth, separate
    bandwidth-bound kernels that nothing hides (the ``fp8_casts`` operator class)."""
    per_token, per_step = fp8_cast_traffic_bytes(workload, precision, tp)
    if per_token <= 0 and per_step <= 0:
        return 0.0
    return (layer_share * (per_token * tokens + per_step)
            / (hardware.memory_bandwidth_bytes_per_s * memory_efficiency(hardware)))


def normalize_attention_kernel(name: str | None) -> str | None:
    """``fa2`` or ``fa3`` from the usual spellings (``sdpa`` is FA2, PyTorch's flash backend;
    ``te`` / ``cudnn`` are FA3-class); None stays None (FA2 where the attention is fused)."""
    if name is None or not str(name).strip():
        return None
    key = str(name).strip().lower()
    if key not in _ATTENTION_KERNEL_ALIASES:
        raise ValueError(f"unknown attention_kernel {name!r}; expected fa2, fa3, te, cudnn "
                         "or sdpa")
    return _ATTENTION_KERNEL_ALIASES[key]


def normalize_memory_format(name: str | None) -> str | None:
    """``contiguous`` or ``channels_last`` from the usual spellings (``nchw``,
    ``channels_first``, ``nhwc``, ``torch.channels_last``); None stays None (no
    convolutions stated: no layout transposes)."""
    if name is None or not str(name).strip():
        return None
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in _MEMORY_FORMAT_ALIASES:
        raise ValueError(f"unknown memory_format {name!r}; expected contiguous (NCHW) or "
                         "channels_last (NHWC)")
    return _MEMORY_FORMAT_ALIASES[key]


def normalize_mixed_precision(name: str | None) -> str | None:
    """``autocast``, ``master_weights`` or ``apex_o1`` (``MIXED_PRECISION_MODES``) from the
    usual spellings (``amp``, ``torch.amp``; ``apex_o2``, ``o2``, ``fp16_module``; ``o1``);
    None stays None (autocast)."""
    if name is None or not str(name).strip():
        return None
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    if key not in _MIXED_PRECISION_ALIASES:
        raise ValueError(f"unknown mixed_precision {name!r}; expected autocast (torch.amp), "
                         "master_weights (the model in 16 bits with fp32 master weights: "
                         "apex O2) or apex_o1 (apex AMP O1)")
    return _MIXED_PRECISION_ALIASES[key]


def mixed_precision_mode(workload: Workload | None) -> str:
    """How ``workload`` runs a 16-bit precision: ``autocast`` unless it says
    ``master_weights`` or ``apex_o1`` (which casts as autocast does, so every test for
    ``master_weights`` treats it as autocast)."""
    mode = workload.mixed_precision if workload is not None else None
    return normalize_mixed_precision(mode) or "autocast"


@functools.lru_cache(maxsize=256)  # pure; asked several times for every plan of a search
def architecture(gpu: str) -> str:
    """``volta|turing|ampere|ada|hopper|blackwell|cdna2|cdna3`` from a catalog GPU name,
    ``unknown`` for anything else."""
    name = gpu.strip().upper()
    for prefix, arch in ARCHITECTURE_PREFIXES:
        if name.startswith(prefix.upper()):
            return arch
    return "unknown"


def transformer_mfu_group(group: tuple[str, str]) -> tuple[str, str]:
    """The ``GENERATION_MFU`` key an (architecture, precision) pair takes its figure from
    (Blackwell takes Hopper's)."""
    arch, precision = group
    return _SAME_AS.get(arch, arch), precision


def tensor_efficiency(gpu: str, precision: str) -> float:
    """Share of the tensor-core dense peak a large GEMM-bound job reaches on ``gpu`` at
    ``precision``: ``COMPUTE_EFFICIENCY_TENSOR`` (Ampere's) × the generation's published MFU
    / Ampere's (``GENERATION_MFU``). fp16 takes bf16's figure; FP8 without its own figure
    takes the generation's 16-bit one × Hopper's fp8/bf16 ratio (0.83: FP8 reaches a smaller
    share of its doubled peak); a generation without figures keeps Ampere's 60%."""
    p = normalize_precision(precision)
    p = "bf16" if p == "fp16" else p
    arch = architecture(gpu)
    arch = _SAME_AS.get(arch, arch)
    ref = GENERATION_MFU[("ampere", "bf16")]
    mfu = GENERATION_MFU.get((arch, p))
    if mfu is None and p == "fp8":
        base = GENERATION_MFU.get((arch, "bf16"), ref)
        mfu = base * GENERATION_MFU[("hopper", "fp8")] / GENERATION_MFU[("hopper", "bf16")]
    if mfu is None:
        return COMPUTE_EFFICIENCY_TENSOR
    return COMPUTE_EFFICIENCY_TENSOR * mfu / ref


def attended_keys(layers: int, seq_len: float, window: int | None,
                  windowed_layers: int | None) -> float:
    """Keys per query summed over the layers, as the model FLOPs count attention: ``s`` for a
    layer attending to the whole sequence (the whole ``s × s`` square, as ``FlopCounterMode``
    counts causal attention), and for each of the ``windowed_layers`` (None: all) of a
    sliding ``window`` the band a windowed kernel computes counted the same way,
    ``min(s, 2·window)`` (a causal window's query sees ``window`` keys, and the square counts
    twice what causal attention computes)."""
    s = float(seq_len)
    if not window:
        return layers * s
    windowed = layers if windowed_layers is None else min(layers, windowed_layers)
    return (layers - windowed) * s + windowed * min(s, 2.0 * window)


def attention_flops_share(workload: Workload) -> float:
    """Share of a transformer's FLOPs in attention's two batched matmuls (``QKᵀ``, ``AV``):
    ``12·L·w·s`` per token forward+backward over the workload's FLOPs per token, ``w`` the
    query heads' width: the hidden size, or where ``qkv_width`` gives Q, K and V apart from
    it (heads × head_dim wider than the hidden size, latent attention) its query share
    ``qkv_width × a / (a + 2·k)`` (``a`` heads, ``k`` key/value heads); 0 where the shape
    (layers, hidden size, sequence length) is not known. Sliding-window layers
    (``sliding_window``) count ``s × min(s, 2·window)`` of their ``s²``
    (:func:`attended_keys`). Capped at 0.5."""
    layers, h, s = workload.num_layers, workload.hidden_size, workload.tokens_per_sample
    if not (layers and h and s) or workload.flops_per_sample <= 0:
        return 0.0
    width = float(h)
    if workload.qkv_width and workload.num_heads:
        a = float(workload.num_heads)
        width = workload.qkv_width * a / (a + 2.0 * float(workload.num_kv_heads or a))
    keys = attended_keys(layers, s, workload.sliding_window, workload.sliding_window_layers)
    return min(0.5, 12.0 * width * s * keys / workload.flops_per_sample)


def attention_kernel(workload: Workload) -> str | None:
    """The fused attention kernel the workload runs (``ATTENTION_KERNELS``): its
    ``attention_kernel``, else ``fa2`` where its attention is fused (SDPA, the default); None
    for eager attention (``bmm`` GEMMs at the linear layers' efficiency)."""
    if workload.attention == "eager":
        return None
    return workload.attention_kernel or "fa2"


def attention_efficiency(workload: Workload, hardware: Hardware,
                         precision: str) -> float | None:
    """Share of the 16-bit dense peak the workload's attention kernel reaches on ``hardware``
    (``ATTENTION_KERNEL_EFFICIENCY``), or None where there is no figure (the attention FLOPs
    then take the linear layers' efficiency). Only on NVIDIA tensor cores at 16 bit or FP8
    (whose attention runs at bf16)."""
    kernel = attention_kernel(workload)
    p = normalize_precision(precision)
    if kernel is None or p not in ("bf16", "fp16", "fp8") or vendor.is_amd(hardware.gpu):
        return None
    if not uses_tensor_cores(hardware.peak_flops_per_s, "bf16" if p == "fp8" else p):
        return None
    arch = architecture(hardware.gpu)
    return ATTENTION_KERNEL_EFFICIENCY.get((_SAME_AS.get(arch, arch), kernel))


def matmul_efficiency(hardware: Hardware, precision: str) -> tuple[float, str]:
    """(share of the dense peak the matmuls reach, where the figure comes from): on the tensor
    cores the vendor's attainable share (:func:`.vendor.attainable_fraction`, AMD) or the
    generation's (:func:`tensor_efficiency`, NVIDIA); off them ``COMPUTE_EFFICIENCY_SIMT``."""
    if uses_tensor_cores(hardware.peak_flops_per_s, precision):
        eff = vendor.attainable_fraction(hardware.gpu)
        if eff is not None:
            return eff, "the vendor's attainable share of peak (perfmodel.vendor)"
        return (tensor_efficiency(hardware.gpu, precision),
                "compute.GENERATION_MFU of the GPU's generation")
    return COMPUTE_EFFICIENCY_SIMT, "compute.COMPUTE_EFFICIENCY_SIMT (no tensor cores)"


def _tensor_time_s(flops: float, hardware: Hardware, precision: str) -> float:
    """Seconds for ``flops`` of matmuls at :func:`matmul_efficiency` of the dense peak."""
    peak = peak_flops_per_s(hardware.peak_flops_per_s, precision)
    return flops / (peak * matmul_efficiency(hardware, precision)[0])


def memory_efficiency(hardware: Hardware) -> float:
    """Share of datasheet memory bandwidth streaming kernels reach on ``hardware``: the vendor's
    measured figure where there is one (AMD), else ``MEMORY_EFFICIENCY``."""
    frac = vendor.attainable_memory_fraction(hardware.gpu)
    return MEMORY_EFFICIENCY if frac is None else frac


def attention_term(workload: Workload, hardware: Hardware,
                   precision: str) -> tuple[float, str] | None:
    """(log of how much the attention kernel's own figure speeds up the matmul time against
    timing attention at the linear layers' efficiency, the figure in words), or None where
    the workload has no attention share or the GPU no kernel figure. Negative: the kernel
    is slower than the GEMMs (FlashAttention-2 on Hopper). For the explanation of a
    cross-GPU prediction (the difference between target and source moves it)."""
    p = normalize_precision(precision)
    eff = attention_efficiency(workload, hardware, p)
    if eff is None or attention_flops_share(workload) <= 0:
        return None
    with_kernel = matmul_time_s(workload, hardware, p)
    without = matmul_time_s(workload, hardware, p, attention_kernel_figure=False)
    linear = matmul_efficiency(hardware, "bf16" if p == "fp8" else p)[0]
    return (math.log(without / with_kernel),
            f"attention ({attention_kernel(workload)}, {attention_flops_share(workload):.0%} of "
            f"the FLOPs) at {eff:.0%} of {hardware.gpu}'s peak against the linear layers' "
            f"{linear:.0%}")


def matmul_time_s(workload: Workload, hardware: Hardware, precision: str,
                  attention_kernel_figure: bool = True) -> float:
    """Seconds per sample of the FLOP-heavy kernels at the precision's dense peak, at the
    efficiency the GPU's generation reaches (:func:`tensor_efficiency`).

    FP8 (Transformer Engine, torchao float8) runs the linear layers in FP8 and attention's
    matmuls in bf16 (FlashAttention), so the attention share (:func:`attention_flops_share`)
    is timed at bf16: the attainable speed-up over bf16 is below the 2× of the peaks. The
    linear layers run at the speed of the workload's scaling recipe
    (:func:`fp8_recipe_efficiency`; ``rowwise_with_gw_hp``'s weight-gradient third at bf16);
    their scale-and-cast kernels are timed apart (:func:`fp8_cast_time_s`).

    Attention's share runs at its fused kernel's efficiency on the GPU's generation
    (:func:`attention_efficiency`: FlashAttention-2 reaches 60% of an A100's peak but 35% of an
    H100's), where there is a figure; otherwise at the linear layers'."""
    flops = workload.flops_per_sample
    p = normalize_precision(precision)
    fp8 = p == "fp8"
    attn_eff = (attention_efficiency(workload, hardware, p) if attention_kernel_figure
                else None)
    a = attention_flops_share(workload) if fp8 or attn_eff is not None else 0.0
    linear_p = "fp8" if fp8 else p
    attn_p = "bf16" if fp8 else p
    linear = _tensor_time_s(flops * (1.0 - a), hardware, linear_p)
    if fp8:
        recipe = normalize_fp8_recipe(workload.fp8_recipe)
        linear /= fp8_recipe_efficiency(recipe)
        if recipe == "rowwise_with_gw_hp":
            # The weight-gradient GEMM (a third of the linear FLOPs) runs in bf16.
            linear = (2.0 * linear + _tensor_time_s(flops * (1.0 - a), hardware, "bf16")) / 3.0
    if attn_eff is None:
        attention = _tensor_time_s(flops * a, hardware, attn_p)
    else:
        attention = flops * a / (peak_flops_per_s(hardware.peak_flops_per_s, attn_p)
                                 * attn_eff)
    return linear + attention


def traffic_time_s(workload: Workload, hardware: Hardware, precision: str) -> float:
    """Seconds per sample to move the sample's DRAM traffic at the memory bandwidth."""
    return (memory_traffic_bytes_per_sample(workload, precision)
            / (hardware.memory_bandwidth_bytes_per_s * memory_efficiency(hardware)))


def conv_transposes(workload: Workload, hardware: Hardware, precision: str) -> bool:
    """Whether the workload's convolutions transpose their activations on ``hardware`` at
    ``precision``: some run channels-first (a measured ``nchw_conv_bytes_per_sample`` above
    0, or else a ``memory_format`` of ``contiguous``: NCHW) and the convolutions run on
    tensor cores (fp16/bf16 from Volta, TF32 from Ampere: :func:`.precision.
    uses_tensor_cores`), which work in NHWC. FP32 on SIMT units works in NCHW as it is, and
    ``channels_last`` (NHWC) needs no transpose; a workload that states neither is not
    known to run convolutions."""
    measured = workload.nchw_conv_bytes_per_sample
    if measured is not None:
        if measured <= 0:
            return False
    elif workload.memory_format != "contiguous":
        return False
    return uses_tensor_cores(hardware.peak_flops_per_s, normalize_precision(precision))


def transpose_bytes_per_sample(workload: Workload, hardware: Hardware,
                               precision: str) -> float:
    """DRAM bytes per sample of the NCHW <-> NHWC transposes around tensor-core
    convolutions (:func:`conv_transposes`; 0 where there are none):
    ``TRANSPOSE_BYTES_PER_ACTIVATION_BYTE`` × the channels-first convolutions' operands, as
    a tracked run measured them (``nchw_conv_bytes_per_sample``: every forward call's input
    and output, the bytes the constant's count is per), else the stored activations at
    ``precision`` (measured, or estimated: :func:`activation_bytes_per_sample`), which a
    convolutional network's are about. Both scale with the activations' element size."""
    if not conv_transposes(workload, hardware, precision):
        return 0.0
    measured = workload.nchw_conv_bytes_per_sample
    if measured is not None:
        p, own = normalize_precision(precision), normalize_precision(workload.precision)
        return TRANSPOSE_BYTES_PER_ACTIVATION_BYTE * measured * (ACTIVATION_BYTES[p]
                                                                 / ACTIVATION_BYTES[own])
    return (TRANSPOSE_BYTES_PER_ACTIVATION_BYTE
            * activation_bytes_per_sample(workload, precision)[0])


def transpose_time_s(workload: Workload, hardware: Hardware, precision: str) -> float:
    """Seconds per sample of the layout transposes (:func:`transpose_bytes_per_sample`) at
    the attainable memory bandwidth: separate bandwidth-bound kernels, nothing hides them."""
    return (transpose_bytes_per_sample(workload, hardware, precision)
            / (hardware.memory_bandwidth_bytes_per_s * memory_efficiency(hardware)))


def at_length(workload: Workload, tokens: float) -> Workload:
    """``workload`` as one sample padded to ``tokens`` costs (``sequence_bins``:
    :func:`.sequence_bins.rescaled`), with attention's FLOP share and the activation
    formula's bytes ratio between the two lengths from the architecture."""
    plain = replace(workload, sequence_bins=None)
    shorter = replace(plain, tokens_per_sample=float(tokens))
    full, part = (formula_activation_bytes_per_sample(w, w.precision) for w in (plain, shorter))
    return sequence_bins.rescaled(plain, tokens, attention_flops_share(plain),
                                  part / full if full and part else None)


def hidden_traffic_share(workload: Workload, precision: str | None = None) -> float:
    """``h``, the share of the sample's traffic the matmul and convolution kernels move
    themselves (hidden under their arithmetic): measured where the workload gives both its
    matmul traffic and its whole traffic (a tracked run's profile; a ratio, the same at any
    precision) and is not a transformer described by its architecture, else
    ``MATMUL_HIDDEN_TRAFFIC_SHARE``. A described transformer keeps the default: its matmul
    efficiency (``GENERATION_MFU``) is a whole-step figure derived with it. At a
    ``precision`` the workload's autocast figures serve (:func:`amp_traffic`), their share."""
    total = workload.memory_traffic_bytes_per_sample
    matmul = workload.matmul_traffic_bytes_per_sample
    amp = amp_traffic(workload, precision) if precision is not None else None
    if amp is not None and amp[1] is not None:
        total, matmul = amp
    if (total and total > 0 and matmul is not None and matmul >= 0
            and formula_activation_bytes_per_sample(workload, "bf16") is None):
        return min(1.0, matmul / total)
    return MATMUL_HIDDEN_TRAFFIC_SHARE


def per_sample_time_prior_s(workload: Workload, hardware: Hardware, precision: str) -> float:
    """``b``: seconds per sample per GPU from the roofline, uncalibrated:
    ``max(T_matmul, h·T_traffic) + (1 − h)·T_traffic + T_transpose`` with ``h`` the share of
    traffic the matmul kernels do themselves (:func:`hidden_traffic_share`: hidden under
    their arithmetic when they are compute-bound) and ``T_transpose`` the layout transposes
    of NCHW tensor-core convolutions (:func:`transpose_time_s`, 0 for most workloads).
    With ``sequence_bins``, the share-weighted mean over the padded lengths
    (:mod:`.sequence_bins`).
    """
    if workload.sequence_bins:
        return sequence_bins.binned(
            lambda w: per_sample_time_prior_s(w, hardware, precision), workload, at_length)
    compute = matmul_time_s(workload, hardware, precision)
    memory = traffic_time_s(workload, hardware, precision)
    hidden = hidden_traffic_share(workload, precision)
    return (max(compute, hidden * memory) + (1.0 - hidden) * memory
            + transpose_time_s(workload, hardware, precision))


#: FP32 lanes per SM (NVIDIA) or compute unit (AMD) that the catalog's FP32 peak counts
#: (``fp32 = SMs × lanes × 2 × boost clock``), by GPU name prefix (the first that matches
#: wins), else ``FP32_LANES_DEFAULT``. The datasheet FP32 peak doubled per SM from GA100 to
#: GA10x, Ada, Hopper and Blackwell while the SM's schedulers, load/store units and issue rate
#: did not, so the FP32 peak alone counts those SMs twice as fast for latency-bound kernels.
#: Each figure is the datasheet's own arithmetic: V100 80 SMs × 64 × 2 × 1.53 GHz = 15.7 TF,
#: T4 40 × 64 × 2 × 1.59 = 8.1, A100 108 × 64 × 2 × 1.41 = 19.5 (GA100: 64 FP32 cores per SM,
#: NVIDIA A100 whitepaper); A10 72 × 128 × 2 × 1.695 = 31.2 (GA102: 128, "2× FP32", NVIDIA
#: Ampere GA102 whitepaper); L4 58 × 128 × 2 × 2.04 = 30.3 (Ada); H100 SXM5 132 × 128 × 2 ×
#: 1.98 = 66.9 (GH100: 128 FP32 cores per SM, NVIDIA H100 whitepaper); B200 148 × 128 × 2 ×
#: 1.98 = 75; MI250X 220 CUs × 64 × 2 × 1.7 = 47.9 (CDNA2 vector FP32); MI300X 304 × 128 × 2
#: × 2.1 = 163.4 (CDNA3 counts dual-issued FP32: AMD CDNA3 whitepaper).
FP32_LANES_PER_SM = (
    ("V100", 64), ("T4", 64), ("A100", 64), ("A10G", 128), ("A10", 128), ("A40", 128),
    ("RTX-A6000", 128), ("RTX-3090", 128), ("L40S", 128), ("L4", 128), ("RTX-4090", 128),
    ("H100", 128), ("H200", 128), ("B200", 128), ("MI300X", 128), ("MI325X", 128),
    ("MI250X", 64),
)
FP32_LANES_DEFAULT = 64


@functools.lru_cache(maxsize=256)  # pure; asked for every plan of a search
def fp32_lanes_per_sm(gpu: str) -> int:
    """FP32 lanes per SM / CU the GPU's FP32 peak counts (``FP32_LANES_PER_SM``)."""
    name = gpu.strip().upper()
    for prefix, lanes in FP32_LANES_PER_SM:
        if name.startswith(prefix.upper()):
            return lanes
    return FP32_LANES_DEFAULT


def latency_rate_flops_per_s(hardware: Hardware) -> float:
    """What latency-bound work scales with across GPU types: SM count × clock, as the FP32
    peak counts it at 64 lanes per SM (``FP32 peak × 64 / fp32_lanes_per_sm``: a Volta /
    GA100 SM's FP32 rate, so an H100's 67 TF count as 33.5 against an A100's 19.5, SMs ×
    clock 1.72× and not the peaks' 3.4×). A power limit lowers it with the clock
    (:func:`power_capped` scales the FP32 peak)."""
    peaks = hardware.peak_flops_per_s
    fp32 = float(peaks.get("fp32") or peak_flops_per_s(peaks, "fp32"))
    return fp32 * FP32_LANES_DEFAULT / fp32_lanes_per_sm(hardware.gpu)


def latency_time_s(fixed_flops: float, per_sample_flops: float, micro_batch: float,
                   hardware: Hardware) -> float:
    """Seconds of latency-bound work in one micro-step, given in FP32-rate FLOP-equivalents
    (measured time beyond the roofline × the measuring GPU's :func:`latency_rate_flops_per_s`)."""
    if fixed_flops <= 0 and per_sample_flops <= 0:
        return 0.0
    return (fixed_flops + per_sample_flops * micro_batch) / latency_rate_flops_per_s(hardware)


def power_capped_clock(limit_w: float | None, tdp_w: float) -> float:
    """Share of the clock (so of every FLOP/s figure) a power limit below the board's TDP
    leaves: dynamic power ∝ f·V² with V ∝ f in the DVFS range, so f ∝ P^(1/3) (a first-order
    physical estimate, not a fit; memory bandwidth is left as it is)."""
    if not limit_w or not tdp_w or limit_w >= tdp_w:
        return 1.0
    return (limit_w / tdp_w) ** (1.0 / 3.0)


def power_capped(hardware: Hardware, limit_w: float | None,
                 tdp_w: float | None = None) -> Hardware:
    """``hardware`` with its FLOP/s at the clock :func:`power_capped_clock` gives
    ``limit_w`` on a board of ``tdp_w`` (default: ``hardware.tdp_w``). A ``hardware`` already
    capped is rescaled from its own limit, so capping twice (``predict --power-limit-w`` and
    an observation's ``power_limit_w``) gives the second limit, not the product."""
    tdp = tdp_w or hardware.tdp_w
    if not limit_w or not tdp:
        return hardware
    clock = power_capped_clock(limit_w, tdp) / power_capped_clock(hardware.power_limit_w, tdp)
    if clock == 1.0 and hardware.power_limit_w == limit_w:
        return hardware
    return replace(hardware, tdp_w=tdp, power_limit_w=float(limit_w),
                   peak_flops_per_s={p: v * clock for p, v in hardware.peak_flops_per_s.items()})


#: Streaming multiprocessors (NVIDIA) or compute units (AMD) per GPU, by name prefix (the
#: first that matches wins), from the vendors' whitepapers and datasheets: V100 80 (GV100),
#: T4 40, A100 108 (GA100), A10 72 and A10G 80 (GA102: the catalog's 31.2 and 35 TF FP32 at
#: 128 lanes, 1.695 / 1.71 GHz), A40 and RTX A6000 84, RTX 3090 82, L4 58, L40S 142, RTX 4090
#: 128 (AD102), H100 PCIe 114, H100 SXM5 and H200 132 (GH100), B200 148, MI300X and MI325X
#: 304 CUs, MI250X 220 (two GCDs of 110). Unknown GPUs take ``SMS_DEFAULT`` (an A100's).
SMS_PER_GPU = (
    ("V100", 80), ("T4", 40), ("A100", 108), ("A10G", 80), ("A10", 72), ("A40", 84),
    ("RTX-A6000", 84), ("RTX-3090", 82), ("L40S", 142), ("L4", 58), ("RTX-4090", 128),
    ("H100-PCIE", 114), ("H100", 132), ("H200", 132), ("B200", 148), ("MI300X", 304),
    ("MI325X", 304), ("MI250X", 220),
)
SMS_DEFAULT = 108
#: Output tile (rows × columns) one thread block of a GEMM computes, by the path it takes,
#: from CUTLASS's default GEMM configurations (``cutlass/gemm/device/
#: default_gemm_configuration.h``, ``ThreadblockShape``): plain FP32 on the SIMT units
#: (``OpClassSimt``, every architecture: 128 × 128 × 8, eight warps of 32 × 64) and the
#: tensor cores (``OpClassTensorOp``: 128 × 256 × 32 on Volta's HMMA and Turing, 128 × 256 × 64
#: on Ampere, TF32 included, and on Ada's FP8); NVIDIA's "Matrix Multiplication Background
#: User's Guide" (Tile Quantization, Wave Quantization) takes 256 × 128 on an A100, the same
#: area. A tensor-core tile holds twice a SIMT one's outputs: its SM computes ~8× faster
#: (V100 FP16, A100 TF32 against their FP32), so each operand element it loads must serve
#: more outputs (the guide: larger tiles, more data reuse). AMD's matrix
#: cores take the tensor-core tile (no CUTLASS there). A GEMM of ``T`` tiles on ``S`` SMs
#: runs in ``ceil(T / S)`` waves, each as long as one tile's arithmetic (``2 × tile × K``
#: FLOPs at one SM's share of the path's attainable peak), however few tiles the last wave
#: holds (Habitat, Yu et al. 2021: kernel time = waves × time per wave).
GEMM_TILE_SIMT = (128, 128)
GEMM_TILE_TENSOR = (128, 256)


def gemm_tile_elements(hardware: Hardware, precision: str) -> int:
    """Output elements of one thread block's tile on the path ``precision``'s GEMMs take on
    ``hardware``: ``GEMM_TILE_TENSOR`` where the precision runs on a matrix unit
    (:func:`.precision.uses_tensor_cores`: fp16, bf16, FP8, and TF32 where the GPU has it),
    ``GEMM_TILE_SIMT`` for plain FP32 (and TF32 on a GPU without it, V100 and T4)."""
    rows, cols = (GEMM_TILE_TENSOR if uses_tensor_cores(hardware.peak_flops_per_s, precision)
                  else GEMM_TILE_SIMT)
    return rows * cols


#: Share of a wave the last, partial wave of a GEMM costs beyond what its tiles' arithmetic
#: alone would, on average: with the tiles' count uniformly distributed over a wave, the idle
#: part of the last wave is a half. The roofline (``matmul_time_s``) charges a GEMM's FLOPs
#: as if every wave were full; this is its expected tail, per matrix product. A product
#: smaller than one wave (a recurrent cell's ``[batch × hidden] @ [hidden × 4·hidden]``: at
#: batch 128 and hidden 1,024, 16 tensor-core tiles on an A100's 108 SMs, 32 SIMT tiles on a
#: V100's 80) loses ``1 − tiles / SMs`` of its wave, more than a half, so for recurrent
#: networks it is a lower bound.
WAVE_TAIL_SHARE = 0.5


@functools.lru_cache(maxsize=256)  # pure; asked for every plan of a search
def sm_count(gpu: str) -> int:
    """SMs (CUs) of ``gpu`` (``SMS_PER_GPU``, else ``SMS_DEFAULT``)."""
    name = gpu.strip().upper()
    for prefix, sms in SMS_PER_GPU:
        if name.startswith(prefix.upper()):
            return sms
    return SMS_DEFAULT


def wave_tail_time_s(workload: Workload | None, hardware: Hardware, precision: str) -> float:
    """Seconds per micro-step that the GEMMs' last, partial waves cost beyond the roofline
    (wave quantisation): ``WAVE_TAIL_SHARE`` of one wave per matrix product, a wave being one
    tile's ``2·K`` FLOPs per element (:func:`gemm_tile_elements`: the SIMT or tensor-core
    tile of the path ``precision`` takes) at one SM's share (``1 / sm_count``) of that path's
    peak at its attainable share (:func:`matmul_efficiency`), summed over the
    products by the profile's ``gemm_reduction_per_micro_step`` (Σ K over the forward's
    products and their data gradients; a recurrent network's at every time step, each step
    waiting for the one before; products that run side by side, a bidirectional layer's two
    directions, once: their tiles fill the same waves). Batch-independent: what a small-batch
    product loses does not shrink with fewer rows. 0 where the profile did not record it."""
    reduction = workload.gemm_reduction_per_micro_step if workload is not None else None
    if not reduction or reduction <= 0:
        return 0.0
    p = normalize_precision(precision)
    per_sm = (peak_flops_per_s(hardware.peak_flops_per_s, p)
              * matmul_efficiency(hardware, p)[0] / sm_count(hardware.gpu))
    return WAVE_TAIL_SHARE * 2.0 * gemm_tile_elements(hardware, p) * reduction / per_sm


def weight_bytes_per_param(precision: str) -> int:
    """Bytes of the weights the forward/backward reads (16-bit copies in mixed precision)."""
    return 2 if is_mixed(precision) else 4


def kernel_count(workload: Workload, precision: str | None = None
                 ) -> tuple[float | None, str]:
    """(operators one forward+backward of a micro-batch dispatches at ``precision``, where
    the number comes from): the profile's count (``measured``), under CUDA autocast
    (``amp_kernels_per_micro_step``: the casts autocast launches included) for a mixed
    ``precision`` of an fp32/TF32 workload (:func:`amp_kernels`); for a transformer whose
    architecture is given, ``KERNELS_PER_LAYER_STEP`` × layers + ``KERNELS_OUTSIDE_LAYERS``
    (``architecture``); else (None, ``flat``): the flat ``MICRO_STEP_OVERHEAD_S`` applies.
    Without ``precision``, the count at the workload's own."""
    if workload.kernels_per_micro_step and workload.kernels_per_micro_step > 0:
        amp = amp_kernels(workload, precision) if precision is not None else None
        return float(amp if amp is not None else workload.kernels_per_micro_step), "measured"
    if formula_activation_bytes_per_sample(workload, "bf16") is not None:
        return (float(KERNELS_PER_LAYER_STEP * int(workload.num_layers)
                      + KERNELS_OUTSIDE_LAYERS), "architecture")
    return None, "flat"


def amp_kernels(workload: Workload, precision: str) -> float | None:
    """Kernels per micro-step of an fp32/TF32 workload at a mixed ``precision`` (fp16, bf16,
    FP8) from its measured ``amp_kernels_per_micro_step``, or None where there is none or no
    conversion is asked (a workload measured 16-bit counted its casts as it ran them; a
    ``master_weights`` job runs a 16-bit model, which autocast does not cast operator by
    operator; docs/metrics.md#artifacts-and-profilejson)."""
    amp = workload.amp_kernels_per_micro_step
    if (not amp or amp <= 0 or not is_mixed(normalize_precision(precision))
            or is_mixed(normalize_precision(workload.precision))
            or mixed_precision_mode(workload) == "master_weights"):
        return None
    return float(amp)


def apex_o1_host_s(workload: Workload | None, precision: str,
                   kernels_per_micro_step: float | None) -> float:
    """Host seconds apex AMP O1's Python wrappers add to one micro-step of ``workload`` at a
    16-bit ``precision`` (0 otherwise): ``APEX_O1_WRAPPED_CALLS_PER_KERNEL`` of the counted
    kernels (without a count, the ``MICRO_STEP_OVERHEAD_S``'s worth of them) each
    ``APEX_O1_EXTRA_OPERATORS_PER_CALL`` × ``KERNEL_DISPATCH_S``. CPU time, as the dispatch."""
    if (workload is None or mixed_precision_mode(workload) != "apex_o1"
            or not is_mixed(normalize_precision(precision))):
        return 0.0
    kernels = (kernels_per_micro_step if kernels_per_micro_step and kernels_per_micro_step > 0
               else MICRO_STEP_OVERHEAD_S / KERNEL_DISPATCH_S)
    return (kernels * APEX_O1_WRAPPED_CALLS_PER_KERNEL * APEX_O1_EXTRA_OPERATORS_PER_CALL
            * KERNEL_DISPATCH_S)


def dispatch_time_s(workload: Workload | None, precision: str,
                    kernels_per_micro_step: float | None) -> float:
    """Host-side seconds of one micro-step: :func:`micro_step_overhead_s` of the kernels plus
    apex O1's wrappers where the job runs them (:func:`apex_o1_host_s`)."""
    return (micro_step_overhead_s(kernels_per_micro_step)
            + apex_o1_host_s(workload, precision, kernels_per_micro_step))


def micro_step_overhead_s(kernels_per_micro_step: float | None) -> float:
    """Host-side seconds of one micro-step, the same on every GPU: the counted kernels (operators
    one forward+backward dispatches in eager PyTorch) × ``KERNEL_DISPATCH_S`` each, dispatched one
    after another; without a count, the flat ``MICRO_STEP_OVERHEAD_S``."""
    if kernels_per_micro_step and kernels_per_micro_step > 0:
        return kernels_per_micro_step * KERNEL_DISPATCH_S
    return MICRO_STEP_OVERHEAD_S


def weight_passes(workload: Workload | None, precision: str) -> float:
    """Bytes of weight and gradient traffic per parameter in one micro-step at ``precision``:
    the workload's measured ``weight_traffic_bytes_per_micro_step`` ÷ its params (rescaled
    by the weight element size from its own precision), else 3 passes (read twice, forward
    and backward, gradient written) of :func:`weight_bytes_per_param`. Measured, a recurrent
    network's is hundreds of passes: its cells read their weights at every time step."""
    w = weight_bytes_per_param(precision)
    measured = workload.weight_traffic_bytes_per_micro_step if workload is not None else None
    if measured and workload.params > 0:
        return measured / workload.params * w / weight_bytes_per_param(workload.precision)
    return 3.0 * w


def weight_traffic_time_s(params_per_gpu: float, hardware: Hardware, precision: str,
                          workload: Workload | None = None) -> float:
    """Seconds per micro-step to move the weights and their gradients at ``hardware``'s
    memory bandwidth (:func:`weight_passes` bytes per parameter)."""
    traffic = params_per_gpu * weight_passes(workload, precision)
    return traffic / (hardware.memory_bandwidth_bytes_per_s * memory_efficiency(hardware))


def fixed_time_prior_s(params_per_gpu: float, hardware: Hardware, precision: str,
                       kernels_per_micro_step: float | None = None,
                       workload: Workload | None = None) -> float:
    """``a``: seconds per micro-step independent of batch: the host-side overhead
    (:func:`dispatch_time_s`, from the kernel count where there is one) + the weight
    traffic (:func:`weight_traffic_time_s`) + the GEMMs' wave tails
    (:func:`wave_tail_time_s`, where the profile recorded their reductions)."""
    return (dispatch_time_s(workload, precision, kernels_per_micro_step)
            + weight_traffic_time_s(params_per_gpu, hardware, precision, workload)
            + wave_tail_time_s(workload, hardware, precision))


def is_trust_ratio_optimizer(name: str | None) -> bool:
    """True for a LAMB optimizer by its class name (``LAMB``, ``Lamb``, ``FusedLAMB``,
    ``JITLamb``, ``DistributedFusedLAMB``)."""
    return bool(name) and "lamb" in str(name).strip().lower()


def optimizer_bytes_per_param(optimizer_state_bytes_per_param: float, precision: str,
                              workload: Workload | None = None) -> float:
    """DRAM bytes per updated parameter of one optimizer step: read and write the fp32
    weight and its ``optimizer_state_bytes_per_param`` of state, read the gradient, plus
    what the workload's optimizer, clipping and mixed precision add
    (``TRUST_RATIO_EXTRA_BYTES_PER_PARAM``, ``GRAD_CLIP_BYTES_PER_PARAM``,
    ``MASTER_WEIGHT_BYTES_PER_PARAM`` or ``AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM``). Adam
    in fp32: 28; LAMB with clipping in fp16 with master weights (DeepLearningExamples'
    Transformer-XL): 72."""
    per_param = 2 * (4 + optimizer_state_bytes_per_param) + 4
    if workload is not None and is_trust_ratio_optimizer(workload.optimizer):
        per_param += TRUST_RATIO_EXTRA_BYTES_PER_PARAM
    if workload is not None and workload.grad_clip:
        per_param += GRAD_CLIP_BYTES_PER_PARAM
    if is_mixed(precision):
        per_param += (MASTER_WEIGHT_BYTES_PER_PARAM
                      if mixed_precision_mode(workload) == "master_weights"
                      else AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM)
    return per_param


def optimizer_step_extras(workload: Workload) -> tuple[str, ...]:
    """What the workload says its optimizer step does beyond Adam's passes, in words (for the
    prediction's assumptions): LAMB's trust ratio, gradient clipping, master weights."""
    parts = []
    if is_trust_ratio_optimizer(workload.optimizer):
        parts.append(f"LAMB's trust ratio +{TRUST_RATIO_EXTRA_BYTES_PER_PARAM:g}")
    if workload.grad_clip:
        parts.append(f"global-norm gradient clipping +{GRAD_CLIP_BYTES_PER_PARAM:g}")
    if mixed_precision_mode(workload) == "master_weights":
        parts.append(f"fp32 master weights at 16 bits +{MASTER_WEIGHT_BYTES_PER_PARAM:g}")
    return tuple(parts)


def optimizer_time_prior_s(params_updated: float, optimizer_state_bytes_per_param: float,
                           hardware: Hardware, precision: str,
                           workload: Workload | None = None) -> float:
    """Seconds for one optimizer step over ``params_updated`` parameters (memory-bound):
    :func:`optimizer_bytes_per_param` each at the memory bandwidth."""
    per_param = optimizer_bytes_per_param(optimizer_state_bytes_per_param, precision, workload)
    return params_updated * per_param / (hardware.memory_bandwidth_bytes_per_s
                                         * memory_efficiency(hardware))


#: How an optimizer's ``step()`` runs on the GPU (``Workload.optimizer_impl``): ``for-loop``
#: (a loop over the parameter tensors launching each one's kernels: ``torch.optim`` before
#: PyTorch 2.0, or ``foreach=False``), ``foreach`` (``torch._foreach_*`` kernels over lists of
#: tensors: ``torch.optim``'s CUDA default from 2.0) or ``fused`` (one kernel per list:
#: ``fused=True``, apex's ``FusedAdam``/``FusedLAMB``).
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
_OPTIMIZER_IMPL_ALIASES = {"for-loop": "for-loop", "for_loop": "for-loop", "forloop": "for-loop",
                           "loop": "for-loop", "single_tensor": "for-loop",
                           "single-tensor": "for-loop", "foreach": "foreach",
                           "multi_tensor": "foreach", "multi-tensor": "foreach",
                           "fused": "fused"}
#: Host seconds per parameter tensor of a ``for-loop`` optimizer step on CUDA, by optimizer
#: class: PyTorch's own timing of ``step()`` over ResNet-101's 314 parameter tensors on CUDA,
#: for-loop against the multi-tensor rewrite (pytorch/pytorch#45299, 2020: Adam 42.69 ms,
#: AdamW 51.38, SGD 6.28, RMSprop 28.63, ASGD 21.67, Adamax 55.60 ms), ÷ 314. The GPU work of
#: those 44.5 M parameters is about 2 ms of it; the rest is the loop launching some eight
#: small kernels a tensor from Python, which the GPU runs faster than the host issues them.
#: An optimizer class not timed there takes Adam's. ``foreach`` and ``fused`` launch a few
#: kernels per list of tensors: no per-tensor term.
OPTIMIZER_LOOP_S_PER_TENSOR = {"Adam": 42.69e-3 / 314, "AdamW": 51.38e-3 / 314,
                               "SGD": 6.28e-3 / 314, "RMSprop": 28.63e-3 / 314,
                               "ASGD": 21.67e-3 / 314, "Adamax": 55.60e-3 / 314}


def normalize_optimizer_impl(name: str | None) -> str | None:
    """``for-loop``, ``foreach`` or ``fused`` (``OPTIMIZER_IMPLS``) from the usual spellings;
    None stays None (not stated: no per-tensor term)."""
    if name is None or not str(name).strip():
        return None
    key = str(name).strip().lower()
    if key not in _OPTIMIZER_IMPL_ALIASES:
        raise ValueError(f"unknown optimizer_impl {name!r}; expected for-loop, foreach or "
                         "fused")
    return _OPTIMIZER_IMPL_ALIASES[key]


def optimizer_host_time_s(workload: Workload, tensor_share: float = 1.0) -> float:
    """Host seconds of one optimizer step that loops over its parameter tensors
    (``optimizer_impl`` ``for-loop``): ``optimizer_param_tensors`` × ``tensor_share`` (the
    part of them this GPU's process updates) × ``OPTIMIZER_LOOP_S_PER_TENSOR`` of its
    optimizer class (Adam's where not timed); 0 for ``foreach``/``fused``, or where the
    implementation or the tensor count is not known. The same on every GPU (CPU time)."""
    tensors = workload.optimizer_param_tensors
    if normalize_optimizer_impl(workload.optimizer_impl) != "for-loop" or not tensors:
        return 0.0
    by_name = {k.lower(): v for k, v in OPTIMIZER_LOOP_S_PER_TENSOR.items()}
    per_tensor = by_name.get(str(workload.optimizer or "Adam").strip().lower(),
                             OPTIMIZER_LOOP_S_PER_TENSOR["Adam"])
    return float(tensors) * tensor_share * per_tensor


#: The operator classes a micro-step's time is split into for explaining a transfer between
#: GPU types (:func:`operator_class_times_s`), each scaling with its own GPU figure.
OPERATOR_CLASSES = {
    "matmuls": "matmuls and convolutions (dense peak of the precision × its efficiency, or "
               "their operands' traffic where that takes longer; the GEMMs' partial last "
               "waves at one SM's share of that peak)",
    "attention": "attention's fused kernel (its own share of the 16-bit peak per generation)",
    "memory": "memory-bound work: normalisation, element-wise, weight and gradient traffic "
              "(memory bandwidth)",
    "fp8_casts": "FP8 scaling and casting of the linear layers' inputs, weights and output "
                 "gradients (torchao's separate amax and cast kernels; memory bandwidth, "
                 "growing against the GEMMs as tensor parallelism shrinks their shapes)",
    "transposes": "NCHW <-> NHWC transposes around tensor-core convolutions that run "
                  "channels-first: a contiguous (NCHW) network's, every Conv1d (memory "
                  "bandwidth; none in channels_last or on FP32 SIMT units)",
    "latency": "latency-bound kernels (SM count × clock: the FP32 peak at 64 lanes per SM)",
    "dispatch": "host-side kernel dispatch (CPU time, the same on every GPU)",
}


def operator_class_times_s(workload: Workload, hardware: Hardware, precision: str,
                           micro_batch: float, compute_scale: float = 1.0,
                           fixed_scale: float = 1.0, overhead_scale: float | None = None,
                           latency_flops: tuple[float, float] = (0.0, 0.0)
                           ) -> dict[str, float]:
    """Seconds of one single-GPU micro-step of ``micro_batch`` per operator class
    (``OPERATOR_CLASSES``), as :mod:`.step` puts it together: the roofline's per-sample time
    (:func:`per_sample_time_prior_s`): the matmul kernels' part (their arithmetic, or their
    own operands' traffic where that is longer) to the matmuls and attention, the rest of
    the traffic and the weights' to memory; the layout transposes of NCHW tensor-core
    convolutions (:func:`transpose_time_s`); the FP8 casts (:func:`fp8_cast_time_s`); the
    calibration's latency-bound work and the
    host dispatch. The classes sum to the
    micro-step's compute (``T_grad``) at that calibration. With ``sequence_bins``, each class
    is the share-weighted mean over the padded lengths (:mod:`.sequence_bins`)."""
    if workload.sequence_bins:
        total = sum(share for _, share in workload.sequence_bins)
        out = dict.fromkeys(OPERATOR_CLASSES, 0.0)
        for tokens, share in workload.sequence_bins:
            part = operator_class_times_s(at_length(workload, tokens), hardware, precision,
                                          micro_batch, compute_scale, fixed_scale,
                                          overhead_scale, latency_flops)
            for key, value in part.items():
                out[key] += share / total * value
        return out
    p = normalize_precision(precision)
    m = float(micro_batch)
    mm = matmul_time_s(workload, hardware, p)
    eff = attention_efficiency(workload, hardware, p)
    attn_share = attention_flops_share(workload) if eff is not None else 0.0
    attention = 0.0
    if attn_share > 0:
        attention = workload.flops_per_sample * attn_share / (
            peak_flops_per_s(hardware.peak_flops_per_s, "bf16" if p == "fp8" else p) * eff)
    traffic = traffic_time_s(workload, hardware, p)
    hidden = hidden_traffic_share(workload, p)
    k = compute_scale
    out = dict.fromkeys(OPERATOR_CLASSES, 0.0)
    # The matmul kernels take their arithmetic or their own operands' traffic, whichever is
    # longer (per_sample_time_prior_s); attention keeps its share of that.
    bound = max(mm, hidden * traffic)
    out["attention"] = k * m * attention * bound / mm if mm > 0 else 0.0
    out["matmuls"] = k * m * bound - out["attention"]
    out["matmuls"] += k * fixed_scale * wave_tail_time_s(workload, hardware, p)
    out["memory"] = k * m * (1.0 - hidden) * traffic
    out["memory"] += k * fixed_scale * weight_traffic_time_s(workload.params, hardware, p,
                                                             workload)
    out["transposes"] = k * m * transpose_time_s(workload, hardware, p)
    out["fp8_casts"] = k * fp8_cast_time_s(workload, hardware, p,
                                           m * float(workload.tokens_per_sample or 0))
    out["latency"] = latency_time_s(latency_flops[0], latency_flops[1], m, hardware)
    overhead = k * fixed_scale if overhead_scale is None else overhead_scale
    out["dispatch"] = overhead * dispatch_time_s(workload, p, kernel_count(workload, p)[0])
    return out
