"""Dense peak FLOP/s of a GPU at a precision, for MFU.

Asks the catalog (``mlflow_gpuopt.catalog``) when it is there; otherwise a small table of
datasheet figures (dense, no sparsity; NVIDIA datasheets) for the common training GPUs.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# name fragment -> {precision: dense TFLOP/s}; checked in order, first match wins
_TABLE: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 SXM", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    ("H100 80GB HBM3", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    ("H100", {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0}),  # PCIe
    ("H200", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    ("A10G", {"fp32": 31.2, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "tf32": 8.1, "fp16": 65.0}),
)


def peak_flops_per_s(gpu_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of one ``gpu_name`` GPU at ``precision``; ``None`` when unknown/CPU."""
    if not gpu_name or gpu_name == "cpu":
        return None
    try:
        from mlflow_gpuopt.catalog import load_catalog  # built by the catalog work

        value = load_catalog().gpu(gpu_name).peak_tflops(precision)
        if value:
            return float(value) * 1e12
    except Exception as exc:  # no catalog yet, or the GPU is not in it
        logger.debug("gpuopt: catalog has no peak for %s/%s: %s", gpu_name, precision, exc)
    for fragment, peaks in _TABLE:
        if fragment.lower() in gpu_name.lower():
            value = peaks.get(precision)
            return value * 1e12 if value else None
    return None
