"""Mixture-of-experts layers of the tracked model, recognised from its modules.

A MoE block is a module with a router child (``gate`` or ``router``) and an ``experts`` child:

- Hugging Face (``MixtralSparseMoeBlock``, ``Qwen2MoeSparseMoeBlock``, DeepSeek's ``MoE``):
  ``gate`` is an ``nn.Linear(hidden, experts)`` or a top-k router holding a ``weight`` of
  ``[experts, hidden]``; ``experts`` an ``nn.ModuleList`` of MLPs or one module of grouped
  weights ``[experts, ...]`` (transformers 5's ``MixtralExperts``); ``shared_expert`` /
  ``shared_experts`` an MLP every token visits.
- torchtitan (``MoE``): ``router.gate`` ``nn.Linear(dim, experts)`` and ``router.top_k``;
  ``experts`` a ``GroupedExperts`` (``w1``/``w2``/``w3`` of ``[experts, ...]``, DTensors
  under expert parallelism); ``shared_experts``.

Read from the shapes: the routed experts (the router's outputs, which count every expert even
where this rank holds only its own under expert parallelism), one expert's parameters and MLP
width (its matrices' dimension other than the hidden size; gated when the expert holds three
``hidden × width`` matrices), and the shared experts (their width over one expert's). Experts
per token from the block's or its router's ``top_k`` / ``num_experts_per_tok``, else the
model config's ``num_experts_per_tok``. The names are the workload file's
(docs/metrics.md#workloadjson); ``active_params`` is ``params`` less the routed experts a token
skips, per MoE layer. Never raises: a module that cannot be read is not a MoE block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_ROUTERS = ("gate", "router")
_SHARED = ("shared_expert", "shared_experts")
_TOP_K = ("top_k", "num_experts_per_tok", "experts_per_token", "moe_top_k")


@dataclass(frozen=True)
class MoeBlock:
    """One MoE layer: counts, and one routed expert's parameters (elements)."""

    num_experts: int  # routed experts (the router's outputs)
    experts_held: int  # the routed experts this process holds (fewer under expert parallel)
    experts_per_token: int | None
    expert_params: int  # one routed expert
    expert_trainable_params: int
    expert_ffn_hidden_size: int | None
    gated: bool  # three hidden x width matrices per expert
    shared_ffn_hidden_size: int  # 0: no shared expert


def _numel(p: Any) -> int:
    return int(p.numel())  # a DTensor's is its global size


def _shape(p: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in p.shape)  # a DTensor's global shape


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 0 else None


def _router_shape(router: Any) -> tuple[int, int] | None:
    """``(experts, hidden)`` from the router's own 2-D ``weight`` or its ``gate``'s."""
    for owner in (router, getattr(router, "gate", None)):
        weight = getattr(owner, "weight", None) if owner is not None else None
        if weight is not None and hasattr(weight, "shape") and len(weight.shape) == 2:
            experts, hidden = _shape(weight)
            return experts, hidden
    return None


def _matrices(module: Any, grouped: bool) -> list[tuple[int, int]]:
    """The last two dimensions of one expert's weight matrices."""
    want = 3 if grouped else 2
    return [_shape(p)[-2:] for p in module.parameters() if len(p.shape) == want]


def _width(matrices: list[tuple[int, int]], hidden: int) -> int | None:
    """The MLP width: the smallest dimension other than ``hidden`` (a fused gate-and-up
    matrix is 2 × width, the down projection width), ``hidden`` when every one is."""
    others = [b if a == hidden else a for a, b in matrices if hidden in (a, b)]
    return min(others) if others else None


def _top_k(block: Any, router: Any, experts: int) -> int | None:
    for owner in (block, router):
        for name in _TOP_K:
            k = _count(getattr(owner, name, None))
            if k is not None and k <= experts:
                return k
    return None


def _block(module: Any) -> MoeBlock | None:
    experts = getattr(module, "experts", None)
    router = next((getattr(module, n) for n in _ROUTERS
                   if getattr(module, n, None) is not None), None)
    if experts is None or router is None or not hasattr(experts, "parameters"):
        return None
    shape = _router_shape(router)
    if shape is None or shape[0] < 2:
        return None
    total, hidden = shape
    grouped = not (hasattr(experts, "__len__") and hasattr(experts, "__getitem__"))
    if grouped:
        params = [p for p in experts.parameters() if len(p.shape) >= 2]
        held = {_shape(p)[0] for p in params}
        if len(held) != 1:
            return None
        n = held.pop()
        one_params = sum(_numel(p) for p in experts.parameters()) // n
        one_trainable = sum(_numel(p) for p in experts.parameters() if p.requires_grad) // n
        matrices = _matrices(experts, grouped=True)
    else:
        n = len(experts)
        if n < 1:
            return None
        first = experts[0]
        one_params = sum(_numel(p) for p in first.parameters())
        one_trainable = sum(_numel(p) for p in first.parameters() if p.requires_grad)
        matrices = _matrices(first, grouped=False)
    if n > total or total % n:
        return None  # not the router's experts (or not evenly spread over ranks)
    width = _width(matrices, hidden)
    gated = width is not None and sum(a * b for a, b in matrices) == 3 * hidden * width
    shared = next((getattr(module, n) for n in _SHARED
                   if getattr(module, n, None) is not None), None)
    shared_width = 0
    if shared is not None and hasattr(shared, "parameters"):
        shared_width = _width(_matrices(shared, grouped=False), hidden) or 0
    return MoeBlock(num_experts=total, experts_held=n,
                    experts_per_token=_top_k(module, router, total),
                    expert_params=one_params, expert_trainable_params=one_trainable,
                    expert_ffn_hidden_size=width, gated=gated,
                    shared_ffn_hidden_size=shared_width)


def moe_blocks(model: Any) -> list[MoeBlock]:
    """The MoE blocks of ``model`` (already unwrapped), in module order. Never raises."""
    try:
        return [b for b in map(_block, model.modules()) if b is not None]
    except Exception as exc:  # a model we cannot walk: no MoE read, training goes on
        logger.debug("gpuopt: MoE layers not read: %r", exc)
        return []


def moe_fields(model: Any, fields: dict[str, Any], config: Any = None) -> dict[str, Any]:
    """The profile fields of ``model``'s MoE layers, given the dense fields already read
    (``params``, ``trainable_params`` as counted here, ``num_layers``, ``ffn_hidden_size``,
    ``mlp`` where the config declared them); ``{}`` for a dense model.

    ``params`` / ``trainable_params`` are raised by the routed experts this process does not
    hold (expert parallelism with plain local tensors), so they count the whole model as a
    workload file's do. The per-layer keys are left out when the blocks disagree.
    """
    blocks = moe_blocks(model)
    if not blocks:
        return {}
    k_config = _count(getattr(config, "num_experts_per_tok", None)) if config is not None \
        else None
    missing = sum((b.num_experts - b.experts_held) * b.expert_params for b in blocks)
    missing_trainable = sum((b.num_experts - b.experts_held) * b.expert_trainable_params
                            for b in blocks)
    params = int(fields["params"]) + missing
    ks = [b.experts_per_token or k_config for b in blocks]
    out: dict[str, Any] = {"params": params,
                           "trainable_params": int(fields["trainable_params"])
                           + missing_trainable}
    if all(ks):
        out["active_params"] = params - sum((b.num_experts - k) * b.expert_params
                                            for b, k in zip(blocks, ks, strict=True))
    first = blocks[0]
    same = all((b.num_experts, b.expert_ffn_hidden_size, b.shared_ffn_hidden_size, k)
               == (first.num_experts, first.expert_ffn_hidden_size,
                   first.shared_ffn_hidden_size, ks[0]) for b, k in zip(blocks, ks, strict=True))
    if not same:
        return out
    width = first.expert_ffn_hidden_size
    out["num_experts"] = first.num_experts
    out["experts_per_token"] = ks[0]
    out["expert_ffn_hidden_size"] = width
    if first.shared_ffn_hidden_size and width:
        out["num_shared_experts"] = max(1, round(first.shared_ffn_hidden_size / width))
    layers = fields.get("num_layers")
    if layers and layers >= len(blocks) and layers % len(blocks) == 0:
        out["moe_layer_freq"] = layers // len(blocks)
        dense = layers - len(blocks)
        dense_width = fields.get("ffn_hidden_size") or _count(
            getattr(config, "intermediate_size", None))
        if ks[0] and width and (dense == 0 or dense_width):
            # the activation formula's MLP width: what one token's MLP holds, per layer
            active = ks[0] * width + first.shared_ffn_hidden_size
            out["ffn_hidden_size"] = round(((dense_width or 0) * dense
                                            + active * len(blocks)) / layers)
    if first.gated and not fields.get("mlp"):
        act = getattr(config, "hidden_act", None)
        act = act.strip().lower() if isinstance(act, str) else ""
        mlp = "swiglu" if act in ("silu", "swish", "swiglu") else (
            "geglu" if act.startswith("gelu") or act == "geglu" else None)
        if mlp:
            out["mlp"] = mlp
    return {k: v for k, v in out.items() if v is not None}


def moe_fields_of(model: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """:func:`moe_fields` of the user's module inside ``model``'s wrappers, with its
    ``config``. Never raises."""
    from mlflow_gpuopt.tracking.architecture import unwrap_model

    try:
        inner = unwrap_model(model)
        return moe_fields(inner, fields, getattr(inner, "config", None))
    except Exception as exc:  # tracking never breaks training
        logger.debug("gpuopt: MoE layers not read: %r", exc)
        return {}
