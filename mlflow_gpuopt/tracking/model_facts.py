"""Facts about the model and optimizer the profile records: parameter counts, the largest
layer, adapters, precision, optimizer state, the convolutions' memory format, whether it
is ``torch.compile``d.

Each reads the live objects once, after or during the profiled step (field meanings:
docs/metrics.md#artifacts-and-profilejson).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def count_params(model: Any) -> tuple[int, int]:
    """(total, trainable) parameter counts, shared parameters counted once."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable


def adapter_of(model: Any) -> str | None:
    """``"lora"`` when the model holds LoRA adapters under PEFT's module names
    (``lora_A``/``lora_B``), ``"qlora"`` when some sit on 4-bit base layers (bitsandbytes'
    ``Linear4bit``); else ``None``."""
    lora = four_bit = False
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_A", "lora_B"):
            lora = True
        if "4bit" in type(module).__name__:
            four_bit = True
    if not lora:
        return None
    return "qlora" if four_bit else "lora"


def memory_format_of(model: Any) -> str | None:
    """``"channels_last"`` when the weights of the model's 2-D convolutions (``Conv2d``,
    4-D) are stored channels-last (``model.to(memory_format=torch.channels_last)``; PyTorch
    then runs those convolutions channels-last), ``"contiguous"`` when they are not; None
    for a model without 2-D convolutions. The weights decide (a convolution's output takes
    the channels-last format of its weight or its input), by majority of those whose strides
    tell the formats apart: a 1×1 kernel's weight is both at once. A weight whose strides
    cannot be read (a sharded or subclassed tensor) does not vote."""
    import torch

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    if not convs:
        return None
    votes = []
    for m in convs:
        w = getattr(m, "weight", None)
        try:
            if w is None or w.dim() != 4:
                continue
            last = w.is_contiguous(memory_format=torch.channels_last)
            if last != w.is_contiguous():
                votes.append(last)
        except Exception as exc:  # a DTensor / flat-parameter view: leave it out
            logger.debug("gpuopt: memory format of %s not readable: %s", type(m).__name__, exc)
    return "channels_last" if 2 * sum(votes) > len(votes) else "contiguous"


def largest_leaf_params(model: Any) -> int | None:
    best = None
    for m in model.modules():
        if next(m.children(), None) is None:
            n = sum(p.numel() for p in m.parameters(recurse=False))
            if n and (best is None or n > best):
                best = n
    return best


def detect_precision(model: Any, device_type: str) -> str:
    """Precision the forward runs in: autocast dtype if on, else the parameters' dtype."""
    import torch

    try:
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    except Exception as exc:  # older torch or an unknown device type
        logger.debug("gpuopt: autocast query failed: %s", exc)
    p = next(iter(model.parameters()), None) if model is not None else None
    dtype = p.dtype if p is not None else torch.float32
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    from mlflow_gpuopt.tracking.ops_seen import tf32_matmul_flags

    if tf32_matmul_flags():  # on any device: the plan's GPUs would run TF32
        return "tf32"
    if device_type == "cuda":
        has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
        if has_conv and torch.backends.cudnn.allow_tf32:
            return "tf32"
    return "fp32"


def optimizer_state_bytes_per_param(optimizer: Any) -> float | None:
    """Bytes of optimizer state per trainable parameter (Adam fp32: ~8), after a step."""
    import torch

    n_params = 0
    state_bytes = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            n_params += p.numel()
            for v in optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    state_bytes += v.numel() * v.element_size()
    return state_bytes / n_params if n_params else None


def storage_ptr(t: Any) -> int | None:
    """Address of a tensor's storage; ``None`` for storage it cannot show (FSDP2's freed
    unsharded parameters, DTensors, tensor subclasses)."""
    try:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.untyped_storage().data_ptr()
    except Exception:  # not measurable: leave it out
        return None


def has_compiled_module(model: Any) -> bool:
    """Whether ``model`` or a submodule is ``torch.compile``d (``OptimizedModule``, or
    ``Module.compile()`` in place)."""
    if model is None:
        return False
    for m in model.modules():
        if type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None):
            return True
    return False

