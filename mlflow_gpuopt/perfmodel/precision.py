"""Numeric precisions: bytes per element, which are mixed precision, and peak FLOP/s lookup."""

from __future__ import annotations

import functools

from collections.abc import Mapping

from mlflow_gpuopt.catalog.schema import PRECISIONS
from mlflow_gpuopt.perfmodel.errors import PerfModelError

#: Bytes of one activation / weight element stored in this precision (tf32 is stored as fp32).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

#: Bytes per activation element *stored for the backward pass*, per precision, relative to
#: which the profile's measured figure is rescaled. FP8 training as Transformer Engine and
#: torchao float8 run it casts only the inputs of the linear layers to FP8 (1 byte) and keeps
#: everything else (norms, attention with its softmax, residuals, activation functions) in
#: bf16. Of a transformer layer's 34·s·b·h bytes of 16-bit activations (Korthikanti et al.
#: 2022, without the s² attention term), the linear inputs are 14·s·b·h (QKV, attention
#: projection and fc1 inputs 2sbh each, fc2's input 8sbh); stored at 1 byte they save
#: 7·s·b·h: 27/34 of the bf16 bytes, i.e. 2 × 27/34 ≈ 1.6 bytes per element-equivalent.
ACTIVATION_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 2.0 * 27 / 34}
#: Bytes per element of activations and gradients on the wire between GPUs (tensor-parallel
#: all-reduces, pipeline sends): FP8 recipes communicate them in bf16.
COMM_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}

#: Precisions trained as "mixed precision" (low-precision compute, fp32 master weights).
MIXED = frozenset({"fp16", "bf16", "fp8"})

_ALIASES = {"amp": "fp16", "amp_fp16": "fp16", "float16": "fp16", "half": "fp16",
            "bfloat16": "bf16", "amp_bf16": "bf16", "float32": "fp32", "float": "fp32",
            "16-mixed": "fp16", "bf16-mixed": "bf16", "32": "fp32", "32-true": "fp32"}


@functools.lru_cache(maxsize=64)  # pure; the recommender asks thousands of times
def normalize_precision(precision: str) -> str:
    """``fp32|tf32|fp16|bf16|fp8`` from the usual spellings (``amp``, ``bfloat16``...)."""
    p = str(precision).strip().lower()
    p = _ALIASES.get(p, p)
    if p not in ELEMENT_BYTES:
        raise PerfModelError(
            f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    return p


def is_mixed(precision: str) -> bool:
    """True for fp16/bf16/fp8 training (fp32 master weights kept by the optimizer)."""
    return normalize_precision(precision) in MIXED


def peak_flops_per_s(peaks: Mapping[str, float], precision: str) -> float:
    """Dense peak FLOP/s for ``precision``, falling back the way the hardware does.

    TF32 falls back to FP32 where a GPU has no TF32 (V100, T4); BF16 and FP8 fall back to
    the FP32 rate where missing (a GPU without them emulates at best at that rate).
    """
    p = normalize_precision(precision)
    value = peaks.get(p)
    if not value:
        if p == "fp8":
            value = peaks.get("bf16") or peaks.get("fp16")
        value = value or peaks.get("fp32")
    if not value or value <= 0:
        raise PerfModelError(f"no peak FLOP/s known for precision {p!r}")
    return float(value)


def uses_tensor_cores(peaks: Mapping[str, float], precision: str) -> bool:
    """True when ``precision`` runs on a matrix unit faster than plain FP32 on this GPU."""
    fp32 = peaks.get("fp32") or 0.0
    return peak_flops_per_s(peaks, precision) > 1.2 * fp32 if fp32 else False
