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

FP8 (Transformer Engine, torchao float8) trains as bf16 mixed precision does: bf16 weights and
gradients, fp32 master weights and optimizer states, so the table's mixed-precision column
holds; on top, the FP8 copy of each weight the forward casts is kept for the backward (1 byte
per parameter of the shard, or of the gathered layer under ZeRO-3/FSDP). FP8 saves memory
only in the activations (linear-layer inputs, ``precision.ACTIVATION_BYTES``), not in the
model states.
"""

from __future__ import annotations

import math

from mlflow_gpuopt.perfmodel.compute import activation_bytes_per_sample
from mlflow_gpuopt.perfmodel.layout import Layout, resolve_layout
from mlflow_gpuopt.perfmodel.precision import is_mixed, normalize_precision
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
            shape: Shape | None = None) -> MemoryBreakdown:
    precision = normalize_precision(config.precision or workload.precision)
    shape = shape or model_shape(workload)
    shards = layout.tp * layout.pp
    k, _ = optimizer_state_bytes_per_param(workload)
    w, g, o = model_states_bytes(workload.params / shards, precision, layout.dp_strategy,
                                 layout.dp, k, shape.largest_layer_params / layout.tp)
    m = micro_batch if micro_batch is not None else (config.micro_batch or workload.micro_batch
                                                     or 1)
    act_per_sample, _ = activation_bytes_per_sample(workload, precision)
    act = act_per_sample * m / layout.tp
    if config.activation_checkpointing:
        act /= checkpointing_factor(shape.num_layers)
    workspace = CONTEXT_BYTES + FRAGMENTATION * (w + g + o + act)
    if hardware_memory_bytes:
        workspace += 0.02 * hardware_memory_bytes
    return MemoryBreakdown(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o,
                           activations_bytes=act, workspace_bytes=workspace)


def max_micro_batch_fitting(workload: Workload, config: ParallelConfig, layout: Layout,
                            capacity_bytes: float, shape: Shape | None = None) -> int:
    """Largest micro-batch whose memory fits ``capacity_bytes`` (0 if not even one).

    Memory is linear in the micro-batch, so this solves it rather than searching."""
    m0 = _memory(workload, config, layout, capacity_bytes, 0, shape).total_bytes
    m1 = _memory(workload, config, layout, capacity_bytes, 1, shape).total_bytes
    return largest_fitting(m0, m1, capacity_bytes)


def largest_fitting(m0: float, m1: float, capacity_bytes: float) -> int:
    """Largest m with ``m0 + (m1 − m0)·m <= capacity`` (memory at micro-batch 0 and 1)."""
    slope = m1 - m0
    if m1 > capacity_bytes:
        return 0
    if slope <= 0:
        return 1 << 30
    return int(max(0, math.floor((capacity_bytes - m0) / slope + 1e-9)))
