"""Memory per GPU: DeepSpeed's model-state formulas per strategy and precision, activations
× micro-batch (less with checkpointing), and headroom for workspace and fragmentation.

Model states for Ψ parameters, N data-parallel ranks, K optimizer-state bytes per parameter
(8 for Adam's m and v), L parameters in the largest layer:

| strategy   | mixed precision (fp16/bf16)                        | fp32/tf32                   |
|---|---|---|
| single/ddp | 2Ψ + 2Ψ + (4+K)Ψ  (16 B/param for Adam)            | 4Ψ + 4Ψ + KΨ                |
| zero1      | 2Ψ + 2Ψ + (4+K)Ψ/N                                 | 4Ψ + 4Ψ + KΨ/N              |
| zero2      | 2Ψ + (2Ψ + 4Ψ/N) + (4+K)Ψ/N = 4Ψ + 16Ψ/N (a)       | 4Ψ + 4Ψ/N + KΨ/N            |
| zero3/fsdp | (2Ψ/N + 2L) + (4Ψ/N + 2L) + (4+K)Ψ/N               | (4Ψ/N + 4L) + (4Ψ/N + 4L)   |
|            | = 4L + 18Ψ/N (b)                                   | + KΨ/N                      |

(a) DeepSpeed ``estimate_zero2_model_states_mem_needs``; (b) DeepSpeed ``estimate_zero3…``.
(The ``4`` inside ``4+K`` is the fp32 master copy; the ``4Ψ/N`` in ZeRO-2/3 gradients is the
fp32 gradient partition DeepSpeed keeps next to the 16-bit buffers.) Tensor and pipeline
parallel divide Ψ and L by ``tp·pp`` first.

Activations: a measured figure where the profile has one; else, where the profile gives the
transformer's layers, hidden size and sequence length, the per-layer formula of Korthikanti et
al. 2022 (:mod:`.activations`) with the attention kernel, dropout, recomputation, tensor
(sequence) parallel and pipeline stage in use; else a FLOPs-based guess (traffic / 6). An
``activation_scale`` below 1 is the calibration that makes observed configurations fit
(:mod:`.predictor`).

FP8 (Transformer Engine, torchao float8) trains as bf16 mixed precision does: bf16 weights and
gradients, fp32 master weights and optimizer states, so the table's mixed-precision column
holds; on top, the FP8 copy of each weight the forward casts is kept for the backward (1 byte
per parameter of the shard, or of the gathered layer under ZeRO-3/FSDP). FP8 saves memory
only in the activations (linear-layer inputs, ``precision.ACTIVATION_BYTES``), not in the
model states.
"""

from __future__ import annotations

import functools

import math

from mlflow_gpuopt.perfmodel.activations import (
    DROPOUT_MASK_BYTES_CUDA,
    TransformerDims,
    activation_bytes,
    normalize_attention,
    normalize_recompute,
    recompute_time_factor,
)
from mlflow_gpuopt.perfmodel.compute import activation_bytes_per_sample
from mlflow_gpuopt.perfmodel.layout import Layout, resolve_layout
from mlflow_gpuopt.perfmodel.precision import ELEMENT_BYTES, is_mixed, normalize_precision
from mlflow_gpuopt.perfmodel.shape import Shape, model_shape
from mlflow_gpuopt.perfmodel.types import MemoryBreakdown, ParallelConfig, Workload

#: CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers, per GPU.
CONTEXT_BYTES = 0.75e9
#: Allocator fragmentation and temporary buffers, as a share of everything else.
FRAGMENTATION = 0.10
#: Optimizer state bytes per parameter by optimizer name (fp32 states).
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "fusedadam": 8, "lamb": 8, "fusedlamb": 8,
                         "lion": 4, "sgd": 4, "adagrad": 4, "rmsprop": 4, "adafactor": 4}
#: Assumed when the optimizer is not known: Adam (the common and the larger case).
DEFAULT_OPTIMIZER_STATE_BYTES = 8.0


def optimizer_state_bytes_per_param(workload: Workload) -> tuple[float, bool]:
    """K without the master copy, and whether it was assumed (unknown optimizer → Adam)."""
    if workload.optimizer_state_bytes_per_param is not None:
        return float(workload.optimizer_state_bytes_per_param), False
    name = (workload.optimizer or "").lower().replace("_", "").replace("-", "")
    if name in OPTIMIZER_STATE_BYTES:
        return float(OPTIMIZER_STATE_BYTES[name]), False
    return DEFAULT_OPTIMIZER_STATE_BYTES, True


def model_states_bytes(params: float, precision: str, dp_strategy: str, dp: int,
                       optimizer_state_bytes: float, largest_layer_params: float = 0.0,
                       ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU for one model shard of ``params``."""
    n = max(1, dp)
    k = float(optimizer_state_bytes)
    psi = float(params)
    big = float(largest_layer_params)
    if is_mixed(precision):
        opt = (4.0 + k) * psi
        # FP8: the cast copy of the weights, kept from forward to backward (module doc).
        f8 = 1.0 if normalize_precision(precision) == "fp8" else 0.0
        if dp_strategy in ("single", "ddp"):
            return (2 + f8) * psi, 2 * psi, opt
        if dp_strategy == "zero1":
            return (2 + f8) * psi, 2 * psi, opt / n
        if dp_strategy == "zero2":
            return (2 + f8) * psi, 2 * psi + 4 * psi / n, opt / n
        return (2 * psi / n + (2 + f8) * big, 4 * psi / n + 2 * big,  # zero3 / fsdp
                opt / n)
    opt = k * psi
    if dp_strategy in ("single", "ddp"):
        return 4 * psi, 4 * psi, opt
    if dp_strategy == "zero1":
        return 4 * psi, 4 * psi, opt / n
    if dp_strategy == "zero2":
        return 4 * psi, 4 * psi / n, opt / n
    return 4 * psi / n + 4 * big, 4 * psi / n + 4 * big, opt / n


def checkpointing_factor(num_layers: int) -> float:
    """Activation checkpointing keeps about one layer input per √L layers: ÷ √L (at least 2)."""
    return max(2.0, math.sqrt(max(1, num_layers)))


@functools.lru_cache(maxsize=64)  # pure; the recommender asks thousands of times
def transformer_dims(workload: Workload) -> TransformerDims | None:
    """The architecture for the activation formula, or None when the profile does not give
    layers, hidden size and sequence length (heads default to hidden / 128, the common head
    width; the MLP to GELU at 4 × hidden, or SwiGLU at 8/3 × hidden)."""
    if not (workload.num_layers and workload.hidden_size and workload.tokens_per_sample):
        return None
    h = float(workload.hidden_size)
    gated = (workload.mlp or "gelu").strip().lower() in ("swiglu", "geglu", "gated", "glu")
    ffn = workload.ffn_hidden_size or (8.0 / 3.0 * h if gated else 4.0 * h)
    return TransformerDims(num_layers=int(workload.num_layers), hidden_size=h,
                           seq_len=float(workload.tokens_per_sample),
                           num_heads=int(workload.num_heads or max(1, round(h / 128))),
                           ffn_hidden_size=float(ffn), gated_mlp=gated,
                           vocab_size=float(workload.vocab_size) if workload.vocab_size else None,
                           num_kv_heads=int(workload.num_kv_heads) if workload.num_kv_heads
                           else None)


def recompute_factor(workload: Workload, recompute: str) -> float:
    """How much longer a micro-step runs with ``recompute``: for the run's own mode, its
    measured replayed FLOPs over its model FLOPs (non-reentrant checkpointing stops replaying
    once the backward has what it needs, so a full replay is often less than a forward);
    otherwise :func:`.activations.recompute_time_factor`."""
    mode = normalize_recompute(recompute)
    if (mode != "none" and mode == normalize_recompute(workload.recompute)
            and workload.recompute_flops_per_sample and workload.flops_per_sample > 0):
        return 1.0 + workload.recompute_flops_per_sample / workload.flops_per_sample
    return recompute_time_factor(recompute, normalize_attention(workload.attention),
                                 workload.flops_per_sample, transformer_dims(workload))


def activation_notes(workload: Workload, recompute: str) -> tuple[str, ...]:
    """What the activation estimate assumed, in words."""
    if workload.activation_bytes_per_sample:
        return ()
    if transformer_dims(workload) is None:
        return ("activations estimated from FLOPs (no measured figure; give num_layers, "
                "hidden_size and tokens_per_sample for the transformer formula)",)
    notes = [f"activations from the transformer formula (Korthikanti et al. 2022), "
             f"{normalize_attention(workload.attention)} attention, recompute {recompute}"]
    if not workload.num_heads:
        notes.append("num_heads assumed hidden_size / 128")
    if workload.dropout is None:
        notes.append("dropout unknown: its masks assumed kept (give dropout: 0 if none)")
    return tuple(notes)


def _formula_bytes(workload: Workload, dims: TransformerDims, precision: str,
                   micro_batch: float, recompute: str, tp: int = 1, pp: int = 1,
                   grad_accum: int = 1, virtual_stages: int = 1) -> float:
    """The per-layer formula's activation bytes at the peak of the backward, with the
    workload's attention kernel and dropout."""
    dropout = workload.dropout is None or workload.dropout > 0
    return activation_bytes(
        dims, micro_batch, ELEMENT_BYTES[precision], DROPOUT_MASK_BYTES_CUDA if dropout else 0.0,
        attention=normalize_attention(workload.attention), attention_dropout=dropout,
        recompute=recompute, tp=tp, pp=pp, grad_accum=grad_accum,
        virtual_stages=virtual_stages).peak_bytes


def _activations(workload: Workload, config: ParallelConfig, layout: Layout, precision: str,
                 micro_batch: float, shape: Shape) -> float:
    """Activation bytes on the busiest GPU for one micro-step of ``micro_batch`` samples."""
    recompute = config.recompute_mode(workload.recompute)
    dims = None if workload.activation_bytes_per_sample else transformer_dims(workload)
    if dims is not None:
        return _formula_bytes(workload, dims, precision, micro_batch, recompute, layout.tp,
                              layout.pp, config.grad_accum, layout.vp)
    act_per_sample, estimated = activation_bytes_per_sample(workload, precision)
    act = act_per_sample * micro_batch / layout.tp
    # A measured figure holds what the run kept under its own recomputation; an estimate
    # from FLOPs is what a step keeps without any.
    held = "none" if estimated else normalize_recompute(workload.recompute)
    if recompute != held:
        act *= recompute_memory_ratio(workload, shape.num_layers, precision, held, recompute)
    return act


@functools.lru_cache(maxsize=64)  # pure; asked for every plan of a search
def recompute_memory_ratio(workload: Workload, num_layers: int, precision: str, measured: str,
                           wanted: str) -> float:
    """Activation bytes kept under ``wanted`` recomputation ÷ those kept under ``measured``.

    With the architecture, the per-layer formula's ratio (one micro-batch sample, no model
    parallelism: both figures are per sample of the same model). Without it, full
    checkpointing keeps ÷ :func:`checkpointing_factor` of the rest (``num_layers``: the
    model's, or its shape estimate), and the selective modes are counted as keeping what no
    recomputation keeps (their saving depends on the architecture).
    """
    dims = transformer_dims(workload)
    if dims is not None:
        base = _formula_bytes(workload, dims, precision, 1, measured)
        return _formula_bytes(workload, dims, precision, 1, wanted) / base if base > 0 else 1.0
    factor = checkpointing_factor(num_layers)
    if wanted == "full" and measured != "full":
        return 1.0 / factor
    if measured == "full" and wanted != "full":
        return factor
    return 1.0


def memory_per_gpu(workload: Workload, config: ParallelConfig,
                   hardware_memory_bytes: float | None = None) -> MemoryBreakdown:
    """Predicted bytes per GPU for ``config`` (see the module docstring for the formulas).

    ``hardware_memory_bytes`` (the GPU's capacity), when given, adds 2% of it to the
    workspace for the allocator's reserve, which grows with the card.
    """
    layout = resolve_layout(config)
    return _memory(workload, config, layout, hardware_memory_bytes)


def _memory(workload: Workload, config: ParallelConfig, layout: Layout,
            hardware_memory_bytes: float | None, micro_batch: float | None = None,
            shape: Shape | None = None, activation_scale: float = 1.0) -> MemoryBreakdown:
    precision = normalize_precision(config.precision or workload.precision)
    shape = shape or model_shape(workload)
    shards = layout.tp * layout.pp
    k, _ = optimizer_state_bytes_per_param(workload)
    w, g, o = model_states_bytes(workload.params / shards, precision, layout.dp_strategy,
                                 layout.dp, k, shape.largest_layer_params / layout.tp)
    m = micro_batch if micro_batch is not None else (config.micro_batch or workload.micro_batch
                                                     or 1)
    act = activation_scale * _activations(workload, config, layout, precision, m, shape)
    workspace = CONTEXT_BYTES + FRAGMENTATION * (w + g + o + act)
    if hardware_memory_bytes:
        workspace += 0.02 * hardware_memory_bytes
    return MemoryBreakdown(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o,
                           activations_bytes=act, workspace_bytes=workspace)


def max_micro_batch_fitting(workload: Workload, config: ParallelConfig, layout: Layout,
                            capacity_bytes: float, shape: Shape | None = None,
                            activation_scale: float = 1.0) -> int:
    """Largest micro-batch whose memory fits ``capacity_bytes`` (0 if not even one).

    Memory is linear in the micro-batch, so this solves it rather than searching."""
    m0 = _memory(workload, config, layout, capacity_bytes, 0, shape, activation_scale).total_bytes
    m1 = _memory(workload, config, layout, capacity_bytes, 1, shape, activation_scale).total_bytes
    return largest_fitting(m0, m1, capacity_bytes)


def activation_scale_to_fit(memory: MemoryBreakdown, capacity_bytes: float) -> float:
    """The factor on the activations that brings ``memory`` (computed at scale 1) within
    ``capacity_bytes`` with the usual workspace margin: 1.0 when it fits already, 0.0 when the
    model states alone do not fit. The workspace's fragmentation share grows with the
    activations, so the activations shrink by what is over ÷ (1 + FRAGMENTATION)."""
    over = memory.total_bytes - capacity_bytes
    if over <= 0:
        return 1.0
    act = memory.activations_bytes
    if act <= 0:
        return 0.0
    # A hair under the exact factor, so rounding cannot push the observed run back over.
    return max(0.0, 1.0 - over / ((1.0 + FRAGMENTATION) * act) - 1e-9)


def largest_fitting(m0: float, m1: float, capacity_bytes: float) -> int:
    """Largest m with ``m0 + (m1 − m0)·m <= capacity`` (memory at micro-batch 0 and 1)."""
    slope = m1 - m0
    if m1 > capacity_bytes:
        return 0
    if slope <= 0:
        return 1 << 30
    return int(max(0, math.floor((capacity_bytes - m0) / slope + 1e-9)))
