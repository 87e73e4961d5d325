"""Streaming quantiles of step times in bounded memory: a log-bucketed histogram.

Each value lands in bucket ``ceil(log(x) / log(gamma))``, so any quantile is known to within a
relative error of ``(gamma - 1) / 2`` (0.5 % by default) whatever the number of values: a
million steps cost the same ~3,000 integer counters as ten. Same idea as DDSketch.
"""

from __future__ import annotations

import math


class LogHistogram:
    """Quantiles of positive values (e.g. seconds) with bounded relative error.

    Args:
        relative_accuracy: half-width of a bucket relative to its value (0.005 = 0.5 %).
        min_value: values below are clamped here (1 ns for step times).
        max_value: values above are clamped here (1e5 s).
    """

    def __init__(self, relative_accuracy: float = 0.005, min_value: float = 1e-9,
                 max_value: float = 1e5) -> None:
        if not 0 < relative_accuracy < 1:
            raise ValueError("relative_accuracy must be in (0, 1)")
        self._gamma = (1 + relative_accuracy) / (1 - relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self._min = min_value
        self._max = max_value
        self._offset = math.ceil(math.log(min_value) / self._log_gamma)
        n = math.ceil(math.log(max_value) / self._log_gamma) - self._offset + 1
        self._counts = [0] * n
        self.count = 0
        self.total = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float) -> None:
        """Record one value (non-positive values count as ``min_value``)."""
        self.count += 1
        self.total += value
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        v = min(max(value, self._min), self._max)
        self._counts[math.ceil(math.log(v) / self._log_gamma) - self._offset] += 1

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1), or ``None`` when empty; exact at the min and max."""
        if self.count == 0:
            return None
        if q <= 0:
            return self.minimum
        if q >= 1:
            return self.maximum
        rank = q * (self.count - 1)  # 0-based rank, as numpy's "lower" interpolation
        seen = 0
        for i, c in enumerate(self._counts):
            seen += c
            if seen > rank:
                k = i + self._offset
                mid = 2 * self._gamma ** k / (self._gamma + 1)  # centre of (gamma^(k-1), gamma^k]
                return min(max(mid, self.minimum), self.maximum)
        return self.maximum

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None
