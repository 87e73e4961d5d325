"""Activation memory of a transformer from its architecture: the tensors one forward saves for
the backward, per GPU, following Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (arXiv 2205.05198), Sec. 4.

The paper counts, per layer and 16-bit activations with 1-byte dropout masks (Sec. 4.1),
``s·b·h·(34 + 5·a·s/h)`` bytes (s sequence, b micro-batch, h hidden, a heads). Written per
tensor in elements of ``e`` bytes and masks of ``d`` bytes, that is, in units of ``s·b·h``:

- attention block: LayerNorm input ``e``, QKV-projection input ``e``, Q, K and V ``3e`` (with
  grouped-query attention, below, ``(1 + 2·g)·e``), the output projection's input ``e``, the
  dropout mask after it ``d``; and for the scores
  (``a·s²·b`` elements each) the softmax output ``e``, and with attention dropout its mask
  ``d`` and its output ``e`` (the paper's ``5·a·s/h`` at e = 2, d = 1);
- MLP: LayerNorm input ``e``, first linear's input ``e``, its output (the activation's input)
  ``f·e`` and the activation's output ``f·e`` with ``f = ffn_hidden / h`` (4 in the paper),
  the dropout mask ``d``. A gated MLP (SwiGLU) keeps gate, activated gate, up projection and
  their product: ``4·f·e``;
- so ``16e + 2d`` = 34 at e = 2, d = 1, f = 4 (the paper's 34).

The paper leaves out LayerNorm's saved mean and 1/σ (fp32, 8 bytes per token per norm); they
are counted here, as PyTorch keeps them.

Grouped-query attention (Ainslie et al. 2023; Llama 2 70B, Llama 3, Mistral, Qwen) projects K
and V to ``k`` key/value heads of ``h/a`` each, ``k`` dividing ``a``: K and V hold
``g·h`` elements per token, ``g = k/a`` (multi-head attention is ``k = a``, ``g = 1``), and
their projection weights ``g·h²`` each. The kernels that take K and V at ``k`` heads —
PyTorch's SDPA with ``enable_gqa=True``, FlashAttention-2, Transformer Engine — save them at
that size: Q, K, V ``(1 + 2·g)·e``. Eager attention expands K and V to all ``a`` heads before
the score products (``repeat_kv`` in Hugging Face transformers, ``repeat_interleave`` in
Megatron's unfused attention), and those products save the expanded copies: ``3e`` as for
multi-head attention. Model code that expands K and V before calling SDPA (torchtitan's
Llama 3 ``repeat_kv``) makes SDPA save the expanded copies too; that is not modelled (``sdpa``
means the kernel's own GQA). Megatron's selective recomputation checkpoints the core
attention, the expansion included, so it keeps K and V at ``k`` heads whatever the kernel. The
scores and the log-sum-exp are per query head (``a``) either way; with tensor parallelism
``t`` is taken to divide ``k`` (Megatron requires it).

FlashAttention (PyTorch's SDPA flash / memory-efficient kernels, which SDPA picks by default)
never stores the ``a·s²`` scores: it keeps Q, K, V, its output (which is the output
projection's input, the same storage) and the softmax log-sum-exp, fp32, one per head per
token (``4·a`` bytes per token); attention dropout regenerates its mask from the RNG state.

Tensor parallelism with sequence parallelism divides everything by ``t`` (Sec. 4.2.2, the
paper's ``34/t``); without sequence parallelism the LayerNorm/dropout part (``4e + 2d``, the
paper's 10) is replicated (Sec. 4.2.1). Selective recomputation (Sec. 5) drops the score
tensors. Full recomputation keeps only each layer's input (``e`` per layer, ``/t`` with
sequence parallelism) and rebuilds one layer's activations at a time in the backward pass.

Per-op selective checkpointing (``selective-op``) is what torchtitan calls selective AC with
``selective_ac_option = "op"`` (its default for the Llama 3 configurations): every transformer
block runs under a checkpoint whose policy saves the outputs of ``aten.mm`` except every second
one, and of the SDPA kernels (and, with tensor parallelism, of the sequence-parallel
reduce-scatters), and recomputes everything else (torchtitan
``torchtitan/parallelisms/parallelize_llama.py``, ``_save_list`` and ``_custom_policy``:
"Saves output of all compute ops, except every second mm"). A layer then keeps its input
(``e·h``, saved by the checkpoint), the outputs of the 1st, 3rd, 5th... projection in the
order the forward runs them (Q, K, V, output projection, then fc1 [gate, up] and fc2), and
SDPA's output (``e·h``) with its log-sum-exp. For a SwiGLU MLP with f = 3.5 in bf16 that is
about 17·h bytes per token instead of ~44 (15.5·h and ~41 with Llama 3 8B's 8 key/value heads
of 32). In the backward the layer's other
tensors are rebuilt one layer at a time, as under full recomputation.

Outside the layers (Sec. 4.3): the first pipeline stage keeps the embedding's dropout mask
(``d``) and the token ids; the last keeps the final norm's input and the output projection's
input (``2e``), the targets, and what the cross-entropy keeps of the ``v``-wide logits, by
implementation (``cross_entropy``, split over ``t`` by a vocabulary-parallel loss):

- ``fp32``: ``F.cross_entropy`` on fp32 logits (an explicit ``.float()``, as torchtitan's loss
  does, or autocast, which runs the loss in fp32): ``log_softmax`` saves its fp32 output
  (``4·v`` per token); at the start of the backward ``nll_loss``'s gradient and
  ``log_softmax``'s (fp32, ``4·v`` each) are held beside it, so the peak at the loss is
  ``12·v`` per token;
- ``fused``: a fused loss that keeps one fp32 softmax and writes its gradient in place
  (Megatron's vocabulary-parallel cross-entropy, Transformer Engine's, flash-attn's):
  ``4·v`` per token, no more at the backward;
- ``chunked``: a loss that never holds the whole logits (Liger's fused linear cross-entropy,
  cut-cross-entropy, torchtune's chunked loss): nothing ``v``-wide is kept.

The backward's extra over what is stored (the loss's gradients, or one layer rebuilt under
full recomputation) is ``ActivationBytes.recompute_bytes``; the two are not held at once (the
loss's gradients are freed before the first layer is rebuilt), so the larger counts.

Context parallelism over ``c`` ranks keeps ``seq/c`` tokens of each sample on a GPU: every
per-token term above is held for ``b·s/c`` tokens (eager attention's scores would be
``s/c × s`` per head; context parallelism runs fused attention only).

With 1F1B pipelining the first stage holds ``min(p, accumulation steps)`` micro-batches of
its ``L/p`` layers in flight (Sec. 4.2.3); an interleaved schedule with ``v`` virtual stages
multiplies that by ``1 + (p − 1)/(p·v)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow_gpuopt.perfmodel.types import Workload

ATTENTION_KERNELS = ("flash", "eager")
RECOMPUTE_MODES = ("none", "selective", "full", "selective-op")
#: Other spellings of the recompute modes: torchtitan's per-op selective checkpointing
#: (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``).
_RECOMPUTE_ALIASES = {"op": "selective-op", "selective_op": "selective-op",
                      "per-op": "selective-op", "selective(per-op)": "selective-op",
                      "sac": "selective-op"}
#: Spellings of the attention kernels: SDPA picks flash or memory-efficient attention, both
#: of which store no scores.
_ATTENTION_ALIASES = {"sdpa": "flash", "flash": "flash", "flash_attention": "flash",
                      "flash-attention": "flash", "mem_efficient": "flash", "efficient": "flash",
                      "eager": "eager", "math": "eager"}
#: Bytes of a dropout mask element where the kernel stores a mask (CUDA's fused dropout keeps
#: a bool per element; PyTorch's CPU dropout keeps a mask in the input's dtype).
DROPOUT_MASK_BYTES_CUDA = 1.0
#: LayerNorm's saved mean and 1/σ, fp32, per token.
NORM_STATS_BYTES = 8.0
#: Token ids (int64) the embedding and the loss keep, per token each.
INDEX_BYTES = 8.0
#: The cross-entropy's log-probabilities are kept in fp32 whatever the activation precision.
LOGIT_BYTES = 4.0
#: Cross-entropy implementations (module docstring): (bytes per logit kept for the backward,
#: bytes per logit held beside them at the start of the backward).
CROSS_ENTROPY_BYTES = {"fp32": (LOGIT_BYTES, 2.0 * LOGIT_BYTES), "fused": (LOGIT_BYTES, 0.0),
                       "chunked": (0.0, 0.0)}
_CROSS_ENTROPY_ALIASES = {"float32": "fp32", "plain": "fp32", "torch": "fp32",
                          "materialised": "fp32", "materialized": "fp32", "liger": "chunked",
                          "cce": "chunked", "fused_crossentropy": "fused",
                          "vocab_parallel": "fused"}


@functools.lru_cache(maxsize=64)  # pure; the recommender asks thousands of times
def normalize_attention(name: str | None) -> str:
    """``flash`` or ``eager`` from ``sdpa``, ``flash``, ``eager``...; None means SDPA, which
    PyTorch runs with a flash/memory-efficient kernel."""
    if name is None or not str(name).strip():
        return "flash"
    key = str(name).strip().lower()
    if key not in _ATTENTION_ALIASES:
        raise ValueError(f"unknown attention kernel {name!r}; expected sdpa, flash or eager")
    return _ATTENTION_ALIASES[key]


def normalize_recompute(mode: str | None) -> str:
    """``none``, ``selective``, ``full`` or ``selective-op`` (None means none)."""
    if mode is None or not str(mode).strip():
        return "none"
    key = str(mode).strip().lower()
    key = _RECOMPUTE_ALIASES.get(key, key)
    if key not in RECOMPUTE_MODES:
        raise ValueError(f"unknown recompute mode {mode!r}; expected none, selective, full "
                         "or selective-op")
    return key


def normalize_cross_entropy(name: str | None) -> str | None:
    """``fp32``, ``fused`` or ``chunked`` (module docstring); None when not known."""
    if name is None or not str(name).strip():
        return None
    key = str(name).strip().lower()
    key = _CROSS_ENTROPY_ALIASES.get(key, key)
    if key not in CROSS_ENTROPY_BYTES:
        raise ValueError(f"unknown cross_entropy {name!r}; expected fp32, fused or chunked")
    return key


@dataclass(frozen=True)
class TransformerDims:
    """The architecture the formula needs; ``vocab_size`` None leaves the logits out."""

    num_layers: int
    hidden_size: float
    seq_len: float
    num_heads: int
    ffn_hidden_size: float
    gated_mlp: bool = False
    vocab_size: float | None = None
    #: key/value heads of grouped-query attention; None: ``num_heads`` (multi-head attention)
    num_kv_heads: int | None = None
    #: Q, K and V elements per token where the heads' widths are not hidden / heads (latent
    #: attention); None: ``(1 + 2 × kv_share) × hidden_size``
    qkv_width: float | None = None

    @property
    def kv_share(self) -> float:
        """K's (and V's) width as a share of the hidden size: key/value heads / query heads
        (1.0 for multi-head attention; at most 1)."""
        if not self.num_kv_heads or not self.num_heads:
            return 1.0
        return min(1.0, float(self.num_kv_heads) / float(self.num_heads))


@functools.lru_cache(maxsize=64)  # pure; the recommender asks thousands of times
def transformer_dims(workload: Workload) -> TransformerDims | None:
    """The architecture for the activation formula, or None when the profile does not give
    layers, hidden size and sequence length (heads default to hidden / 128, the common head
    width; the MLP to GELU at 4 × hidden, or SwiGLU at 8/3 × hidden)."""
    if not (workload.num_layers and workload.hidden_size and workload.tokens_per_sample):
        return None
    h = float(workload.hidden_size)
    gated = (workload.mlp or "gelu").strip().lower() in ("swiglu", "geglu", "gated", "glu")
    ffn = workload.ffn_hidden_size or (8.0 / 3.0 * h if gated else 4.0 * h)
    return TransformerDims(num_layers=int(workload.num_layers), hidden_size=h,
                           seq_len=float(workload.tokens_per_sample),
                           num_heads=int(workload.num_heads or max(1, round(h / 128))),
                           ffn_hidden_size=float(ffn), gated_mlp=gated,
                           vocab_size=float(workload.vocab_size) if workload.vocab_size else None,
                           num_kv_heads=int(workload.num_kv_heads) if workload.num_kv_heads
                           else None,
                           qkv_width=float(workload.qkv_width) if workload.qkv_width else None)


@dataclass(frozen=True)
class ActivationBytes:
    """Activation bytes on the busiest GPU for one micro-step, split by when they are held."""

    stored_bytes: float  # saved by the forward for the backward
    #: held beside them during the backward: one layer rebuilt (full/per-op recomputation) or
    #: the loss's gradients, whichever is larger
    recompute_bytes: float

    @property
    def peak_bytes(self) -> float:
        """What the GPU must hold at the peak of the backward pass."""
        return self.stored_bytes + self.recompute_bytes


def matmul_outputs_per_token(dims: TransformerDims) -> tuple[float, ...]:
    """Elements per token of each projection's output in one layer, in the order the forward
    computes them: Q, K, V, attention output, then the MLP (gate, up, down for SwiGLU as
    torchtitan's ``w2(silu(w1(x)) * w3(x))`` runs them; fc1, fc2 otherwise). K and V are
    ``h·k/a`` wide with ``k`` key/value heads (grouped-query attention; ``h`` without)."""
    h, ffn = float(dims.hidden_size), float(dims.ffn_hidden_size)
    kv = h * dims.kv_share
    mlp = (ffn, ffn, h) if dims.gated_mlp else (ffn, h)
    return (h, kv, kv, h) + mlp


def selective_op_bytes_per_token(dims: TransformerDims, element_bytes: float,
                                 tp: int = 1) -> float:
    """Bytes one layer keeps per token under per-op selective checkpointing (module
    docstring): the layer input, every other projection output (1st, 3rd...) and SDPA's
    output with its fp32 log-sum-exp, each split over ``tp`` ranks."""
    e, t = float(element_bytes), max(1, tp)
    saved = sum(n for i, n in enumerate(matmul_outputs_per_token(dims)) if i % 2 == 0)
    per_token = e * (float(dims.hidden_size) + saved + float(dims.hidden_size))
    return (per_token + LOGIT_BYTES * float(dims.num_heads)) / t


def selective_op_recompute_flops_per_token(dims: TransformerDims) -> float:
    """Forward FLOPs per token per layer rebuilt in the backward under per-op selective
    checkpointing: the projections whose outputs were not saved (2nd, 4th...), 2 FLOPs per
    weight; SDPA's output is saved, so attention is not rerun."""
    h, ffn = float(dims.hidden_size), float(dims.ffn_hidden_size)
    # weights of each projection, in forward order: Q and the output h x h, K and V h x h·k/a
    # (grouped-query attention), MLP ones h x ffn
    kv = h * h * dims.kv_share
    weights = (h * h, kv, kv, h * h) + (h * ffn,) * (3 if dims.gated_mlp else 2)
    return sum(2.0 * w for i, w in enumerate(weights) if i % 2 == 1)


def layer_bytes_per_token(dims: TransformerDims, element_bytes: float, mask_bytes: float,
                          attention: str, attention_dropout: bool, recompute: str = "none",
                          tp: int = 1, sequence_parallel: bool = True) -> float:
    """Bytes one layer saves per token of the micro-batch (see the module docstring)."""
    e, d, h, t = float(element_bytes), float(mask_bytes), float(dims.hidden_size), max(1, tp)
    f = dims.ffn_hidden_size / h
    mlp = (4.0 * f if dims.gated_mlp else 2.0 * f) * e
    # Q, K and V in units of h: K and V at k/a of h where they are kept at k heads (SDPA's
    # own GQA, or checkpointed eager attention); eager attention saves them expanded
    kv = dims.kv_share if attention == "flash" or recompute == "selective" else 1.0
    qkv = dims.qkv_width / h if dims.qkv_width else 1.0 + 2.0 * kv
    shardable = (qkv * e + e + mlp) * h  # Q, K, V, projection input, MLP inner tensors
    replicated = (4.0 * e + 2.0 * d) * h + 2.0 * NORM_STATS_BYTES  # norms' inputs, masks
    per_token = shardable / t + (replicated / t if sequence_parallel else replicated)
    a, s = float(dims.num_heads), float(dims.seq_len)
    if attention == "flash":
        per_token += LOGIT_BYTES * a / t  # fp32 log-sum-exp per head
    elif recompute == "none":  # eager scores; selective recomputation drops them
        per_token += a * s * (e + ((d + e) if attention_dropout else 0.0)) / t
    return per_token


def activation_bytes(dims: TransformerDims, micro_batch: float, element_bytes: float,
                     mask_bytes: float, *, attention: str = "flash",
                     attention_dropout: bool = True, recompute: str = "none", tp: int = 1,
                     pp: int = 1, grad_accum: int = 1, virtual_stages: int = 1,
                     sequence_parallel: bool = True, cross_entropy: str = "fused",
                     cp: int = 1) -> ActivationBytes:
    """Activation bytes of the busiest GPU (first or last pipeline stage) for ``micro_batch``
    samples of ``dims.seq_len`` tokens.

    ``mask_bytes`` is 0 for a model without dropout; ``attention_dropout`` says whether the
    scores are dropped out too (eager attention then keeps a mask and the dropped-out copy);
    ``cross_entropy`` is the loss's implementation (module docstring; ``fused`` keeps the
    fp32 log-probabilities the paper counts); ``cp`` is the context-parallel degree (each
    GPU holds ``seq/cp`` tokens of each sample).
    """
    kept_logit, loss_logit = CROSS_ENTROPY_BYTES[normalize_cross_entropy(cross_entropy)
                                                 or "fused"]
    attention = normalize_attention(attention)
    recompute = normalize_recompute(recompute)
    t, p = max(1, tp), max(1, pp)
    tokens = float(micro_batch) * float(dims.seq_len) / max(1, cp)
    h, e, d = float(dims.hidden_size), float(element_bytes), float(mask_bytes)
    full_layer = layer_bytes_per_token(dims, e, d, attention, attention_dropout,
                                       "none" if recompute in ("full", "selective-op")
                                       else recompute, t, sequence_parallel)
    if recompute == "full":
        kept_layer = e * h / (t if sequence_parallel else 1)
        working = full_layer * tokens
    elif recompute == "selective-op":
        kept_layer = selective_op_bytes_per_token(dims, e, t)
        working = full_layer * tokens
    else:
        kept_layer, working = full_layer, 0.0
    layers_per_stage = dims.num_layers / p
    embed = d * h / (t if sequence_parallel else 1) + INDEX_BYTES
    head = 2.0 * e * h / (t if sequence_parallel else 1) + NORM_STATS_BYTES + INDEX_BYTES
    loss = 0.0
    if dims.vocab_size:
        head += kept_logit * float(dims.vocab_size) / t
        loss = tokens * loss_logit * float(dims.vocab_size) / t
    if p == 1:
        stored = tokens * (dims.num_layers * kept_layer + embed + head)
        return ActivationBytes(stored_bytes=stored, recompute_bytes=max(working, loss))
    in_flight = min(p, max(1, int(grad_accum)))
    interleave = 1.0 + (p - 1) / (p * virtual_stages) if virtual_stages > 1 else 1.0
    first = tokens * in_flight * (layers_per_stage * kept_layer * interleave + embed)
    last = tokens * (layers_per_stage * kept_layer + head)
    stored = max(first, last)
    peak = max(first + working, last + max(working, loss))
    return ActivationBytes(stored_bytes=stored, recompute_bytes=peak - stored)


#: Share of a training micro-step's work that is the forward pass: the backward costs about
#: twice the forward (a gradient for the input and one for the weights per matmul), so full
#: recomputation, which runs the forward once more, makes a micro-step 4/3 as long
#: (Korthikanti et al. 2022, Sec. 6; Narayanan et al. 2021, Sec. 5.1).
FORWARD_SHARE = 1.0 / 3.0


def recompute_time_factor(recompute: str, attention: str, flops_per_sample: float,
                          dims: TransformerDims | None) -> float:
    """How much longer a micro-step runs with ``recompute`` than without.

    Full: the forward again (× 4/3), dispatch and weight reads included. Per-op selective
    (``selective-op``): the forward of the projections whose outputs were not saved
    (:func:`selective_op_recompute_flops_per_token` per token per layer). Selective: the
    forward of the score products QKᵀ and (softmax)·V, ``4·s²·h`` FLOPs per layer per sample,
    on top of ``flops_per_sample``; FlashAttention recomputes them in its backward anyway, so
    nothing is added there. None: 1.
    """
    recompute = normalize_recompute(recompute)
    if recompute == "full":
        return 1.0 + FORWARD_SHARE
    if recompute == "selective-op" and dims is not None and flops_per_sample > 0:
        extra = selective_op_recompute_flops_per_token(dims) * dims.num_layers * dims.seq_len
        return 1.0 + extra / flops_per_sample
    if recompute == "selective" and dims is not None and normalize_attention(attention) == \
            "eager" and flops_per_sample > 0:
        extra = 4.0 * dims.num_layers * dims.seq_len**2 * dims.hidden_size
        return 1.0 + extra / flops_per_sample
    return 1.0
