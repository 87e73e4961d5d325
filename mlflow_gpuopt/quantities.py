"""Quantities as people write them on a command line: ``2e9``, ``2B``, ``1.5M``, ``36h``, ``1d12h``.

Pure parsing, no I/O. Every parser raises :class:`QuantityError` (a ``ValueError``) with a
message that names what was given and what would have been accepted, so the CLI can print it
as one line.
"""

from __future__ import annotations

import math
import re

from mlflow_gpuopt.errors import InputError

__all__ = ["QuantityError", "parse_count", "parse_duration_hours", "format_count",
           "format_hours"]


class QuantityError(InputError):
    """A count or a duration that does not parse."""


#: Suffix -> multiplier for counts. ``B`` is billions (as in "2B tokens"), ``G`` an alias.
_COUNT_SUFFIXES = {
    "": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "b": 1e9, "B": 1e9, "G": 1e9, "g": 1e9,
    "t": 1e12, "T": 1e12,
}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]?)\s*$")

#: Unit -> hours for durations.
_DURATION_UNITS = {"w": 168.0, "d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}
_DURATION_PART_RE = re.compile(r"([0-9]*\.?[0-9]+)\s*(w|d|h|m|s)", re.IGNORECASE)


def parse_count(text: str | float | int, *, what: str = "count") -> float:
    """Parse a positive count: ``2e9``, ``2B`` (1e9), ``1.5M``, ``500k``, ``1_000_000``.

    Returns a float (counts of samples or tokens can exceed what people type as an int);
    raises :class:`QuantityError` for anything else, including zero and negatives.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).replace("_", "").replace(",", "")
        match = _COUNT_RE.match(raw)
        if not match or match.group(2) not in _COUNT_SUFFIXES:
            raise QuantityError(
                f"cannot read {what} {text!r}: write a number like 2e9, 2B, 1.5M or 500k")
        value = float(match.group(1)) * _COUNT_SUFFIXES[match.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise QuantityError(f"{what} must be a positive number, got {text!r}")
    return value


def parse_duration_hours(text: str | float | int, *, what: str = "duration") -> float:
    """Parse a positive duration into hours: ``36h``, ``90m``, ``2d``, ``1d12h``, ``1.5h``.

    A bare number is read as hours (``24`` = 24 h). Units: w, d, h, m (minutes), s.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        hours = float(text)
    else:
        raw = str(text).strip().replace(" ", "")
        if not raw:
            raise QuantityError(f"cannot read {what} '': write e.g. 36h, 90m, 2d or 1d12h")
        try:
            hours = float(raw)
        except ValueError:
            pos, hours = 0, 0.0
            for part in _DURATION_PART_RE.finditer(raw):
                if part.start() != pos:
                    break
                hours += float(part.group(1)) * _DURATION_UNITS[part.group(2).lower()]
                pos = part.end()
            if pos != len(raw) or pos == 0:
                raise QuantityError(
                    f"cannot read {what} {text!r}: write e.g. 36h, 90m, 2d or 1d12h") from None
    if not math.isfinite(hours) or hours <= 0:
        raise QuantityError(f"{what} must be positive, got {text!r}")
    return hours


def format_count(value: float) -> str:
    """Short human form of a count: 2000000000 -> '2B', 1500000 -> '1.5M'."""
    for suffix, mult in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= mult:
            return f"{value / mult:.3g}{suffix}"
    return f"{value:.3g}"


def format_hours(hours: float) -> str:
    """Short human form of a duration given in hours: 0.5 -> '30m', 36 -> '1d12h'."""
    if hours < 1:
        return f"{hours * 60:.0f}m"
    if hours < 48:
        return f"{hours:.1f}h"
    days, rest = divmod(hours, 24)
    return f"{days:.0f}d{rest:.0f}h"
