"""The global batch a language model's pre-training uses, from published practice.

A workload file (or a ``config.json``) says what one sample costs, not how many samples an
optimizer step takes; planned with the file's per-GPU ``micro_batch`` as the global batch,
an 8 B model gets one data-parallel rank's worth of batch, which no cluster can split, and
nothing meets a month's deadline. Pre-training batches are stated in tokens per step and grow
slowly with the model; the sizes here are those of GPT-3 (Brown et al. 2020, "Language
Models are Few-Shot Learners", Table 2.1: 0.5 M tokens for 125–760 M parameters, 1 M for
1.3–2.7 B, 2 M for 6.7–13 B, 3.2 M for 175 B). Published recipes agree within about 2×:
NVIDIA NeMo 24.07's Llama 3 8B/70B configurations train 128 × 8192 = 1 M tokens per step and
its GPT-3 5B/175B 2048 × 2048 = 4 M; Megatron-LM's 2024 H100 table 192–1152 × 4096 =
0.8–4.7 M for 1.7–177 B; torchtitan's Llama 3.1 8B/70B on 128–256 H100 256–512 × 8192 = 2–4 M
(NeMo's ``docs/source/performance/performance_summary.md``, Megatron-LM's README and
torchtitan's ``benchmarks/llama3_h100_202412_torchtitan.md``). docs/metrics.md says when a
plan uses it.

Pure: numbers in, a :class:`DerivedBatch` out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.types import Workload

#: (parameters, tokens per optimizer step) of GPT-3's models (Brown et al. 2020, Table 2.1).
GPT3_TOKENS_PER_STEP = ((125e6, 0.5e6), (350e6, 0.5e6), (760e6, 0.5e6), (1.3e9, 1e6),
                        (2.7e9, 1e6), (6.7e9, 2e6), (13e9, 2e6), (175e9, 3.2e6))


@dataclass(frozen=True)
class DerivedBatch:
    """A global batch chosen for pre-training: ``samples`` sequences per optimizer step,
    ``tokens_per_step`` of them, and ``why`` in words (the source and the rounding)."""

    samples: int
    tokens_per_step: float
    why: str


def tokens_per_step(params: float) -> tuple[float, float]:
    """(tokens per step, the GPT-3 model size it comes from) for a model of ``params``: the
    published model nearest in log size (sizes beyond the table take its end)."""
    size, tokens = min(GPT3_TOKENS_PER_STEP,
                       key=lambda row: abs(math.log(row[0]) - math.log(max(1.0, params))))
    return tokens, size


def pretraining_global_batch(workload: Workload) -> DerivedBatch | None:
    """The global batch to plan ``workload``'s pre-training with, or ``None`` where it is
    not a language model's pre-training: no sequence length (``tokens_per_sample``), or
    fewer trainable parameters than parameters (a fine-tune, which keeps its own batch).

    Sequences per step: the published tokens per step ÷ the sequence length, rounded to the
    nearest power of two (in log; at least 1), so that the GPU counts plans use (8 × 2ᵏ)
    divide it.
    """
    seq = workload.tokens_per_sample
    if not seq or seq <= 0:
        return None
    if workload.trainable_params is not None and workload.trainable_params < workload.params:
        return None
    tokens, size = tokens_per_step(workload.params)
    samples = 2 ** max(0, round(math.log2(tokens / seq)))
    return DerivedBatch(
        samples=samples, tokens_per_step=samples * seq,
        why=(f"{samples:,} sequences of {seq:,.0f} tokens = {samples * seq / 1e6:.2g} M tokens "
             f"per step, derived for LLM pre-training: GPT-3's {size / 1e9:.3g} B model "
             f"trained {tokens / 1e6:.2g} M tokens per step (Brown et al. 2020, Table 2.1), "
             "rounded to a power of two; the workload file gives no global batch "
             "(--global-batch N sets one, --keep-micro-batch keeps its micro-batch per GPU)"))


def larger_global_batch(workload: Workload, batch: int | None) -> int | None:
    """The global batch to try when ``batch`` binds (no plan meets the deadline): the
    pre-training one where it is larger, else 8 × ``batch`` (None without a batch)."""
    usual = pretraining_global_batch(workload)
    if usual is not None and usual.samples > (batch or 0):
        return usual.samples
    return 8 * batch if batch else None
