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
