"""Memory per GPU as a distribution: model states by strategy and precision (exact, given the
parameter counts), activations × micro-batch (measured, from the transformer's formula in
:mod:`.activations`, or from FLOPs), the CUDA context and the caching allocator's share, and
the probability that the peak fits the GPU (``p_fits``).

The model-states table per strategy (single/ddp, zero1-3, fsdp), frozen and FP8 weights, the
usable memory and every spread: docs/models.md#memory-per-gpu-memorypy. Their figures are
the constants below (``FSDP_GATHERED_UNITS``, ``FROZEN_WEIGHT_BYTES``, ``CONTEXT_BYTES``,
``ALLOCATOR_OVERHEAD`` and the ``*_SIGMA`` spreads); an ``activation_scale`` below 1 is the
calibration that makes observed configurations fit (:mod:`.predictor`). Context parallel keeps
``seq/cp`` tokens of each sample and the key/value chunks it exchanges
(``MemoryBreakdown.cp_buffers_bytes``, :func:`.context.buffer_bytes`).
"""

from __future__ import annotations

import functools
import math

from mlflow_gpuopt.perfmodel.activations import (
    DROPOUT_MASK_BYTES_CUDA,
    LOGIT_BYTES,
    TransformerDims,
    activation_bytes,
    normalize_attention,
    normalize_cross_entropy,
    normalize_recompute,
    recompute_time_factor,
    transformer_dims,
)
from mlflow_gpuopt.perfmodel import context
from mlflow_gpuopt.perfmodel.compute import activation_bytes_per_sample
from mlflow_gpuopt.perfmodel.layout import Layout, resolve_layout
from mlflow_gpuopt.perfmodel.moe import (expert_data_parallel, expert_params_per_gpu,
                                         largest_unit_params, routed_expert_params)
from mlflow_gpuopt.perfmodel.precision import (
    COMM_ELEMENT_BYTES,
    ELEMENT_BYTES,
    is_mixed,
    normalize_precision,
)
from mlflow_gpuopt.perfmodel.shape import Shape, model_shape
from mlflow_gpuopt.perfmodel.types import MemoryBreakdown, ParallelConfig, Workload

#: CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers, per GPU: median and spread (1σ).
CONTEXT_BYTES = 0.75e9
CONTEXT_SIGMA_BYTES = 0.25e9
#: PyTorch's caching allocator reserves more than it has allocated at the peak (blocks rounded
#: to 512 B / 2 MiB, large segments split and cached by size): that excess as a share of the
#: allocated peak, median and spread (1σ). ``track()`` logs both series per GPU
#: (``gpuopt/gpu_<i>_torch_reserved_bytes`` and ``_torch_allocated_bytes``).
ALLOCATOR_OVERHEAD = 0.05
ALLOCATOR_SIGMA = 0.03
#: Relative spread (1σ) of the activation estimate by where it comes from: a figure the
#: profile measured (saved tensors of the real step), the transformer formula (checked within
#: 0.2 % against what PyTorch saves for the modelled kernels; the spread is for kernels that
#: save otherwise: fused norms, compiled graphs, another SDPA backend) or the FLOPs-based guess.
ACTIVATION_SIGMA = {"measured": 0.05, "formula": 0.10, "flops": 0.5}
#: Relative spread (1σ) of the gathered ZeRO-3/FSDP buffers when the largest layer is not
#: given: from the shape's estimate (2Ψ / layers), or from the architecture (one block or
#: the embedding; how a framework groups the embedding, norm and output into units varies).
GATHERED_SIGMA_ESTIMATED = 0.5
GATHERED_SIGMA_ARCHITECTURE = 0.25
#: FSDP units all-gathered at once: the one computing and the one prefetched (PyTorch FSDP's
#: forward/backward prefetch, one unit ahead).
FSDP_GATHERED_UNITS = 2
#: Bytes per frozen (``requires_grad=False``) weight by ``frozen_precision``: 4-bit formats
#: carry a quantisation constant per block of 64 (bitsandbytes NF4: 4.5 bits a weight).
FROZEN_WEIGHT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0,
                       "int8": 1.0, "nf4": 0.5625, "fp4": 0.5625, "int4": 0.5625,
                       "4bit": 0.5625, "8bit": 1.0}
#: What CUDA can allocate of a GPU's stated memory: datasheet capacities are binary (an
#: "80 GB" A100 has 80 GiB of HBM) and the driver keeps about 1 % (PyTorch reports 79.2 GiB
#: of an 80 GB H100, 31.75 GiB of a 32 GB V100); GDDR cards with ECC on by default (T4, A10,
#: A10G, L4, L40S) keep about 8 % (14.75 GiB of a T4's 16).
USABLE_SHARE_HBM = 0.99
USABLE_SHARE_GDDR_ECC = 0.92
_GDDR_ECC_GPUS = ("T4", "A10", "A10G", "L4", "L40S", "L40")
#: Optimizer state bytes per parameter by optimizer name (fp32 states).
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "fusedadam": 8, "lamb": 8, "fusedlamb": 8,
                         "lion": 4, "sgd": 4, "adagrad": 4, "rmsprop": 4, "adafactor": 4}
#: Assumed when the optimizer is not known: Adam (the common and the larger case).
DEFAULT_OPTIMIZER_STATE_BYTES = 8.0


def usable_memory_bytes(gpu: str, stated_bytes: float) -> float:
    """Bytes CUDA can allocate on ``gpu`` whose datasheet states ``stated_bytes`` (GB × 1e9,
    as the catalog holds it): the stated figure read as GiB, × the share the driver leaves."""
    name = (gpu or "").upper().replace(" ", "-")
    gddr = any(name == g or name.startswith(g + "-") for g in _GDDR_ECC_GPUS)
    share = USABLE_SHARE_GDDR_ECC if gddr else USABLE_SHARE_HBM
    return float(stated_bytes) / 1e9 * 2**30 * share


def p_fits(memory: MemoryBreakdown, usable_bytes: float) -> float:
    """Probability that the peak (normal: median ``memory.total_bytes``, standard deviation
    ``memory.sigma_bytes``) is within ``usable_bytes``."""
    over = usable_bytes - memory.total_bytes
    if memory.sigma_bytes <= 0:
        return 1.0 if over >= 0 else 0.0
    return 0.5 * (1.0 + math.erf(over / (memory.sigma_bytes * math.sqrt(2.0))))


def frozen_weight_bytes(workload: Workload, precision: str) -> float:
    """Bytes per frozen weight: ``frozen_precision`` where given, else the compute
    precision's element (bf16/fp16: 2, fp8: bf16's 2, as its weights are kept; fp32: 4)."""
    if workload.frozen_precision:
        return FROZEN_WEIGHT_BYTES[normalize_frozen_precision(workload.frozen_precision)]
    return 2.0 if is_mixed(precision) else 4.0


def normalize_frozen_precision(name: str) -> str:
    """A ``FROZEN_WEIGHT_BYTES`` key from ``bf16``, ``nf4``, ``4bit``, ``int8``..."""
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    key = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8": "fp8",
           "qlora": "nf4", "4bits": "4bit", "8bits": "8bit"}.get(key, key)
    if key not in FROZEN_WEIGHT_BYTES:
        raise ValueError(f"unknown frozen_precision {name!r}; expected one of "
                         + ", ".join(FROZEN_WEIGHT_BYTES))
    return key


def trainable_share(workload: Workload) -> float:
    """Trainable parameters over all of them (1 when ``trainable_params`` is not given)."""
    t = workload.trainable_params
    if not t or t <= 0 or not workload.params:
        return 1.0
    return min(1.0, float(t) / float(workload.params))


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
                       trainable_share: float = 1.0, frozen_bytes: float | None = None,
                       ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU for one model shard of ``params``, of
    which ``trainable_share`` are trainable and the rest frozen at ``frozen_bytes`` each
    (module docstring's table)."""
    n = max(1, dp)
    k = float(optimizer_state_bytes)
    share = min(1.0, max(0.0, float(trainable_share)))
    psi_t = float(params) * share
    psi_f = float(params) - psi_t
    big = float(largest_layer_params)
    mixed = is_mixed(precision)
    b = float(frozen_bytes) if frozen_bytes is not None else (2.0 if mixed else 4.0)
    if mixed:
        # FP8: the cast copy of the weights, kept from forward to backward (module doc).
        f8 = 1.0 if normalize_precision(precision) == "fp8" else 0.0
        frozen = (b + f8) * psi_f
        opt = (4.0 + k) * psi_t
        if dp_strategy in ("single", "ddp"):
            return (2 + f8) * psi_t + frozen, 2 * psi_t, opt
        if dp_strategy == "zero1":
            return (2 + f8) * psi_t + frozen, 2 * psi_t, opt / n
        if dp_strategy == "zero2":
            return (2 + f8) * psi_t + frozen, 2 * psi_t + 4 * psi_t / n, opt / n
        if dp_strategy == "zero3":
            return ((2 * psi_t + b * psi_f) / n + (2 + f8) * big,
                    4 * psi_t / n + 2 * big * share, opt / n)
        return ((4 * psi_t + b * psi_f) / n + FSDP_GATHERED_UNITS * (2 + f8) * big,  # fsdp
                4 * psi_t / n + 4 * big * share, k * psi_t / n)
    opt = k * psi_t
    frozen = b * psi_f
    if dp_strategy in ("single", "ddp"):
        return 4 * psi_t + frozen, 4 * psi_t, opt
    if dp_strategy == "zero1":
        return 4 * psi_t + frozen, 4 * psi_t, opt / n
    if dp_strategy == "zero2":
        return 4 * psi_t + frozen, 4 * psi_t / n, opt / n
    units = FSDP_GATHERED_UNITS if dp_strategy == "fsdp" else 1
    return ((4 * psi_t + frozen) / n + units * 4 * big, 4 * psi_t / n + 4 * big * share,
            opt / n)


def gathered_bytes(params: float, precision: str, dp_strategy: str,
                   largest_layer_params: float, trainable_share: float = 1.0) -> float:
    """The part of :func:`model_states_bytes` that is whole layers gathered by ZeRO-3/FSDP
    (it carries the largest layer's uncertainty); 0 for the other strategies."""
    if dp_strategy not in ("zero3", "fsdp"):
        return 0.0
    w1, g1, _ = model_states_bytes(params, precision, dp_strategy, 1 << 40, 0.0,
                                   largest_layer_params, trainable_share)
    w0, g0, _ = model_states_bytes(params, precision, dp_strategy, 1 << 40, 0.0, 0.0,
                                   trainable_share)
    return (w1 + g1) - (w0 + g0)


def checkpointing_factor(num_layers: int) -> float:
    """Activation checkpointing keeps about one layer input per √L layers: ÷ √L (at least 2)."""
    return max(2.0, math.sqrt(max(1, num_layers)))


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


@functools.lru_cache(maxsize=1024)  # pure; a search asks it for every plan's micro-batch
def _formula_bytes(workload: Workload, dims: TransformerDims, precision: str,
                   micro_batch: float, recompute: str, tp: int = 1, pp: int = 1,
                   grad_accum: int = 1, virtual_stages: int = 1, cp: int = 1) -> float:
    """The per-layer formula's activation bytes at the peak of the backward, with the
    workload's attention kernel and dropout."""
    dropout = workload.dropout is None or workload.dropout > 0
    return activation_bytes(
        dims, micro_batch, ELEMENT_BYTES[precision], DROPOUT_MASK_BYTES_CUDA if dropout else 0.0,
        attention=normalize_attention(workload.attention), attention_dropout=dropout,
        recompute=recompute, tp=tp, pp=pp, grad_accum=grad_accum,
        virtual_stages=virtual_stages,
        cross_entropy=normalize_cross_entropy(workload.cross_entropy) or "fused",
        cp=cp).peak_bytes


def _activations(workload: Workload, config: ParallelConfig, layout: Layout, precision: str,
                 micro_batch: float, shape: Shape) -> float:
    """Activation bytes on the busiest GPU for one micro-step of ``micro_batch`` samples."""
    recompute = config.recompute_mode(workload.recompute)
    dims = None if workload.activation_bytes_per_sample else transformer_dims(workload)
    if dims is not None:
        return _formula_bytes(workload, dims, precision, micro_batch, recompute, layout.tp,
                              layout.pp, config.grad_accum, layout.vp, layout.cp)
    act_per_sample, estimated = activation_bytes_per_sample(workload, precision)
    act = act_per_sample * micro_batch / (layout.tp * layout.cp)
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
    """Predicted bytes per GPU for ``config`` (see the module docstring for the formulas):
    the median peak and its spread. ``hardware_memory_bytes`` is accepted for callers that
    pass the GPU's capacity; the estimate does not depend on it."""
    layout = resolve_layout(config)
    return memory_at(workload, config, layout, hardware_memory_bytes)


def activation_source(workload: Workload) -> str:
    """``measured``, ``formula`` or ``flops``: where the activation estimate comes from."""
    if workload.activation_bytes_per_sample:
        return "measured"
    return "formula" if transformer_dims(workload) is not None else "flops"


def _logits_sigma(workload: Workload, layout: Layout, micro_batch: float) -> float:
    """Spread of the loss's logits where its implementation is not given: the median is the
    fused loss (fp32 log-probabilities kept, no more); a plain ``F.cross_entropy`` holds two
    more fp32 copies at the start of the backward (2σ), a chunked one none."""
    dims = transformer_dims(workload)
    if dims is None or not dims.vocab_size or workload.cross_entropy or \
            workload.activation_bytes_per_sample:
        return 0.0
    return (LOGIT_BYTES * float(dims.vocab_size) * float(micro_batch) * dims.seq_len
            / (layout.tp * layout.cp))


def memory_at(workload: Workload, config: ParallelConfig, layout: Layout,
              hardware_memory_bytes: float | None, micro_batch: float | None = None,
              shape: Shape | None = None, activation_scale: float = 1.0) -> MemoryBreakdown:
    """:func:`memory_per_gpu` for an already resolved ``layout``, at ``micro_batch``
    samples (default: the config's), ``shape`` and a fitted ``activation_scale``."""
    precision = normalize_precision(config.precision or workload.precision)
    shape = shape or model_shape(workload)
    shards = layout.tp * layout.pp
    k, _ = optimizer_state_bytes_per_param(workload)
    share = trainable_share(workload)
    params = workload.params / shards
    big = largest_unit_params(workload, layout, shape.largest_layer_params) / layout.tp
    frozen = frozen_weight_bytes(workload, precision)
    routed = routed_expert_params(workload) if layout.ep > 1 else 0.0
    w, g, o = model_states_bytes(params - routed / shards, precision, layout.dp_strategy,
                                 layout.dp, k, big, share, frozen)
    if routed:
        # Each expert-parallel rank holds 1/ep of the experts (split etp ways, the experts'
        # tensor parallel), replicated (or sharded) over the tp × dp / (etp × ep) ranks
        # holding the same ones (Megatron's expert data-parallel group)
        we, ge, oe = model_states_bytes(expert_params_per_gpu(workload, layout), precision,
                                        layout.dp_strategy,
                                        expert_data_parallel(workload, layout),
                                        k, 0.0, share, frozen)
        w, g, o = w + we, g + ge, o + oe
    m = micro_batch if micro_batch is not None else (config.micro_batch or workload.micro_batch
                                                     or 1)
    act = activation_scale * _activations(workload, config, layout, precision, m, shape)
    # keys and values travel at 16 bits under FP8 too (attention runs in bf16)
    kv = context.buffer_bytes(workload, layout, m, COMM_ELEMENT_BYTES[precision])
    allocated = w + g + o + act + kv
    workspace = CONTEXT_BYTES + ALLOCATOR_OVERHEAD * allocated
    gathered = 0.0 if workload.largest_layer_params else gathered_bytes(
        params, precision, layout.dp_strategy, big, share)
    gathered_sigma = (GATHERED_SIGMA_ESTIMATED if any(
        n.startswith("largest layer estimated") for n in shape.assumptions)
        else GATHERED_SIGMA_ARCHITECTURE)
    sigma = math.sqrt((ACTIVATION_SIGMA[activation_source(workload)] * act) ** 2
                      + (activation_scale * _logits_sigma(workload, layout, m)) ** 2
                      + (gathered_sigma * gathered) ** 2
                      + (ALLOCATOR_SIGMA * allocated) ** 2 + CONTEXT_SIGMA_BYTES ** 2)
    return MemoryBreakdown(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o,
                           activations_bytes=act, workspace_bytes=workspace,
                           sigma_bytes=sigma, cp_buffers_bytes=kv)


def max_micro_batch_fitting(workload: Workload, config: ParallelConfig, layout: Layout,
                            capacity_bytes: float, shape: Shape | None = None,
                            activation_scale: float = 1.0) -> int:
    """Largest micro-batch whose memory fits ``capacity_bytes`` (0 if not even one).

    Memory is linear in the micro-batch, so this solves it rather than searching."""
    m0 = memory_at(workload, config, layout, capacity_bytes, 0, shape, activation_scale).total_bytes
    m1 = memory_at(workload, config, layout, capacity_bytes, 1, shape, activation_scale).total_bytes
    return largest_fitting(m0, m1, capacity_bytes)


def activation_scale_to_fit(memory: MemoryBreakdown, capacity_bytes: float) -> float:
    """The factor on the activations that brings ``memory`` (computed at scale 1) within
    ``capacity_bytes`` with the usual workspace margin: 1.0 when it fits already, 0.0 when the
    model states alone do not fit. The allocator's share grows with the activations, so the
    activations shrink by what is over ÷ (1 + ALLOCATOR_OVERHEAD)."""
    over = memory.total_bytes - capacity_bytes
    if over <= 0:
        return 1.0
    act = memory.activations_bytes
    if act <= 0:
        return 0.0
    # A hair under the exact factor, so rounding cannot push the observed run back over.
    return max(0.0, 1.0 - over / ((1.0 + ALLOCATOR_OVERHEAD) * act) - 1e-9)


def largest_fitting(m0: float, m1: float, capacity_bytes: float) -> int:
    """Largest m with ``m0 + (m1 − m0)·m <= capacity`` (memory at micro-batch 0 and 1)."""
    slope = m1 - m0
    if m1 > capacity_bytes:
        return 0
    if slope <= 0:
        return 1 << 30
    return int(max(0, math.floor((capacity_bytes - m0) / slope + 1e-9)))
