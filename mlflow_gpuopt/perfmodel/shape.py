"""The model's shape (layers, hidden size, sequence length) where a term needs it.

Tensor-parallel and pipeline traffic, activation checkpointing and ZeRO-3's largest layer
depend on the shape; a profile that does not give it gets a transformer-like estimate from
the parameter count and FLOPs (the largest layer from the architecture where layers and
hidden size are given), and the estimate is named in the prediction's assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.types import Workload

#: GPT-family aspect ratio: hidden ≈ 100 × layers (GPT-2 64×, GPT-3 128×), so a dense
#: transformer with Ψ ≈ 12·L·h² has L ≈ (Ψ / 1.2e5)^(1/3).
_HIDDEN_PER_LAYER = 100.0


@dataclass(frozen=True)
class Shape:
    """Layers, hidden size and tokens per sample, and which of them were estimated."""

    num_layers: int
    hidden_size: float
    seq_len: float
    largest_layer_params: float
    assumptions: tuple[str, ...]


def decoder_block_params(workload: Workload) -> float | None:
    """Parameters of one transformer block from the architecture, or None without it: Q and
    the output projection ``h²`` each, K and V ``h²·k/a`` each (grouped-query attention), the
    MLP ``3·h·f`` gated (SwiGLU) or ``2·h·f``, two norms ``2h``. The unit per-block FSDP
    wrapping (torchtitan, Hugging Face's transformer auto-wrap) gathers at once."""
    from mlflow_gpuopt.perfmodel.activations import transformer_dims

    dims = transformer_dims(workload)
    if dims is None:
        return None
    h, f = dims.hidden_size, dims.ffn_hidden_size
    return (2.0 + 2.0 * dims.kv_share) * h * h + (3.0 if dims.gated_mlp else 2.0) * h * f \
        + 2.0 * h


def model_shape(workload: Workload) -> Shape:
    """Shape from the profile, filling the gaps with a dense-transformer estimate."""
    notes: list[str] = []
    params = float(workload.params)
    layers = workload.num_layers
    if not layers:
        layers = max(1, round((params / (12.0 * _HIDDEN_PER_LAYER**2)) ** (1.0 / 3.0)))
        notes.append(f"num_layers estimated as {layers} from {params:.3g} parameters")
    hidden = workload.hidden_size
    if not hidden:
        hidden = max(1.0, math.sqrt(params / (12.0 * layers)))
        notes.append(f"hidden_size estimated as {hidden:.0f} from parameters and layers")
    seq = workload.tokens_per_sample
    if not seq:
        seq = max(1.0, workload.flops_per_sample / (6.0 * params))
        notes.append(f"tokens_per_sample estimated as {seq:.0f} from FLOPs / (6 x params)")
    largest = workload.largest_layer_params
    if not largest:
        block = decoder_block_params(workload)
        if block:
            embedding = float(workload.vocab_size or 0) * float(workload.hidden_size or 0)
            largest = min(params, max(block, embedding))
            what = "one decoder block" if block >= embedding else "the token embedding"
            notes.append(f"largest layer {largest:.3g} parameters: {what} of the architecture "
                         "(the unit FSDP / ZeRO-3 gathers: a decoder block or the embedding, "
                         "whichever is larger)")
        else:
            largest = min(params, 2.0 * params / layers)
            notes.append("largest layer estimated as 2 x params / layers")
    return Shape(num_layers=int(layers), hidden_size=float(hidden), seq_len=float(seq),
                 largest_layer_params=float(largest), assumptions=tuple(notes))
