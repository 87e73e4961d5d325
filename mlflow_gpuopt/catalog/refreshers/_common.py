"""What every refresher shares: checked numbers, offers built on the previous catalog's
hardware facts, and a guard that turns any malformed payload into a RefreshError."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

from mlflow_gpuopt.catalog.errors import CatalogError, RefreshError
from mlflow_gpuopt.catalog.schema import MAX_USD_PER_GPU_HOUR, Offer

F = TypeVar("F", bound=Callable[..., Any])
KEEP = object()


def guard_parse(provider: str) -> Callable[[F], F]:
    """Decorate a pure parser so a payload of the wrong shape ends in a RefreshError."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except CatalogError:
                raise
            except (KeyError, TypeError, AttributeError, ValueError, IndexError,
                    OverflowError) as exc:
                raise RefreshError(
                    f"malformed {provider} price payload ({type(exc).__name__}: "
                    f"{str(exc)[:120]})"
                ) from None

        return inner  # type: ignore[return-value]

    return wrap


def get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked to be a dict entry of type ``kind``; else a RefreshError."""
    if not isinstance(obj, dict):
        raise RefreshError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise RefreshError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _as_tuple(kind):
        raise RefreshError(f"{where}: field {key!r} has type {type(value).__name__}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def number(value: Any, where: str) -> float:
    """A finite number from a JSON number or numeric string."""
    if isinstance(value, bool):
        raise RefreshError(f"{where}: expected a number, got a boolean")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise RefreshError(f"{where}: expected a number, got {str(value)[:40]!r}") from None
    if not math.isfinite(out):
        raise RefreshError(f"{where}: expected a finite number, got {value!r}")
    return out


def checked_price(value: float, gpu_count: int, where: str) -> float:
    """A node price in $/h that is positive and at most the sane $/GPU-h limit."""
    if not value > 0:
        raise RefreshError(f"{where}: price {value:g} $/h is not positive")
    if value / gpu_count > MAX_USD_PER_GPU_HOUR:
        raise RefreshError(
            f"{where}: price {value / gpu_count:g} $/GPU-h is above the "
            f"{MAX_USD_PER_GPU_HOUR:g} sanity limit"
        )
    return round(value, 6)


def repriced(
    template: Offer,
    *,
    price: float,
    as_of: str,
    source: str,
    spot: Any = KEEP,
    vcpus: int | None = None,
    memory_gb: float | None = None,
    regions_with_capacity: Any = KEEP,
) -> Offer:
    """``template`` (hardware facts from the previous catalog) with a fresh price."""
    where = f"{template.provider} {template.instance_type} {template.region}"
    changes: dict[str, Any] = {
        "price_per_hour_usd": checked_price(price, template.gpu_count, where),
        "as_of": as_of,
        "source": source,
    }
    if spot is not KEEP:
        changes["spot_price_per_hour_usd"] = (
            None if spot is None else checked_price(spot, template.gpu_count, where + " spot")
        )
    if vcpus is not None:
        changes["vcpus"] = vcpus
    if memory_gb is not None:
        changes["memory_gb"] = memory_gb
    if regions_with_capacity is not KEEP:
        changes["regions_with_capacity"] = regions_with_capacity
    out = dataclasses.replace(template, **changes)
    if (out.spot_price_per_hour_usd is not None
            and out.spot_price_per_hour_usd > out.price_per_hour_usd):
        out = dataclasses.replace(out, spot_price_per_hour_usd=None)
    return out
