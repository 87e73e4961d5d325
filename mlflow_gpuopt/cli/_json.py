"""JSON the commands print: always valid JSON (RFC 8259 has no Infinity or NaN).

Inputs are range-checked so no figure should overflow; a non-finite float that still reaches
here is an unbounded end of an interval (a throughput low of 0 gives an infinite time), and is
written as ``null``. ``allow_nan=False`` then guarantees that nothing else slips through.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(obj: Any) -> Any:
    """A copy of a JSON-like object with every non-finite float replaced by ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats as ``null``, strict (``allow_nan``
    false); other values JSON has no type for are written as their ``str``."""
    kwargs.setdefault("default", str)
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
