"""The ranges a real training workload can have, in one place.

A value outside them is a corrupt file, a typo or an overflow, not a workload: 1e300 FLOPs per
sample "recommends" 4e287 hours, a micro-batch of 1e12 makes the search scan a trillion
divisors, and ``--epochs 1e200 --dataset-size 1e200`` overflows to infinity, which JSON cannot
hold. Every reader of user input (``workload.json``, observations CSV, a run's params and
``profile.json``, the target flags) checks with :func:`check` and reports one line.

Each bound is set one to two orders of magnitude beyond the largest real job we know of, so no
real workload is refused; the reason is written next to it.

Pure, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.errors import InputError

__all__ = ["BOUNDS", "Bound", "OutOfRangeError", "check", "finite_float", "short_repr"]


class OutOfRangeError(InputError):
    """A value no real workload has; the message is one line naming it and the range."""


@dataclass(frozen=True)
class Bound:
    """``low <= x <= high`` (``low < x`` when ``low_open``), with why these are the limits."""

    low: float
    high: float
    why: str
    low_open: bool = False

    def contains(self, value: float) -> bool:
        """True when ``value`` is a finite number inside the range."""
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def text(self) -> str:
        """The range in words: ``1 to 1e+14`` or ``> 0 and <= 1e+18``."""
        if self.low_open:
            return f"> {self.low:g} and <= {self.high:g}"
        return f"{self.low:g} to {self.high:g}"


#: Name (the workload key, observation column or run param without ``gpuopt.``) -> range.
BOUNDS: dict[str, Bound] = {
    # Largest trained models: dense ~5.4e11 (PaLM), mixture-of-experts ~1.6e12 (Switch-C).
    "params": Bound(1, 1e14, "the largest trained models have ~2e12 parameters"),
    "trainable_params": Bound(0, 1e14, "at most the model's parameters (<= 1e14)"),
    "largest_layer_params": Bound(0, 1e14, "at most the model's parameters (<= 1e14)"),
    # Forward + backward ≈ 6 · params · tokens + 12 · layers · hidden · tokens² per sample:
    # 1e12 params × 1e6 tokens = 6e18, and a 405B-shaped model's attention at a million-token
    # context (126 layers, hidden 16384) 2.5e19.
    "flops_per_sample": Bound(0, 1e21, "6 x 1e12 parameters x 1e6 tokens is 6e18, attention "
                              "at a million tokens ~3e19", low_open=True),
    # Per-GPU micro-batches reach ~1e5 rows for tiny recommender/tabular samples; the search
    # scans divisors of the per-GPU batch, so this also bounds its work.
    "micro_batch": Bound(1, 1e7, "per-GPU micro-batches of tiny samples reach ~1e5"),
    "grad_accum": Bound(1, 1e6, "accumulation beyond ~1e4 micro-steps is not used in practice"),
    # The largest training jobs run on ~1e5 GPUs (Llama 3: 16k H100; 100k-GPU clusters).
    "world_size": Bound(1, 1e6, "the largest training jobs use ~1e5 GPUs"),
    "gpu_count": Bound(1, 1e6, "the largest training jobs use ~1e5 GPUs"),
    "nodes": Bound(1, 1e6, "the largest training jobs use ~1e5 GPUs, so fewer nodes"),
    # One host (or NVLink domain: GB200 NVL72) holds at most 72 GPUs; a CPU run counts 0.
    "device_count": Bound(0, 1024, "one host or NVLink domain holds at most 72 GPUs"),
    # 1e-9 samples/s is one sample in 30 years; 1e12 is 1e6 GPUs × 1e6 tiny samples/s each.
    "throughput_samples_per_s": Bound(1e-9, 1e12,
                                      "1e-9 is one sample in 30 years; 1e12 is 1e6 GPUs at "
                                      "1e6 samples/s each"),
    # Context windows reach ~1e7 tokens.
    "tokens_per_sample": Bound(0, 1e8, "context windows reach ~1e7 tokens", low_open=True),
    # Adam keeps 8 B (m, v) + 4 B master copy per parameter; 64 leaves room for any optimizer.
    "optimizer_state_bytes_per_param": Bound(0, 64, "Adam keeps 12 bytes per parameter"),
    # ~34·hidden bytes per token per layer (Korthikanti et al.): 34 × 16384 × 126 layers ×
    # 1e6 tokens (a 405B-shaped model at a million-token context) is 7e16.
    "activation_bytes_per_sample": Bound(0, 1e18, "34 x hidden x layers x tokens stays "
                                                  "below 1e17 bytes"),
    "memory_traffic_bytes_per_sample": Bound(0, 1e22, "at most ~10 bytes per FLOP"),
    "matmul_traffic_bytes_per_sample": Bound(0, 1e22, "at most ~10 bytes per FLOP"),
    # Tacotron 2 at a 571-frame decoder: ~1.5e7 per micro-step; 1e15 is a billion GEMMs of
    # a million-long reduction.
    "gemm_reduction_per_micro_step": Bound(0, 1e15, "a sum of GEMM reduction lengths"),
    "amp_traffic_bytes_per_sample": Bound(0, 1e22, "at most ~10 bytes per FLOP"),
    "amp_matmul_traffic_bytes_per_sample": Bound(0, 1e22, "at most ~10 bytes per FLOP"),
    "nchw_conv_bytes_per_sample": Bound(0, 1e22, "at most ~10 bytes per FLOP"),
    # One tensor per parameter at the most: 1e12 parameters.
    "optimizer_param_tensors": Bound(0, 1e12, "at most one tensor per parameter"),
    # A recurrent decoder re-reads its weights every time step (Tacotron 2: ~700 passes):
    # 1e12 parameters × 4 bytes × 1e6 passes is 4e18.
    "weight_traffic_bytes_per_micro_step": Bound(0, 1e19, "1e12 fp32 parameters re-read 1e6 "
                                                          "times is 4e18 bytes"),
    # Micro-batches one run of the pipeline schedule takes: at most the accumulation's.
    "pp_microbatches": Bound(1, 1e6, "accumulation beyond ~1e4 micro-steps is not used in "
                                     "practice"),
    # A replay reruns at most the forward (a third of a step's model FLOPs): the same cap.
    "recompute_flops_per_sample": Bound(0, 1e21, "a replay reruns at most the forward"),
    # An eager step of a large model dispatches ~1e4–1e5 operators.
    "kernels_per_micro_step": Bound(0, 1e8, "an eager step launches ~1e5 kernels"),
    "amp_kernels_per_micro_step": Bound(0, 1e8, "an eager step launches ~1e5 kernels"),
    "num_layers": Bound(0, 1e5, "the deepest trained networks have ~1e3-1e4 layers"),
    "hidden_size": Bound(0, 1e7, "the widest models have hidden sizes ~3e4"),
    # Architecture counts of a workload file (a Hugging Face config.json is held to the same
    # ranges in hf_config): far beyond any published model, and below where the models'
    # arithmetic (float of an int, combinations of experts) overflows.
    "num_heads": Bound(0, 1e7, "at most the hidden size (the widest models ~3e4)"),
    "num_kv_heads": Bound(0, 1e7, "at most the query heads"),
    "vocab_size": Bound(0, 1e8, "vocabularies of published models reach ~2.6e5 rows"),
    "ffn_hidden_size": Bound(0, 1e7, "the widest feed-forward layers are ~1e5 wide"),
    "expert_ffn_hidden_size": Bound(0, 1e7, "the widest feed-forward layers are ~1e5 wide"),
    "qkv_width": Bound(0, 1e8, "a few times the hidden size (~3e4)"),
    "sliding_window": Bound(0, 1e9, "a window is at most the sequence (1e9 tokens)"),
    "sliding_window_layers": Bound(0, 1e5, "at most the layers"),
    # Fine-grained mixtures route over ~1e3 (DeepSeek-V3: 256) experts; 1e6-expert layers
    # are research prototypes.
    "num_experts": Bound(0, 1e7, "the most fine-grained mixtures have ~1e6 experts"),
    "experts_per_token": Bound(0, 1e7, "at most the routed experts"),
    "num_shared_experts": Bound(0, 1e7, "at most a few (DeepSeek: 1 or 2)"),
    "num_expert_groups": Bound(0, 1e7, "at most the routed experts (DeepSeek-V3: 8)"),
    "expert_groups_per_token": Bound(0, 1e7, "at most the groups (DeepSeek-V3: 4)"),
    "moe_layer_freq": Bound(0, 1e5, "at most the layers"),
    "first_dense_layers": Bound(0, 1e5, "below the layers"),
    # A capacity factor of the expert count drops no token; published ones are 1 to 2.
    "capacity_factor": Bound(0, 1e7, "published capacity factors are 1 to 2",
                             low_open=True),
    # Tensor parallelism stays inside one NVLink domain (GB200 NVL72: 72 GPUs).
    "expert_tensor_parallel": Bound(0, 1024, "a tensor-parallel degree stays inside one "
                                             "NVLink domain (at most 72 GPUs)"),
    # The largest runs train on ~1.5e13 tokens (Llama 3); a sample holds at least one token.
    "target_samples": Bound(0, 1e18, "the largest runs train on ~1.5e13 tokens",
                            low_open=True),
    # 1e6 hours is 114 years: a longer deadline is a typo.
    "deadline_hours": Bound(0, 1e6, "1e6 hours is 114 years", low_open=True),
}


def short_repr(value: Any, limit: int = 24) -> str:
    """``repr(value)``, shortened so a 5000-digit number does not become a 5000-character
    error line."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 8]}... ({len(text)} characters)"


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float — a number, or a numeric string as MLflow stores every
    param — else ``None`` (missing, ``""``, ``"None"``, a boolean, text, NaN or infinite):
    the one reader of "a number, if there is one" for params, metrics and JSON rows."""
    number = _as_float(value.strip() if isinstance(value, str) else value)
    return number if number is not None and math.isfinite(number) else None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
    except OverflowError:  # an int beyond float range (400 digits)
        return math.inf if value > 0 else -math.inf


def check(name: str, value: Any, *, where: str, label: str | None = None) -> float:
    """``value`` as a float when it lies in ``BOUNDS[name]``; else :class:`OutOfRangeError`
    whose one-line message reads ``{where}: {label} {value} is outside what a real workload
    has ({range}: {why})``. ``label`` defaults to ``'name'``."""
    bound = BOUNDS[name]
    number = _as_float(value)
    shown = label or repr(name)
    if number is None:
        raise OutOfRangeError(f"{where}: {shown} must be a number, got {short_repr(value)}")
    if not bound.contains(number):
        raise OutOfRangeError(
            f"{where}: {shown} = {short_repr(value)} is outside what a real workload has "
            f"({bound.text()}: {bound.why})")
    return number
