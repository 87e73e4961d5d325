"""The tracked model's architecture, as its own ``config`` declares it.

The performance model's transformer terms need layers, hidden size, heads, the MLP and the
vocabulary. A model that carries a configuration object says them; this module reads it,
duck-typed, and nothing else (module shapes are not guessed from): Hugging Face's
``PretrainedConfig`` (the names :data:`mlflow_gpuopt.workload_files.HF_CONFIG_NAMES` maps;
encoder-decoders' two stacks together), nanoGPT's ``GPTConfig`` and litgpt's ``Config``,
first name present winning per field. The MLP kind is given only where it is a fact, and
mixture-of-experts configs give no MLP width or kind. Which config field gives which param:
docs/metrics.md#params (``gpuopt.num_layers`` to ``gpuopt.vocab_size``).

Never raises: a config that cannot be read gives ``None`` fields (tracking never breaks
training). Imports nothing heavy; the model is only walked for wrapper attributes and, for
Hugging Face configs, submodule names.
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass, fields
from typing import Any

from mlflow_gpuopt.workload_files import HF_CONFIG_NAMES

logger = logging.getLogger(__name__)

#: Each field's config names, first found wins: Hugging Face's (from the shared mapping),
#: then nanoGPT's / GPT-2's ``n_*``, then litgpt's.
_NAMES: dict[str, tuple[str, ...]] = {
    field: tuple(hf for hf, f in HF_CONFIG_NAMES.items() if f == field) + extra
    for field, extra in (("num_layers", ("n_layer",)), ("hidden_size", ("n_embd",)),
                         ("num_heads", ("n_head",)), ("num_kv_heads", ("n_query_groups",)),
                         ("ffn_hidden_size", ("n_inner",)),
                         ("vocab_size", ()))
}
#: litgpt pads the embedding's rows beyond ``vocab_size``: the padded count is what runs.
_NAMES["vocab_size"] = ("padded_vocab_size", *_NAMES["vocab_size"])
#: litgpt's MLP classes -> the workload's ``mlp``.
_LITGPT_MLPS = {"LLaMAMLP": "swiglu", "GemmaMLP": "geglu", "GptNeoxMLP": "gelu"}
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_expert")
_MAX_UNWRAP = 8


@dataclass(frozen=True)
class Architecture:
    """A transformer's shape as its config declares it; ``None``: not declared.

    Counts are whole numbers; ``mlp`` is ``gelu`` (two matrices), ``swiglu`` or ``geglu``
    (gated, three). The names are :class:`mlflow_gpuopt.perfmodel.types.Workload`'s.
    """

    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None  # MLP inner width (per gate for gated MLPs)
    mlp: str | None = None
    vocab_size: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The declared fields only (``None`` left out), by workload key."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


def unwrap_model(model: Any) -> Any:
    """The user's module inside the wrappers :func:`.advice_facts.model_wrapper` names,
    however nested: DataParallel / DDP / FSDP1 keep it at ``.module``, ``torch.compile`` at
    ``._orig_mod``, PEFT's ``PeftModel`` (LoRA adapters) behind ``get_base_model()``.
    FSDP2 (``fully_shard``) and accelerate keep the module's own class, so its attributes are
    already there. Anything else is returned as is (a user's module with a child called
    ``module`` is not a wrapper)."""
    from mlflow_gpuopt.tracking.advice_facts import model_wrapper

    for _ in range(_MAX_UNWRAP):
        kind = model_wrapper(model)
        if kind == "none":
            base = getattr(model, "get_base_model", None)
            if not type(model).__name__.startswith("Peft") or not callable(base):
                return model
            inner = base()
        else:
            inner = getattr(model, "_orig_mod" if kind == "compiled" else "module", None)
        if inner is None or inner is model:
            return model
        model = inner
    return model


def architecture_of(model: Any) -> Architecture | None:
    """The architecture ``model``'s ``config`` declares, or ``None`` when it has no config
    object, declares none of the fields, or cannot be read. Never raises."""
    try:
        inner = unwrap_model(model)
        config = getattr(inner, "config", None)
        if config is None or isinstance(config, (str, bytes, int, float, dict, list, tuple)):
            return None
        arch = _from_config(config, inner)
    except Exception as exc:  # a config we cannot read: no architecture, training goes on
        logger.debug("gpuopt: model architecture not read: %r", exc)
        return None
    return arch if arch.as_dict() else None


def _attr(config: Any, name: str) -> Any:
    """``config.<name>``, or None when it is absent or its property raises."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def _count(value: Any) -> int | None:
    """A positive whole number, or None (``True``, ``0``, ``2.5``, ``"8"`` are not counts)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, numbers.Integral) and value > 0:  # numpy integers included
        return int(value)
    return None


def _first(config: Any, field: str) -> int | None:
    for name in _NAMES[field]:
        found = _count(_attr(config, name))
        if found is not None:
            return found
    return None


def _layers(config: Any) -> int | None:
    """Transformer layers: an encoder-decoder's (T5, BART: ``is_encoder_decoder``) are its
    encoder's and its decoder's together, which the Hugging Face name answers with the
    encoder's alone."""
    layers = _first(config, "num_layers")
    if _attr(config, "is_encoder_decoder") is True:
        enc = next((n for n in map(_count, (_attr(config, "encoder_layers"),
                                            _attr(config, "num_layers"))) if n), None)
        dec = next((n for n in map(_count, (_attr(config, "decoder_layers"),
                                            _attr(config, "num_decoder_layers"))) if n), None)
        if enc and dec:
            return enc + dec
    return layers


def _from_config(config: Any, model: Any) -> Architecture:
    layers = _layers(config)
    hidden = _first(config, "hidden_size")
    heads = _first(config, "num_heads")
    kv = _first(config, "num_kv_heads")
    if kv is not None and (heads is None or heads % kv):
        kv = None  # key/value heads must group the query heads evenly
    experts = max((_count(_attr(config, n)) or 0 for n in _EXPERT_COUNTS), default=0)
    ffn, mlp = (None, None) if experts > 1 else _mlp(config, model, hidden)
    return Architecture(num_layers=layers, hidden_size=hidden, num_heads=heads,
                        num_kv_heads=kv, ffn_hidden_size=ffn, mlp=mlp,
                        vocab_size=_first(config, "vocab_size"))


def _mlp(config: Any, model: Any, hidden: int | None) -> tuple[int | None, str | None]:
    """``(ffn_hidden_size, mlp)`` where the config (and, for Hugging Face, the model's
    submodule names) say them."""
    ffn = _first(config, "ffn_hidden_size")
    litgpt = _attr(config, "mlp_class_name")
    if isinstance(litgpt, str):
        return ffn, _LITGPT_MLPS.get(litgpt)
    if _has_attr(config, "n_inner") and _has_attr(config, "activation_function"):
        # GPT-2: Conv1D c_fc / c_proj, never gated; n_inner None is 4 x n_embd
        return ffn or (4 * hidden if hidden else None), "gelu"
    act = _attr(config, "hidden_act")
    if isinstance(act, str) and _has_gate_proj(model):
        act = act.strip().lower()
        if act in ("silu", "swish", "swiglu"):
            return ffn, "swiglu"
        if act.startswith("gelu") or act == "geglu":
            return ffn, "geglu"
    return ffn, None


def _has_attr(config: Any, name: str) -> bool:
    try:
        return hasattr(config, name)
    except Exception:
        return False


def _has_gate_proj(model: Any) -> bool:
    """True when the model has a submodule named ``gate_proj`` (a gated MLP's gate)."""
    named = getattr(model, "named_modules", None)
    if named is None:
        return False
    return any(name.rsplit(".", 1)[-1] == "gate_proj" for name, _ in named())
