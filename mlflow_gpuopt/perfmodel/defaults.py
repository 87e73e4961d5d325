"""The defaults a prediction uses where the workload does not give a quantity, each with its
value, where it comes from and its own spread (see docs/models.md#defaults).

The most specific information wins: a measured figure (the profile) is no default at all; a
transformer's architecture (layers, hidden size, sequence length, heads, FFN, vocabulary)
derives DRAM traffic, kernels per micro-step and the largest layer; only without it do the
FLOPs-only fallbacks apply, and those are ``fallback`` defaults: their spread widens the
prediction's interval (:meth:`.predictor.Predictor.predict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.memory import DEFAULT_OPTIMIZER_STATE_BYTES, transformer_dims
from mlflow_gpuopt.perfmodel.shape import Shape
from mlflow_gpuopt.perfmodel.types import Workload

#: Kinds of default whose value changes the step time (the others change memory only).
SPEED_KINDS = ("traffic", "kernels", "optimizer")


@dataclass(frozen=True)
class Default:
    """One quantity the prediction had to assume: ``value`` in ``unit``, from ``source``;
    ``log_spread`` is the standard deviation of log(value) the source leaves; ``fallback``
    marks a FLOPs-only estimate (the architecture was not known), which widens the interval."""

    kind: str  # traffic | kernels | optimizer | largest_layer | activations | shape
    quantity: str
    value: float
    unit: str
    source: str
    log_spread: float
    fallback: bool = False

    def describe(self) -> str:
        """The default in words: quantity, value, where from."""
        if not self.value and not self.unit:
            return f"default {self.quantity}: {self.source}"
        return f"default {self.quantity}: {_fmt(self.value, self.unit)}, from {self.source}"

    def as_dict(self) -> dict:
        """The JSON form (``predict --json``'s ``defaults``)."""
        return {"kind": self.kind, "quantity": self.quantity, "value": self.value,
                "unit": self.unit, "source": self.source, "log_spread": self.log_spread,
                "fallback": self.fallback}


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1e9:.3g} GB"
    if unit == "s":
        return f"{value * 1e3:.3g} ms"
    return f"{value:,.4g} {unit}".rstrip()


def workload_defaults(workload: Workload, shape: Shape, optimizer_assumed: bool
                      ) -> tuple[Default, ...]:
    """Every default the models take for ``workload`` (at its own precision)."""
    out: list[Default] = []
    p = workload.precision
    source = compute.traffic_source(workload)
    traffic = compute.memory_traffic_bytes_per_sample(workload, p)
    per = compute.TRAFFIC_PER_ACTIVATION_BYTE
    if source == "measured activations":
        out.append(Default("traffic", "DRAM traffic per sample", traffic, "bytes",
                           f"{per:g} x the measured activations "
                           "(compute.TRAFFIC_PER_ACTIVATION_BYTE)",
                           unc.SIGMA_TRAFFIC_ARCHITECTURE))
    elif source == "architecture":
        out.append(Default("traffic", "DRAM traffic per sample", traffic, "bytes",
                           f"{per:g} x the activation formula's bytes of the architecture "
                           "(Korthikanti et al. 2022; compute.TRAFFIC_PER_ACTIVATION_BYTE)",
                           unc.SIGMA_TRAFFIC_ARCHITECTURE))
    elif source == "flops":
        out.append(Default("traffic", "DRAM traffic per sample", traffic, "bytes",
                           f"FLOPs / {compute.DEFAULT_FLOPS_PER_TRAFFIC_BYTE_FP32:g} at fp32 "
                           "activations: architecture not known (give num_layers, hidden_size, "
                           "tokens_per_sample, num_heads)",
                           unc.SIGMA_TRAFFIC_FROM_FLOPS, fallback=True))
    count, how = compute.kernel_count(workload)
    if how == "architecture":
        out.append(Default("kernels", "kernels per micro-step", count, "",
                           f"{compute.KERNELS_PER_LAYER_STEP} per decoder layer x "
                           f"{workload.num_layers} layers + {compute.KERNELS_OUTSIDE_LAYERS} "
                           "(eager PyTorch; compute.KERNELS_PER_LAYER_STEP)",
                           unc.SIGMA_KERNELS_ARCHITECTURE))
    elif how == "flat":
        out.append(Default("kernels", "host overhead per micro-step",
                           compute.MICRO_STEP_OVERHEAD_S, "s",
                           "flat compute.MICRO_STEP_OVERHEAD_S: kernels not counted and "
                           "architecture not known", unc.SIGMA_KERNELS_FLAT, fallback=True))
    if optimizer_assumed:
        out.append(Default("optimizer", "optimizer state", DEFAULT_OPTIMIZER_STATE_BYTES,
                           "bytes/param", "optimizer unknown: Adam's m and v in fp32",
                           math.log(2.0)))
    if not workload.largest_layer_params:
        arch = any(n.startswith("largest layer") and "decoder block" in n
                   for n in shape.assumptions)
        out.append(Default("largest_layer", "largest layer", shape.largest_layer_params,
                           "params", "one decoder block of the architecture" if arch else
                           "2 x params / layers", 0.1 if arch else unc.SIGMA_SHAPE_ESTIMATE,
                           fallback=not arch))
    if not workload.activation_bytes_per_sample:
        if transformer_dims(workload) is not None:
            head = (" with fp32 logits of the vocabulary" if workload.vocab_size else "")
            out.append(Default("activations", "activations", 0.0, "",
                               "transformer activation formula (Korthikanti et al. 2022)"
                               + head, 0.1))
        else:
            out.append(Default("activations", "activations",
                               compute.activation_bytes_per_sample(workload, p)[0], "bytes",
                               "DRAM traffic / 6: architecture not known",
                               unc.SIGMA_TRAFFIC_FROM_FLOPS, fallback=True))
    for note in shape.assumptions:
        if not note.startswith("largest layer"):
            out.append(Default("shape", note.split(" estimated")[0], 0.0, "", note,
                               unc.SIGMA_SHAPE_ESTIMATE, fallback=True))
    return tuple(out)


def perturbed(workload: Workload, default: Default, factor: float) -> Workload:
    """``workload`` with ``default``'s quantity set to its value × ``factor`` (a speed
    default; others unchanged), to see how far the default moves a prediction."""
    if default.kind == "traffic":
        return replace(workload, memory_traffic_bytes_per_sample=default.value * factor)
    if default.kind == "kernels" and default.unit == "s":
        return replace(workload, kernels_per_micro_step=default.value * factor
                       / compute.KERNEL_DISPATCH_S)
    if default.kind == "kernels":
        return replace(workload, kernels_per_micro_step=default.value * factor)
    if default.kind == "optimizer":
        return replace(workload, optimizer_state_bytes_per_param=default.value / factor)
    return workload
