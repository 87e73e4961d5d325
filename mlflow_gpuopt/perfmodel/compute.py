"""Compute time of one micro-step on one GPU: ``T_grad(m) = a + b·m`` (Pollux).

The priors are a roofline: a sample's forward+backward FLOPs at the GPU's dense peak for the
precision in use, plus the bytes it moves through GPU memory at the memory bandwidth, each at
a typical efficiency. Summing the two (rather than taking the max) treats a step as a
sequence of kernels that are each either compute-bound (matmuls, convolutions) or
memory-bound (normalisations, element-wise ops); the share of each sets how a step scales
from one GPU type to another (Habitat's wave scaling, with the share read off the workload's
arithmetic intensity instead of a kernel trace). Observations then calibrate one scale per
GPU type and precision (see :mod:`.fitting`).
"""

from __future__ import annotations

import math

from mlflow_gpuopt.perfmodel.precision import (
    ELEMENT_BYTES,
    is_mixed,
    normalize_precision,
    peak_flops_per_s,
    uses_tensor_cores,
)
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

#: Share of dense peak reached by the FLOP-heavy kernels: plain FP32 (SIMT) units get closer
#: to their peak than tensor cores, whose peak assumes perfectly shaped matmuls.
COMPUTE_EFFICIENCY_SIMT = 0.6
COMPUTE_EFFICIENCY_TENSOR = 0.45
#: Share of datasheet memory bandwidth reached by streaming kernels.
MEMORY_EFFICIENCY = 0.75
#: DRAM bytes moved per byte of stored activations in a training step: written in forward,
#: read in backward, activation gradients written and read, plus normalisation passes.
TRAFFIC_PER_ACTIVATION_BYTE = 6.0
#: Arithmetic intensity assumed when the profile says nothing about memory (FLOPs per byte
#: of DRAM traffic with fp32 activations; halves the bytes at 16-bit).
DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32 = 30.0
#: Fixed cost of one micro-step: kernel launches, Python and framework overhead.
MICRO_STEP_OVERHEAD_S = 1.0e-3


def activation_bytes_per_sample(workload: Workload, precision: str) -> tuple[float, bool]:
    """Stored activations per sample at ``precision`` and whether the number was estimated.

    The profile's figure was measured at the workload's own precision; 16-bit activations are
    half the size of fp32/tf32 ones. Without a profile figure: traffic / 6.
    """
    p = normalize_precision(precision)
    if workload.activation_bytes_per_sample:
        own = normalize_precision(workload.precision)
        return workload.activation_bytes_per_sample * ELEMENT_BYTES[p] / ELEMENT_BYTES[own], False
    traffic = (workload.flops_per_sample / DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32
               * ELEMENT_BYTES[p] / 4.0)
    return traffic / TRAFFIC_PER_ACTIVATION_BYTE, True


def memory_traffic_bytes_per_sample(workload: Workload, precision: str) -> float:
    """DRAM bytes one sample moves in forward+backward at ``precision``."""
    p = normalize_precision(precision)
    if workload.memory_traffic_bytes_per_sample:
        own = normalize_precision(workload.precision)
        return workload.memory_traffic_bytes_per_sample * ELEMENT_BYTES[p] / ELEMENT_BYTES[own]
    act, _ = activation_bytes_per_sample(workload, p)
    return act * TRAFFIC_PER_ACTIVATION_BYTE


def per_sample_time_prior_s(workload: Workload, hardware: Hardware, precision: str) -> float:
    """``b``: seconds per sample per GPU from the roofline (compute + memory), uncalibrated."""
    peak = peak_flops_per_s(hardware.peak_flops_per_s, precision)
    eff = (COMPUTE_EFFICIENCY_TENSOR if uses_tensor_cores(hardware.peak_flops_per_s, precision)
           else COMPUTE_EFFICIENCY_SIMT)
    compute = workload.flops_per_sample / (peak * eff)
    memory = (memory_traffic_bytes_per_sample(workload, precision)
              / (hardware.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY))
    return compute + memory


def compute_share(workload: Workload, hardware: Hardware, precision: str) -> float:
    """Share of ``b`` that is FLOP-bound (the rest is memory-bound), in [0, 1]."""
    peak = peak_flops_per_s(hardware.peak_flops_per_s, precision)
    eff = (COMPUTE_EFFICIENCY_TENSOR if uses_tensor_cores(hardware.peak_flops_per_s, precision)
           else COMPUTE_EFFICIENCY_SIMT)
    compute = workload.flops_per_sample / (peak * eff)
    return compute / per_sample_time_prior_s(workload, hardware, precision)


def weight_bytes_per_param(precision: str) -> int:
    """Bytes of the weights the forward/backward reads (16-bit copies in mixed precision)."""
    return 2 if is_mixed(precision) else 4


def fixed_time_prior_s(params_per_gpu: float, hardware: Hardware, precision: str) -> float:
    """``a``: seconds per micro-step independent of batch: overhead + reading the weights twice
    (forward and backward) and writing their gradients."""
    w = weight_bytes_per_param(precision)
    traffic = params_per_gpu * (2 * w + w)
    return MICRO_STEP_OVERHEAD_S + traffic / (hardware.memory_bandwidth_bytes_per_s
                                              * MEMORY_EFFICIENCY)


def optimizer_time_prior_s(params_updated: float, optimizer_state_bytes_per_param: float,
                           hardware: Hardware, precision: str) -> float:
    """Seconds for one optimizer step over ``params_updated`` parameters (memory-bound):
    read+write the fp32 weights and the optimizer state, read the gradient, and write the
    16-bit copy in mixed precision."""
    per_param = 2 * (4 + optimizer_state_bytes_per_param) + 4 + (2 if is_mixed(precision) else 0)
    return params_updated * per_param / (hardware.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY)


def grad_time_s(a_s: float, b_s: float, micro_batch: float) -> float:
    """Pollux's ``T_grad(m) = a + b·m``: forward+backward of one micro-batch on one GPU."""
    return a_s + b_s * micro_batch


def mfu(workload: Workload, hardware: Hardware, precision: str, samples_per_s_per_gpu: float
        ) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over dense peak for ``precision``."""
    peak = peak_flops_per_s(hardware.peak_flops_per_s, precision)
    return workload.flops_per_sample * samples_per_s_per_gpu / peak if peak else math.nan
