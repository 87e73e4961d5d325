"""``--shape-gemm``: the no-measurement prior with a GEMM efficiency that depends on the
matrix shape (issue #19), as a benchmark-side prototype of a perfmodel change that is not
shipped (docs/accuracy.md, "The no-measurement prior is slow on the very rows its
efficiencies came from").

Per GEMM of a transformer layer's linear layers (``M`` = one micro-batch's tokens on the GPU,
``N``, ``K`` from hidden / FFN / heads, split over tp): efficiency = ``GEMM_EFFICIENCY_LARGE``
(architecture, precision) × :func:`gemm_shape_factor` (tile and wave quantization over the SM
count × the per-tile prologue/epilogue against the K loop). ``GEMM_EFFICIENCY_LARGE`` is the
whole model inverted on the derivation rows with the factor in place (``bench_llm.py
--shape-gemm --derive-gemm-efficiency``). Installed by patching ``perfmodel.compute``
(``tensor_efficiency``, ``_tensor_time_s``) and wrapping ``step_terms`` /
``split_latency_bound`` to pass the micro-batch's tokens and tp down; MoE's small-``M``
expert term (``moe.gemm_efficiency``) is a ratio to the dense layers' and is left as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import sys

from mlflow_gpuopt.perfmodel import compute, fitting, predictor, step, vendor
from mlflow_gpuopt.perfmodel.activations import matmul_outputs_per_token, transformer_dims
from mlflow_gpuopt.perfmodel.precision import normalize_precision, uses_tensor_cores
from mlflow_gpuopt.perfmodel.types import Workload

#: Output tile (rows × columns) and K step of the tensor-core GEMM kernels cuBLAS and CUTLASS
#: run on transformer-sized problems: a 128 × 256 thread-block tile (NVIDIA's "Matrix
#: Multiplication Background User's Guide", docs.nvidia.com/deeplearning/performance/
#: dl-performance-matrix-multiplication, works its tile- and wave-quantization examples with
#: 256 × 128 tiles; CUTLASS's Hopper warp-specialised kernels, examples/48 and 49, use
#: 128 × 128 × 64 and 128 × 256 × 64 with a 64-deep K step per pipeline stage).
GEMM_TILE_M = 128
GEMM_TILE_N = 256
GEMM_TILE_K = 64
#: Pipeline stages of shared-memory operand buffers such a kernel keeps in flight (CUTLASS's
#: collective builder fills shared memory with 4-7 stages of 128 × 64 + 256 × 64 operands).
#: Each output tile pays about this many K steps outside its steady K loop: the prologue that
#: fills the pipeline before the first MMA and the epilogue that converts and stores the
#: fp32 accumulators, so a tile reaches ``K / (K + GEMM_TILE_K × GEMM_PIPELINE_STAGES)`` of the
#: steady rate (:func:`gemm_shape_factor`).
GEMM_PIPELINE_STAGES = 4
#: Streaming multiprocessors per catalog GPU, by name prefix (NVIDIA's architecture
#: whitepapers and datasheets; the first that matches wins): the waves a GEMM's tiles run in.
SM_COUNT_PREFIXES = (
    ("V100", 80), ("T4", 40), ("A100", 108), ("A10G", 80), ("A10", 72), ("A40", 84),
    ("RTX-A6000", 84), ("RTX-3090", 82), ("L40S", 142), ("L4", 58), ("RTX-4090", 128),
    ("H100-PCIE", 114), ("H100 PCIE", 114), ("H100", 132), ("H200", 132), ("B200", 148),
)
#: Large-GEMM efficiency (share of the dense tensor-core peak a GEMM reaches once its shape
#: costs nothing, :func:`gemm_shape_factor` → 1), per (architecture, precision): the whole
#: model inverted on the bench_llm derivation rows with the shape factor in place
#: (``bench_llm.py --shape-gemm --derive-gemm-efficiency``, median per group): Ampere bf16
#: 0.794 (torchtitan A100, 5 rows, 0.68-0.85), Hopper bf16 0.824 (Megatron-LM H100, 9 rows,
#: 0.71-1.0), Hopper FP8 0.655 (NeMo 24.07, 12 rows, 0.43-0.81). Near cuBLAS on large
#: square GEMMs (B200 bf16 at 4,096-8,192: 0.72-0.73 of peak, pyptx.dev/performance; with
#: :func:`gemm_shape_factor`'s 0.81-0.96 for those shapes this says 0.67-0.79).
GEMM_EFFICIENCY_LARGE = {("ampere", "bf16"): 0.794, ("hopper", "bf16"): 0.824,
                         ("hopper", "fp8"): 0.655}


@functools.lru_cache(maxsize=256)
def sm_count(gpu: str) -> int | None:
    """Streaming multiprocessors of a catalog GPU (``SM_COUNT_PREFIXES``), None if unknown."""
    name = gpu.strip().upper()
    for prefix, count in SM_COUNT_PREFIXES:
        if name.startswith(prefix.upper()):
            return count
    return None


def gemm_shape_factor(m: float, n: float, k: float, sms: int | None) -> float:
    """Share of the large-GEMM rate an ``m × n × k`` GEMM (output ``m × n``, reduction ``k``)
    reaches on ``sms`` SMs: tile quantization (the last row and column of
    ``GEMM_TILE_M × GEMM_TILE_N`` tiles computes padding) × wave quantization (``tiles /
    (ceil(tiles / SMs) · SMs)``: the last wave leaves SMs idle) × the per-tile prologue and
    epilogue against the K loop (``K / (K + K0)``, ``K0 = GEMM_TILE_K × GEMM_PIPELINE_STAGES``).
    Without an SM count the wave term is left out."""
    if m <= 0 or n <= 0 or k <= 0:
        return 1.0
    tm, tn = math.ceil(m / GEMM_TILE_M), math.ceil(n / GEMM_TILE_N)
    tiles = tm * tn
    tile_q = (m * n) / (tm * GEMM_TILE_M * tn * GEMM_TILE_N)
    wave_q = tiles / (math.ceil(tiles / sms) * sms) if sms else 1.0
    k0 = GEMM_TILE_K * GEMM_PIPELINE_STAGES
    return tile_q * wave_q * k / (k + k0)


def linear_gemm_factor(workload: Workload, gpu: str, tokens: float | None,
                       tp: int = 1) -> float | None:
    """:func:`gemm_shape_factor` of a transformer layer's linear layers (and the output
    projection where the vocabulary is known), FLOP-weighted in time over the forward GEMM
    and the backward's two (input gradient, weight gradient) of each projection: ``M`` =
    ``tokens`` (one micro-batch's tokens on the GPU; default one sample's), column-parallel
    projections (Q, K, V, the MLP's first ones, the output projection) split ``N`` over
    ``tp``, row-parallel ones (attention output, the MLP's last) split ``K``. None where the
    architecture is unknown."""
    dims = transformer_dims(workload)
    if dims is None:
        return None
    t = max(1, int(tp))
    m = float(tokens) if tokens else float(dims.seq_len)
    h = float(dims.hidden_size)
    outs = matmul_outputs_per_token(dims)
    last = len(outs) - 1
    shapes = []  # (n_out, k_in on this GPU, how many)
    for i, n_out in enumerate(outs):
        k_in = float(dims.ffn_hidden_size) if i == last else h
        if i in (3, last):  # row-parallel
            shapes.append((n_out, k_in / t, float(dims.num_layers)))
        else:
            shapes.append((n_out / t, k_in, float(dims.num_layers)))
    if dims.vocab_size:
        shapes.append((float(dims.vocab_size) / t, h, 1.0))
    sms = sm_count(gpu)
    flops = time = 0.0
    for n, k, count in shapes:
        w = count * n * k  # FLOPs of each of its three GEMMs per token, up to a constant
        for gm, gn, gk in ((m, n, k), (m, k, n), (n, k, m)):
            flops += w
            time += w / gemm_shape_factor(gm, gn, gk, sms)
    return flops / time if time > 0 else None


def tensor_efficiency(gpu: str, precision: str) -> float:
    """``GEMM_EFFICIENCY_LARGE`` of the GPU's generation (fp16 as bf16; FP8 without a figure:
    the generation's bf16 × Hopper's fp8/bf16 ratio; a generation without figures: Ampere's)."""
    p = normalize_precision(precision)
    p = "bf16" if p == "fp16" else p
    arch = compute.transformer_mfu_group((compute.architecture(gpu), p))[0]
    ref = GEMM_EFFICIENCY_LARGE[("ampere", "bf16")]
    eff = GEMM_EFFICIENCY_LARGE.get((arch, p))
    if eff is None and p == "fp8":
        eff = (GEMM_EFFICIENCY_LARGE.get((arch, "bf16"), ref)
               * GEMM_EFFICIENCY_LARGE[("hopper", "fp8")]
               / GEMM_EFFICIENCY_LARGE[("hopper", "bf16")])
    return ref if eff is None else eff


#: (workload, tokens per GEMM, tp) of the step being timed; None outside one.
_GEMMS: contextvars.ContextVar = contextvars.ContextVar("gemm_shape", default=None)


def shape_factor(hardware, precision: str) -> float:
    """What the current step's linear-layer shapes leave of the large-GEMM efficiency on
    NVIDIA tensor cores; without the architecture ``COMPUTE_EFFICIENCY_TENSOR`` / Ampere's
    large-GEMM figure (the share DeepLearningExamples' layer shapes reach); 1 off tensor
    cores, on AMD (a vendor figure) and outside a step."""
    state = _GEMMS.get()
    if (state is None or not uses_tensor_cores(hardware.peak_flops_per_s, precision)
            or vendor.attainable_fraction(hardware.gpu) is not None):
        return 1.0
    workload, tokens, tp = state
    f = linear_gemm_factor(workload, hardware.gpu, tokens, tp)
    if f is None:
        return min(1.0, compute.COMPUTE_EFFICIENCY_TENSOR
                   / GEMM_EFFICIENCY_LARGE[("ampere", "bf16")])
    return f


def _wrap_step_terms(original):
    sig = inspect.signature(original)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        layout = a["layout"]
        tokens = a["micro_batch"] * a["shape"].seq_len / max(1, layout.cp)
        token = _GEMMS.set((a["workload"], tokens, layout.tp))
        try:
            return original(*args, **kwargs)
        finally:
            _GEMMS.reset(token)
    return wrapped


def _wrap_split(original):
    sig = inspect.signature(original)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        w = a["workload"]
        tokens = a["micro_batch"] * w.tokens_per_sample if w.tokens_per_sample else None
        token = _GEMMS.set((w, tokens, 1))
        try:
            return original(*args, **kwargs)
        finally:
            _GEMMS.reset(token)
    return wrapped


@contextlib.contextmanager
def installed():
    """The shape-dependent GEMM prior patched into ``perfmodel`` for the block."""
    saved = (compute.tensor_efficiency, compute._tensor_time_s, step.step_terms,
             fitting.step_terms, predictor.step_terms, fitting.split_latency_bound)
    tensor_time = compute._tensor_time_s

    def timed(flops, hardware, precision):
        return tensor_time(flops, hardware, precision) / shape_factor(hardware, precision)

    compute.tensor_efficiency = tensor_efficiency
    compute._tensor_time_s = timed
    wrapped = _wrap_step_terms(step.step_terms)
    step.step_terms = fitting.step_terms = predictor.step_terms = wrapped
    fitting.split_latency_bound = _wrap_split(fitting.split_latency_bound)
    try:
        yield
    finally:
        (compute.tensor_efficiency, compute._tensor_time_s, step.step_terms,
         fitting.step_terms, predictor.step_terms, fitting.split_latency_bound) = saved


def from_argv():
    """:func:`installed` where ``--shape-gemm`` is on the command line, else nothing."""
    return installed() if "--shape-gemm" in sys.argv[1:] else contextlib.nullcontext()
