"""Which ``torch.optim.Optimizer`` a user's optimizer object really is.

Training libraries hand the loop a wrapper around the optimizer (accelerate's
``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``, DeepSpeed's and similar ones all
keep it as ``.optimizer``). PyTorch's global step hooks fire for the inner optimizer, whose
``step()`` the wrapper calls, so the step clock must compare against that one.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 8  # wrappers of wrappers; a cycle ends here


def unwrap_optimizer(optimizer: Any) -> Any:
    """The innermost optimizer of a ``.optimizer`` chain (``optimizer`` itself if none)."""
    current = optimizer
    for _ in range(_MAX_DEPTH):
        inner = getattr(current, "optimizer", None) if current is not None else None
        if inner is None or inner is current or not callable(getattr(inner, "step", None)):
            return current
        current = inner
    return current


def optimizer_loop_facts(optimizer: Any) -> tuple[int | None, str | None]:
    """(parameter tensors the optimizer updates, how its ``step()`` runs on CUDA): ``fused``
    (``fused=True``, or a ``Fused*`` class such as apex's ``FusedAdam``), ``for-loop``
    (``foreach=False``, or ``foreach`` unset before PyTorch 2.0) or ``foreach`` (unset from
    PyTorch 2.0 on, whose ``torch.optim`` runs the multi-tensor form on CUDA tensors);
    None where the optimizer states neither (an optimizer of its own, ``LBFGS``). The count
    is the tensors of its parameter groups that require gradients; None without groups."""
    inner = unwrap_optimizer(optimizer)
    groups = getattr(inner, "param_groups", None)
    if not groups:
        return None, None
    try:
        tensors = sum(1 for g in groups for p in g.get("params", ())
                      if getattr(p, "requires_grad", True))
    except Exception:  # a param group that is not a dict of tensors
        return None, None
    defaults = getattr(inner, "defaults", None) or {}
    if defaults.get("fused") or type(inner).__name__.startswith("Fused"):
        return tensors, "fused"
    if "foreach" not in defaults:
        return tensors, None
    foreach = defaults.get("foreach")
    if foreach is None:
        import torch

        major = int(str(torch.__version__).split(".")[0] or 0)
        return tensors, "foreach" if major >= 2 else "for-loop"
    return tensors, "foreach" if foreach else "for-loop"
