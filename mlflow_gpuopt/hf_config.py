"""A Hugging Face ``config.json`` read as a workload: parameters and model FLOPs from its shape.

Decoder-only language models of the families below, as ``transformers`` builds them
(``AutoModelForCausalLM.from_config``): Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Phi-3
(gated MLP, RMSNorm), GPT-2, GPT-NeoX, Falcon and Phi (GELU MLP, LayerNorm), and the
mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE (routed gated experts, a router, Qwen2-MoE's
gated shared expert; docs/models.md#mixture-of-experts), GPT-OSS (biased attention with sinks,
biased router and experts, alternating sliding-window layers), and DeepSeek-V2/V3 (multi-head
latent attention, dense first layers, shared experts; docs/metrics.md#deepseek-latent-attention).
The count is
the model's own: embeddings (tied or not), attention with grouped-query key/value heads and
``head_dim`` where the config gives it, the MLP (three matrices gated, two not), every norm,
the biases each family has, learned positions (GPT-2) and the LM head.

FLOPs per sample follow the profile's convention (docs/metrics.md, ``gpuopt.flops_per_sample``:
model FLOPs, what ``FlopCounterMode`` counts over a step): 6·N·T + 12·L·T²·(heads × head_dim)
(6·L·T²·heads × (query/key head + value head) under latent attention),
with N the weights of the matrix products: every linear layer and the LM head once (tied or
not), not the input embedding (a gather) nor norms and biases (element-wise); in a MoE layer
the router, the ``experts_per_token`` experts a token visits and the shared expert (the
active weights: memory counts them all). Sequence length
T is the training one (``--seq-len``), never ``max_position_embeddings``.

Pure: a parsed JSON document in, a ``workload.json`` document out; every problem is a
:class:`HfConfigError` (a ``ValueError``) of one line naming the file and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.perfmodel.compute import attended_keys
from mlflow_gpuopt.validation import BOUNDS

#: The ``model_type`` values read, by the family whose layout they have.
GATED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")
GELU_FAMILIES = ("gpt2", "gpt_neox", "falcon", "phi")
#: Mixtures of experts whose attention is a Llama-layout decoder's.
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
#: Mixtures of experts with multi-head latent attention (MLA) and dense first layers.
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")
FAMILIES = GATED_FAMILIES + GELU_FAMILIES + MOE_FAMILIES + MLA_FAMILIES
#: Families refused with the reason (none at present).
_REFUSED: dict[str, str] = {}
#: Older spellings of a family's ``model_type``, and ``architectures`` class-name prefixes.
_TYPE_ALIASES = {"refinedweb": "falcon", "refinedwebmodel": "falcon", "gptneox": "gpt_neox",
                 "kimi_k2": "deepseek_v3"}  # Kimi K2: DeepseekV3ForCausalLM
_ARCH_PREFIXES = (("Mixtral", "mixtral"), ("GptOss", "gpt_oss"), ("Qwen2Moe", "qwen2_moe"),
                  ("Qwen3Moe", "qwen3_moe"),
                  ("DeepseekV2", "deepseek_v2"), ("DeepseekV3", "deepseek_v3"),
                  ("GPTNeoX", "gpt_neox"), ("GPT2", "gpt2"), ("Gemma2", "gemma2"),
                  ("Gemma", "gemma"), ("Qwen3", "qwen3"), ("Qwen2", "qwen2"),
                  ("Phi3", "phi3"), ("Phi", "phi"), ("Mistral", "mistral"),
                  ("Llama", "llama"), ("Falcon", "falcon"), ("RW", "falcon"))
#: Keys that only a workload file has: a document with them is read as one.
_WORKLOAD_ONLY_KEYS = ("params", "flops_per_sample")
#: Vocabularies of published models reach ~2.6e5 rows; 1e8 is no tokenizer.
_MAX_VOCAB = 1e8
#: ``torch_dtype`` (``dtype`` in newer configs) -> the precision planned; a checkpoint stored
#: in float32 (or stating nothing) is planned in bf16 mixed precision, the usual for training.
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


class HfConfigError(ValueError):
    """A ``config.json`` that cannot be read as a workload; one line, names where."""


@dataclass(frozen=True)
class DecoderShape:
    """One decoder's shape, as its family lays it out (counts; bytes nowhere)."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    gated_mlp: bool
    tied_embeddings: bool
    norm_params_per_layer: int  # weights and biases of a layer's norms (q/k norms included)
    final_norm_params: int
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    lm_head_bias: bool = False
    position_rows: int = 0  # learned absolute position embeddings (GPT-2)
    dropout: float = 0.0  # the largest dropout probability the family applies
    #: Mixture of experts (0: dense): routed experts per MoE layer, each gated of
    #: ``expert_ffn_hidden_size``, ``experts_per_token`` of them per token, plus a shared
    #: expert of ``shared_ffn_hidden_size`` (0: none) behind a sigmoid gate where
    #: ``shared_expert_gate``; every ``moe_layer_freq``-th layer is a MoE layer.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_hidden_size: int = 0
    shared_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    moe_layer_freq: int = 1
    #: dense decoder layers before the first MoE one (DeepSeek's ``first_k_dense_replace``)
    first_dense_layers: int = 0
    #: group-limited routing (DeepSeek's ``n_group`` / ``topk_group``; 0: none): a token's
    #: experts inside ``expert_groups_per_token`` of ``expert_groups`` blocks of experts
    expert_groups: int = 0
    expert_groups_per_token: int = 0
    #: Multi-head latent attention (DeepSeek-V2/V3; 0: none): keys and values from a
    #: ``kv_lora_rank`` latent (plus a shared ``qk_rope_head_dim`` rotary key), queries from a
    #: ``q_lora_rank`` latent (0: projected directly); ``head_dim`` is a query/key head's
    #: width (non-rotary + rotary), ``v_head_dim`` a value head's.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    #: biases on the router and on every routed expert's projections (GPT-OSS)
    expert_bias: bool = False
    #: one learned attention-sink logit per query head and layer (GPT-OSS)
    attention_sinks: bool = False
    #: sliding-window attention: ``sliding_window_layers`` of the layers attend to the
    #: ``sliding_window`` tokens before each query only (0: every layer attends to all)
    sliding_window: int = 0
    sliding_window_layers: int = 0

    @property
    def value_head_dim(self) -> int:
        """A value head's width: ``v_head_dim`` under latent attention, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        """Decoder layers whose MLP is a mixture of experts: after the ``first_dense_layers``,
        layer i when (i+1) % freq == 0."""
        if self.num_experts <= 1:
            return 0
        return (self.num_layers - self.first_dense_layers) // self.moe_layer_freq

    @property
    def expert_weights(self) -> int:
        """Weights of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_ffn_hidden_size

    @property
    def expert_biases(self) -> int:
        """Biases of one routed expert (GPT-OSS: gate and up, 2 × width, and down, hidden)."""
        return 2 * self.expert_ffn_hidden_size + self.hidden_size if self.expert_bias else 0

    @property
    def moe_mlp_params(self) -> int:
        """One MoE layer's MLP: router, every routed expert, the shared expert and its gate."""
        return (self.num_experts * self.hidden_size
                + (self.num_experts if self.expert_bias else 0)
                + self.num_experts * (self.expert_weights + self.expert_biases)
                + 3 * self.hidden_size * self.shared_ffn_hidden_size
                + (self.hidden_size if self.shared_expert_gate else 0))

    @property
    def moe_mlp_active_weights(self) -> int:
        """The MoE layer's weights one token multiplies: router, top-k experts, shared."""
        return (self.num_experts * self.hidden_size
                + self.experts_per_token * self.expert_weights
                + 3 * self.hidden_size * self.shared_ffn_hidden_size
                + (self.hidden_size if self.shared_expert_gate else 0))

    @property
    def routed_expert_params(self) -> int:
        """Every routed expert of every MoE layer (what expert parallelism shards)."""
        return self.moe_layers * self.num_experts * self.expert_weights

    @property
    def attention_weights(self) -> int:
        """Weights of one layer's Q, K, V and output projections (under latent attention:
        ``q_a``/``q_b`` or ``q_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj`` and ``o_proj``)."""
        if self.kv_lora_rank:
            h, a, qk, r = self.hidden_size, self.num_heads, self.head_dim, self.kv_lora_rank
            q = (h * self.q_lora_rank + self.q_lora_rank * a * qk if self.q_lora_rank
                 else h * a * qk)
            kv = h * (r + self.qk_rope_head_dim) \
                + r * a * (qk - self.qk_rope_head_dim + self.value_head_dim)
            return q + kv + a * self.value_head_dim * h
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size

    @property
    def mlp_weights(self) -> int:
        """Weights of one layer's MLP: gate, up and down projections, or up and down."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.ffn_hidden_size

    @property
    def _attention_block_params(self) -> int:
        """A layer's attention with its biases, and its norms."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        biases = ((q + 2 * kv) if self.qkv_bias else 0) + (self.hidden_size if self.out_bias
                                                           else 0)
        if self.kv_lora_rank:  # attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj
            biases = (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
                      + self.hidden_size) if self.qkv_bias else 0
        sinks = self.num_heads if self.attention_sinks else 0
        return self.attention_weights + biases + sinks + self.norm_params_per_layer

    @property
    def layer_params(self) -> int:
        """One dense decoder layer, biases and norms included."""
        biases = 0
        if self.mlp_bias:
            biases += (2 if self.gated_mlp else 1) * self.ffn_hidden_size + self.hidden_size
        return self._attention_block_params + self.mlp_weights + biases

    @property
    def moe_layer_params(self) -> int:
        """One MoE decoder layer, its experts all counted."""
        return self._attention_block_params + self.moe_mlp_params

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embeddings."""
        return (self.vocab_size + self.position_rows) * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's own parameters: none when tied to the embedding (its bias aside)."""
        weights = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return weights + (self.vocab_size if self.lm_head_bias else 0)

    @property
    def params(self) -> int:
        """Every parameter, a tied matrix once (``sum(p.numel() for p in model.parameters())``)."""
        dense = self.num_layers - self.moe_layers
        return (self.embedding_params + dense * self.layer_params
                + self.moe_layers * self.moe_layer_params
                + self.final_norm_params + self.lm_head_params)

    @property
    def active_params(self) -> int:
        """The parameters one token uses: ``params`` less the routed experts it skips."""
        skipped = self.moe_layers * (self.num_experts - self.experts_per_token)
        return self.params - skipped * (self.expert_weights + self.expert_biases)

    @property
    def matmul_weights(self) -> int:
        """N of 6·N·T: the weights every token multiplies, the LM head once, tied or not."""
        dense = self.num_layers - self.moe_layers
        return (self.num_layers * self.attention_weights + dense * self.mlp_weights
                + self.moe_layers * self.moe_mlp_active_weights
                + self.vocab_size * self.hidden_size)

    def attended_keys(self, seq_len: int) -> float:
        """Keys per query summed over the layers, sliding-window ones at their band
        (:func:`.perfmodel.compute.attended_keys`, which the attention share uses too)."""
        return attended_keys(self.num_layers, seq_len, self.sliding_window,
                             self.sliding_window_layers)

    def flops_per_sample(self, seq_len: int) -> float:
        """Model FLOPs of forward + backward for one sequence of ``seq_len`` tokens:
        6·N·T + 6·L·T²·heads × (head_dim + value head_dim) (the scores and their weighted
        sum, forward and backward, over the whole T × T square as ``FlopCounterMode`` counts
        them; 12·L·T²·heads × head_dim where the two widths are one), a sliding-window
        layer's T² its T × min(T, 2·window) (:meth:`attended_keys`)."""
        t = float(seq_len)
        return (6.0 * self.matmul_weights * t
                + 6.0 * self.attended_keys(seq_len) * t * self.num_heads
                * (self.head_dim + self.value_head_dim))

    @property
    def largest_unit_params(self) -> int:
        """The largest FSDP unit when each decoder layer is wrapped on its own (torchtitan's
        and HF accelerate's default): one layer, or the embedding / LM head matrix."""
        layer = self.moe_layer_params if self.moe_layers else self.layer_params
        return max(layer, self.vocab_size * self.hidden_size)


def is_hf_config(doc: Any) -> bool:
    """True for a Hugging Face ``config.json``: ``model_type`` or ``architectures`` and none
    of a workload file's own keys (``params``, ``flops_per_sample``)."""
    return (isinstance(doc, Mapping) and ("model_type" in doc or "architectures" in doc)
            and not any(k in doc for k in _WORKLOAD_ONLY_KEYS))


def family_of(doc: Mapping[str, Any], where: str) -> str:
    """The family whose layout ``doc`` has, from ``model_type`` or ``architectures``."""
    raw = doc.get("model_type")
    if isinstance(raw, str) and raw.strip():
        name = raw.strip().lower().replace("-", "_")
        name = _TYPE_ALIASES.get(name, name)
    else:
        archs = doc.get("architectures")
        first = archs[0] if isinstance(archs, list) and archs else None
        name = next((fam for prefix, fam in _ARCH_PREFIXES
                     if isinstance(first, str) and first.startswith(prefix)), repr(first))
    if name in _REFUSED:
        raise HfConfigError(f"{where}: model_type {name!r}: {_REFUSED[name]}; write a "
                            "workload.json (docs/metrics.md) instead")
    if name not in FAMILIES:
        if isinstance(doc.get("text_config"), Mapping):
            raise HfConfigError(f"{where}: model_type {name!r} keeps its language model in "
                                "'text_config'; give that part as its own config.json")
        raise HfConfigError(f"{where}: model_type {name!r} is not a family read here "
                            f"({', '.join(FAMILIES)}); write a workload.json "
                            "(docs/metrics.md) instead")
    return name


def _count(doc: Mapping[str, Any], keys: tuple[str, ...], where: str,
           default: int | None = None, high: float = 1e7) -> int:
    """The first of ``keys`` present, a whole number in 1..``high``; ``default`` if none is."""
    for key in keys:
        if doc.get(key) is not None:
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise HfConfigError(f"{where}: {key!r} must be a whole number, got "
                                    f"{_short(value)}")
            if not math.isfinite(value) or value != int(value) or not 1 <= value <= high:
                raise HfConfigError(f"{where}: {key!r} must be a whole number from 1 to "
                                    f"{high:g}, got {_short(value)}")
            return int(value)
    if default is None:
        raise HfConfigError(f"{where}: missing {keys[0]!r} (a config.json of this family "
                            "states it)")
    return default


def _flag(doc: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HfConfigError(f"{where}: {key!r} must be true or false, got {_short(value)}")
    return value


def _probability(doc: Mapping[str, Any], keys: tuple[str, ...], default: float,
                 where: str) -> float:
    """The largest of the dropout probabilities ``keys`` (``default`` for absent ones)."""
    out = 0.0
    for key in keys:
        value = doc.get(key, default)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < 1:
            raise HfConfigError(f"{where}: {key!r} must be a probability from 0 to below 1, "
                                f"got {_short(value)}")
        out = max(out, float(value))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def decoder_shape(doc: Mapping[str, Any], where: str = "config.json") -> DecoderShape:
    """The shape of the decoder ``doc`` describes (see the module doc for the families),
    with its sliding-window layers (:func:`_sliding_window`)."""
    shape = _decoder_shape(doc, where)
    window, windowed = _sliding_window(doc, shape, where)
    if not windowed:
        return shape
    return DecoderShape(**{**shape.__dict__, "sliding_window": window,
                           "sliding_window_layers": windowed})


#: Families whose layers alternate sliding-window and full attention when the config lists no
#: ``layer_types``: ``transformers`` makes layer i a sliding one when i is even.
_ALTERNATING_WINDOW = ("gpt_oss", "gemma2")


def _sliding_window(doc: Mapping[str, Any], shape: DecoderShape, where: str
                    ) -> tuple[int, int]:
    """(window in tokens, layers that use it) as ``transformers`` builds the model: the
    config's ``layer_types`` where it lists them (``"sliding_attention"`` entries); else
    every layer for Mistral and Mixtral with a ``sliding_window``, every other layer for
    GPT-OSS and Gemma 2, and for Qwen2/Qwen3 (and their MoE) with ``use_sliding_window`` the
    layers from ``max_window_layers`` on; (0, 0) without a window."""
    family = shape.family
    raw = doc.get("sliding_window")
    if raw in (None, 0) or family in ("gpt2", "gpt_neox", "falcon", "phi", "gemma") \
            or family in MLA_FAMILIES:
        return 0, 0
    window = _count(doc, ("sliding_window",), where, high=BOUNDS["tokens_per_sample"].high)
    layers = shape.num_layers
    types = doc.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers \
                or not all(isinstance(t, str) for t in types):
            raise HfConfigError(f"{where}: 'layer_types' must list one attention type per "
                                f"layer ({layers}), got {_short(types)}")
        return window, sum(t == "sliding_attention" for t in types)
    if family in ("mistral", "mixtral"):
        return window, layers
    if family in _ALTERNATING_WINDOW:
        return window, (layers + 1) // 2
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") \
            and _flag(doc, "use_sliding_window", False, where):
        first = doc.get("max_window_layers")
        first = 0 if first in (None, 0) else _count(doc, ("max_window_layers",), where,
                                                     high=BOUNDS["num_layers"].high)
        return window, max(0, layers - first)
    return 0, 0


def _decoder_shape(doc: Mapping[str, Any], where: str) -> DecoderShape:
    family = family_of(doc, where)
    if family == "gpt2":
        h = _count(doc, ("n_embd", "hidden_size"), where)
        heads = _count(doc, ("n_head", "num_attention_heads"), where, high=h)
        layers = _count(doc, ("n_layer", "num_hidden_layers"), where, high=BOUNDS[
            "num_layers"].high)
        shape = dict(num_layers=layers, hidden_size=h, num_heads=heads, num_kv_heads=heads,
                     head_dim=_head_dim(h, heads, None, where),
                     ffn_hidden_size=_count(doc, ("n_inner",), where, default=4 * h),
                     vocab_size=_count(doc, ("vocab_size",), where, high=_MAX_VOCAB),
                     gated_mlp=False, tied_embeddings=_flag(doc, "tie_word_embeddings", True,
                                                            where),
                     norm_params_per_layer=4 * h, final_norm_params=2 * h, qkv_bias=True,
                     out_bias=True, mlp_bias=True,
                     position_rows=_count(doc, ("n_positions", "max_position_embeddings"),
                                          where, high=BOUNDS["tokens_per_sample"].high),
                     dropout=_probability(doc, ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
                                          0.1, where))
        return DecoderShape(family=family, **shape)
    h = _count(doc, ("hidden_size", "n_embd"), where)
    layers = _count(doc, ("num_hidden_layers", "n_layer"), where,
                    high=BOUNDS["num_layers"].high)
    heads = _count(doc, ("num_attention_heads", "n_head"), where, high=h)
    vocab = _count(doc, ("vocab_size",), where, high=_MAX_VOCAB)
    if family in GATED_FAMILIES:
        return _gated_shape(doc, family, h, layers, heads, vocab, where)
    if family in MOE_FAMILIES:
        return _moe_shape(doc, family, h, layers, heads, vocab, where)
    if family in MLA_FAMILIES:
        return _mla_shape(doc, family, h, layers, heads, vocab, where)
    if family == "gpt_neox":
        bias = _flag(doc, "attention_bias", True, where)
        return DecoderShape(
            family=family, num_layers=layers, hidden_size=h, num_heads=heads,
            num_kv_heads=heads, head_dim=_head_dim(h, heads, None, where),
            ffn_hidden_size=_count(doc, ("intermediate_size",), where, default=4 * h),
            vocab_size=vocab, gated_mlp=False,
            tied_embeddings=_flag(doc, "tie_word_embeddings", False, where),
            norm_params_per_layer=4 * h, final_norm_params=2 * h, qkv_bias=bias,
            out_bias=bias, mlp_bias=True,
            dropout=_probability(doc, ("hidden_dropout", "attention_dropout"), 0.0, where))
    if family == "falcon":
        return _falcon_shape(doc, h, layers, heads, vocab, where)
    # phi (Phi-1/1.5/2): parallel attention and MLP behind one LayerNorm, biases everywhere
    kv = _count(doc, ("num_key_value_heads",), where, default=heads, high=heads)
    d = _head_dim(h, heads, None, where)
    qk_norm = 4 * d if _flag(doc, "qk_layernorm", False, where) else 0
    return DecoderShape(
        family=family, num_layers=layers, hidden_size=h, num_heads=heads,
        num_kv_heads=_kv_heads(heads, kv, where), head_dim=d,
        ffn_hidden_size=_count(doc, ("intermediate_size",), where, default=4 * h),
        vocab_size=vocab, gated_mlp=False,
        tied_embeddings=_flag(doc, "tie_word_embeddings", False, where),
        norm_params_per_layer=2 * h + qk_norm, final_norm_params=2 * h, qkv_bias=True,
        out_bias=True, mlp_bias=True, lm_head_bias=True,
        dropout=_probability(doc, ("resid_pdrop", "embd_pdrop", "attention_dropout"), 0.0,
                             where))


def _gated_shape(doc: Mapping[str, Any], family: str, h: int, layers: int, heads: int,
                 vocab: int, where: str) -> DecoderShape:
    """Llama-layout decoders: RMSNorm (weights only), gated MLP, rotary positions."""
    kv = _count(doc, ("num_key_value_heads",), where, default=heads, high=heads)
    gemma = family in ("gemma", "gemma2")
    d = _head_dim(h, heads, doc.get("head_dim") if doc.get("head_dim") is not None
                  else (256 if gemma else None), where)
    attn_bias = _flag(doc, "attention_bias", False, where)
    norms = (4 if family == "gemma2" else 2) * h + (2 * d if family == "qwen3" else 0)
    dropout_keys = ("attention_dropout",) + (("resid_pdrop", "embd_pdrop")
                                             if family == "phi3" else ())
    return DecoderShape(
        family=family, num_layers=layers, hidden_size=h, num_heads=heads,
        num_kv_heads=_kv_heads(heads, kv, where), head_dim=d,
        ffn_hidden_size=_count(doc, ("intermediate_size",), where),
        vocab_size=vocab, gated_mlp=True,
        tied_embeddings=_flag(doc, "tie_word_embeddings", gemma, where),
        norm_params_per_layer=norms, final_norm_params=h,
        qkv_bias=attn_bias or family == "qwen2",  # Qwen2 always biases Q, K and V
        out_bias=attn_bias and family != "qwen2",
        mlp_bias=family == "llama" and _flag(doc, "mlp_bias", False, where),
        dropout=_probability(doc, dropout_keys, 0.0, where))


def _moe_shape(doc: Mapping[str, Any], family: str, h: int, layers: int, heads: int,
               vocab: int, where: str) -> DecoderShape:
    """Mixtral (every layer MoE, experts of ``intermediate_size``), Qwen2-MoE (Q/K/V biases,
    a gated shared expert) and Qwen3-MoE (q/k norms): Llama-layout attention; GPT-OSS
    (:func:`_gpt_oss_shape`)."""
    if family == "gpt_oss":
        return _gpt_oss_shape(doc, h, layers, heads, vocab, where)
    base = _gated_shape(doc, "qwen3" if family == "qwen3_moe" else "mistral", h, layers,
                        heads, vocab, where)
    if family == "mixtral":
        experts = _count(doc, ("num_local_experts", "num_experts"), where, default=8)
        k = _count(doc, ("num_experts_per_tok",), where, default=2, high=experts)
        width = _count(doc, ("intermediate_size",), where)
        shared, freq, gate = 0, 1, False
    else:
        experts = _count(doc, ("num_experts", "num_local_experts"), where,
                         default=60 if family == "qwen2_moe"
                         else 128)
        k = _count(doc, ("num_experts_per_tok",), where,
                   default=4 if family == "qwen2_moe" else 8, high=experts)
        width = _count(doc, ("moe_intermediate_size",), where,
                       default=1408 if family == "qwen2_moe" else 768)
        shared = _count(doc, ("shared_expert_intermediate_size",), where, default=5632) \
            if family == "qwen2_moe" else 0
        gate = family == "qwen2_moe"
        freq = _count(doc, ("decoder_sparse_step",), where, default=1, high=layers)
        if doc.get("mlp_only_layers"):
            raise HfConfigError(f"{where}: 'mlp_only_layers' (dense layers out of the "
                                "decoder_sparse_step pattern) is not read here; write a "
                                "workload.json instead")
    qkv_bias = family == "qwen2_moe" and _flag(doc, "qkv_bias", True, where)
    return DecoderShape(**{
        **base.__dict__, "family": family, "qkv_bias": qkv_bias or base.qkv_bias and
        family == "qwen3_moe", "out_bias": base.out_bias and family == "qwen3_moe",
        "mlp_bias": False, "num_experts": experts, "experts_per_token": k,
        "expert_ffn_hidden_size": width, "shared_ffn_hidden_size": shared,
        "shared_expert_gate": gate, "moe_layer_freq": freq})


def _gpt_oss_shape(doc: Mapping[str, Any], h: int, layers: int, heads: int, vocab: int,
                   where: str) -> DecoderShape:
    """GPT-OSS as ``transformers`` builds it (``GptOssForCausalLM``): grouped-query attention
    of ``head_dim``-wide heads (heads × head_dim apart from the hidden size) with biases on
    Q, K, V and O (``attention_bias``) and one learned sink logit per head; every layer a
    MoE layer of ``num_local_experts`` gated experts of ``intermediate_size``
    (``num_experts_per_tok`` per token), each projection with its bias, behind a router with
    a bias; RMSNorm; untied embeddings. Its sliding-window layers: :func:`_sliding_window`."""
    kv = _count(doc, ("num_key_value_heads",), where, default=heads, high=heads)
    experts = _count(doc, ("num_local_experts", "num_experts"), where)
    k = _count(doc, ("num_experts_per_tok", "experts_per_token"), where, high=experts)
    attn_bias = _flag(doc, "attention_bias", True, where)
    return DecoderShape(
        family="gpt_oss", num_layers=layers, hidden_size=h, num_heads=heads,
        num_kv_heads=_kv_heads(heads, kv, where),
        head_dim=_head_dim(h, heads, doc.get("head_dim"), where),
        ffn_hidden_size=_count(doc, ("intermediate_size",), where), vocab_size=vocab,
        gated_mlp=True, tied_embeddings=_flag(doc, "tie_word_embeddings", False, where),
        norm_params_per_layer=2 * h, final_norm_params=h, qkv_bias=attn_bias,
        out_bias=attn_bias, mlp_bias=False,
        dropout=_probability(doc, ("attention_dropout",), 0.0, where),
        num_experts=experts, experts_per_token=k,
        expert_ffn_hidden_size=_count(doc, ("intermediate_size",), where),
        expert_bias=True, attention_sinks=True)


def _mla_shape(doc: Mapping[str, Any], family: str, h: int, layers: int, heads: int,
               vocab: int, where: str) -> DecoderShape:
    """DeepSeek-V2/V3 as ``transformers`` builds them: multi-head latent attention (its
    latents RMS-normed), ``first_k_dense_replace`` dense layers of ``intermediate_size``,
    then MoE layers of ``n_routed_experts`` gated experts of ``moe_intermediate_size``
    (``num_experts_per_tok`` per token), ``n_shared_experts`` of that width and a router.
    The multi-token-prediction layers (``num_nextn_predict_layers``) are not in that model
    and not counted."""
    v3 = family == "deepseek_v3"
    if _flag(doc, "mlp_bias", False, where):
        raise HfConfigError(f"{where}: 'mlp_bias' true is not read here for {family}; write "
                            "a workload.json instead")
    freq = _count(doc, ("moe_layer_freq",), where, default=1, high=layers)
    if freq != 1:
        raise HfConfigError(f"{where}: 'moe_layer_freq' {freq} is not read here (transformers "
                            "makes every layer after first_k_dense_replace a MoE layer); write "
                            "a workload.json instead")
    experts = _count(doc, ("n_routed_experts", "num_local_experts", "num_experts"), where,
                     default=256 if v3 else 64)
    k = _count(doc, ("num_experts_per_tok",), where, default=8 if v3 else None, high=experts)
    first = doc.get("first_k_dense_replace")
    first = 0 if first in (None, 0) else _count(doc, ("first_k_dense_replace",), where,
                                                 high=layers)
    kv_rank = _count(doc, ("kv_lora_rank",), where, default=512)
    q_rank = 0 if "q_lora_rank" in doc and doc["q_lora_rank"] is None else _count(
        doc, ("q_lora_rank",), where, default=1536)
    rope = _count(doc, ("qk_rope_head_dim",), where, default=64)
    nope = _count(doc, ("qk_nope_head_dim",), where, default=128)
    v_dim = _count(doc, ("v_head_dim",), where, default=128)
    width = _count(doc, ("moe_intermediate_size",), where, default=2048 if v3 else 1407)
    n_shared = doc.get("n_shared_experts")
    n_shared = 0 if n_shared in (None, 0) else _count(doc, ("n_shared_experts",), where,
                                                       high=experts)
    groups = _count(doc, ("n_group",), where, default=1, high=experts)
    asked = doc.get("topk_group")
    if groups == 1 and isinstance(asked, (int, float)) and not isinstance(asked, bool) \
            and asked > 1:
        raise HfConfigError(f"{where}: 'topk_group' {_short(asked)} needs 'n_group' (the "
                            f"expert groups it picks from), got {_short(doc.get('n_group'))}")
    per_token = _count(doc, ("topk_group",), where, default=groups, high=groups)
    if groups > 1 and (experts % groups or k > per_token * (experts // groups)):
        raise HfConfigError(f"{where}: 'n_group' {groups} and 'topk_group' {per_token} do not "
                            f"split {experts} experts with {k} per token")
    return DecoderShape(
        family=family, num_layers=layers, hidden_size=h, num_heads=heads, num_kv_heads=heads,
        head_dim=nope + rope, ffn_hidden_size=_count(doc, ("intermediate_size",), where),
        vocab_size=vocab, gated_mlp=True,
        tied_embeddings=_flag(doc, "tie_word_embeddings", False, where),
        norm_params_per_layer=2 * h + q_rank + kv_rank, final_norm_params=h,
        qkv_bias=_flag(doc, "attention_bias", False, where), out_bias=False, mlp_bias=False,
        dropout=_probability(doc, ("attention_dropout",), 0.0, where),
        num_experts=experts, experts_per_token=k, expert_ffn_hidden_size=width,
        shared_ffn_hidden_size=n_shared * width, first_dense_layers=first,
        kv_lora_rank=kv_rank, q_lora_rank=q_rank, qk_rope_head_dim=rope, v_head_dim=v_dim,
        **({"expert_groups": groups, "expert_groups_per_token": per_token}
           if 1 <= per_token < groups else {}))


def _falcon_shape(doc: Mapping[str, Any], h: int, layers: int, heads: int, vocab: int,
                  where: str) -> DecoderShape:
    """Falcon: fused QKV (multi-query in 7B, grouped in the new decoder architecture),
    parallel attention and MLP, GELU MLP of ``ffn_hidden_size`` (4 × hidden)."""
    new_arch = _flag(doc, "new_decoder_architecture", False, where)
    if new_arch:
        kv = _count(doc, ("num_kv_heads",), where, default=heads, high=heads)
    elif _flag(doc, "multi_query", True, where):
        kv = 1
    else:
        kv = heads
    parallel = _flag(doc, "parallel_attn", True, where)
    if new_arch:
        norms = _count(doc, ("num_ln_in_parallel_attn",), where, default=2, high=2)
    else:
        norms = 1 if parallel else 2
    bias = _flag(doc, "bias", False, where)
    return DecoderShape(
        family="falcon", num_layers=layers, hidden_size=h, num_heads=heads,
        num_kv_heads=_kv_heads(heads, kv, where), head_dim=_head_dim(h, heads, None, where),
        ffn_hidden_size=_count(doc, ("ffn_hidden_size",), where, default=4 * h),
        vocab_size=vocab, gated_mlp=False,
        tied_embeddings=_flag(doc, "tie_word_embeddings", True, where),
        norm_params_per_layer=2 * h * norms, final_norm_params=2 * h, qkv_bias=bias,
        out_bias=bias, mlp_bias=bias,
        dropout=_probability(doc, ("hidden_dropout", "attention_dropout"), 0.0, where))


def _head_dim(h: int, heads: int, given: Any, where: str) -> int:
    """``head_dim`` as given, else hidden / heads, which must then divide evenly."""
    if given is not None:
        return _count({"head_dim": given}, ("head_dim",), where, high=h * 4)
    if h % heads:
        raise HfConfigError(f"{where}: num_attention_heads ({heads}) must divide hidden_size "
                            f"({h})")
    return h // heads


def _kv_heads(heads: int, kv: int, where: str) -> int:
    if heads % kv:
        raise HfConfigError(f"{where}: num_key_value_heads ({kv}) must divide "
                            f"num_attention_heads ({heads})")
    return kv


def _precision(doc: Mapping[str, Any]) -> tuple[str, bool]:
    """(precision planned, whether the config stated it)."""
    raw = doc.get("torch_dtype", doc.get("dtype"))
    if isinstance(raw, str) and raw.strip().lower().removeprefix("torch.") in _DTYPES:
        return _DTYPES[raw.strip().lower().removeprefix("torch.")], True
    return "bf16", False


def workload_doc(doc: Mapping[str, Any], seq_len: int, *, name: str,
                 where: str = "config.json") -> tuple[dict[str, Any], tuple[str, ...]]:
    """The ``workload.json`` document (docs/metrics.md) of the decoder ``doc`` trained on
    sequences of ``seq_len`` tokens, and the notes that say what was derived or assumed."""
    shape = decoder_shape(doc, where)
    params = shape.params
    if not BOUNDS["params"].contains(params):
        raise HfConfigError(f"{where}: this shape has {params:.3g} parameters; a real model "
                            f"has {BOUNDS['params'].text()} ({BOUNDS['params'].why})")
    flops = shape.flops_per_sample(seq_len)
    if not BOUNDS["flops_per_sample"].contains(flops):
        raise HfConfigError(f"{where}: this shape at --seq-len {seq_len} is {flops:.3g} FLOPs "
                            f"per sample; a real workload has {BOUNDS['flops_per_sample'].text()}")
    precision, stated = _precision(doc)
    mlp = ("geglu" if shape.family in ("gemma", "gemma2") else "swiglu") if shape.gated_mlp \
        else "gelu"
    out = {
        "name": name, "params": params, "trainable_params": params,
        "flops_per_sample": flops, "precision": precision, "tokens_per_sample": seq_len,
        "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
        "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
        "ffn_hidden_size": shape.ffn_hidden_size, "mlp": mlp,
        "vocab_size": shape.vocab_size, "dropout": shape.dropout,
        "largest_layer_params": shape.largest_unit_params,
    }
    if shape.kv_lora_rank:
        # latent attention's Q, K, V per token, as the attention kernel keeps them
        out["qkv_width"] = shape.num_heads * (2 * shape.head_dim + shape.value_head_dim)
    elif shape.head_dim * shape.num_heads != shape.hidden_size:
        # heads wider (or narrower) than the hidden size: Q at heads × head_dim, K and V at
        # key/value heads × head_dim (the attention's share of the FLOPs, the activations)
        out["qkv_width"] = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    if shape.sliding_window_layers:
        out["sliding_window"] = shape.sliding_window
        out["sliding_window_layers"] = shape.sliding_window_layers
    if shape.moe_layers:
        dense = shape.num_layers - shape.moe_layers
        active_width = shape.experts_per_token * shape.expert_ffn_hidden_size \
            + shape.shared_ffn_hidden_size
        out.update({
            "num_experts": shape.num_experts, "experts_per_token": shape.experts_per_token,
            "num_shared_experts": round(shape.shared_ffn_hidden_size
                                        / shape.expert_ffn_hidden_size),
            "expert_ffn_hidden_size": shape.expert_ffn_hidden_size,
            "moe_layer_freq": shape.moe_layer_freq,
            **({"first_dense_layers": shape.first_dense_layers}
               if shape.first_dense_layers else {}),
            **({"num_expert_groups": shape.expert_groups,
                "expert_groups_per_token": shape.expert_groups_per_token}
               if shape.expert_groups else {}),
            # the activation formula's MLP width: what one token's MLP holds, per layer
            "ffn_hidden_size": round((dense * shape.ffn_hidden_size
                                      + shape.moe_layers * active_width) / shape.num_layers),
        })
    notes = [
        f"workload from a Hugging Face config.json ({shape.family}): {params / 1e9:.3g} B "
        f"parameters ({'tied' if shape.tied_embeddings else 'untied'} embeddings), "
        f"{flops:.3g} FLOPs per {seq_len}-token sample (6·N·T + 12·L·T²·h, "
        f"N = {shape.matmul_weights / 1e9:.3g} B matrix-product weights)",
        f"precision {precision} " + ("(the config's torch_dtype)" if stated else
                                     "(default: the config states no bf16/fp16 torch_dtype)"),
    ]
    if shape.moe_layers:
        notes.append(
            f"mixture of experts: {shape.moe_layers} of {shape.num_layers} layers route each "
            f"token to {shape.experts_per_token} of {shape.num_experts} experts"
            + (f" and a shared expert ({shape.shared_ffn_hidden_size} wide)"
               if shape.shared_ffn_hidden_size else "")
            + (f", inside {shape.expert_groups_per_token} of {shape.expert_groups} expert "
               "groups (n_group, topk_group)" if shape.expert_groups else "")
            + f"; FLOPs from the {shape.active_params / 1e9:.3g} B active parameters "
            f"(router included), memory from all {params / 1e9:.3g} B")
    if shape.sliding_window_layers:
        full = seq_len <= 2 * shape.sliding_window
        notes.append(
            f"sliding-window attention: {shape.sliding_window_layers} of {shape.num_layers} "
            f"layers attend to the {shape.sliding_window} tokens before each query"
            + (f" (at {seq_len} tokens the window covers the sequence: no FLOPs saved)" if full
               else "; their attention FLOPs count T × 2·window, not T²"))
    if shape.kv_lora_rank:
        a = shape.num_heads
        qkv = a * (2 * shape.head_dim + shape.value_head_dim)
        notes.append(
            f"multi-head latent attention: {a} heads, query/key head {shape.head_dim} wide "
            f"({shape.qk_rope_head_dim} rotary), value head {shape.value_head_dim}, key/value "
            f"latent {shape.kv_lora_rank}" + (f", query latent {shape.q_lora_rank}"
                                              if shape.q_lora_rank else "")
            + f"; FLOPs count these widths, the activation formula Q, K and V at {qkv} "
            f"per token (qkv_width; the latents, {shape.q_lora_rank + shape.kv_lora_rank} "
            "wide, and the output projection's wider input are not counted)")
        if shape.first_dense_layers:
            notes.append(f"the first {shape.first_dense_layers} layers are dense "
                         f"(first_k_dense_replace, MLP {shape.ffn_hidden_size} wide)")
        mtp = doc.get("num_nextn_predict_layers")
        if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
            notes.append(f"num_nextn_predict_layers {mtp}: the multi-token-prediction layers "
                         "are not in the transformers model and not counted")
    elif shape.head_dim * shape.num_heads != shape.hidden_size:
        notes.append(f"heads × head_dim ({shape.num_heads} × {shape.head_dim}) is not "
                     f"hidden_size ({shape.hidden_size}): FLOPs and attention's share of them "
                     "count the heads' width, the activation formula Q, K and V at "
                     f"{(shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim} per "
                     "token (qkv_width)")
    return out, tuple(notes)
