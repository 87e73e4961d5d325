"""The streaming step-time histogram: bounded memory, bounded relative error."""

from __future__ import annotations

import random

import pytest

from mlflow_gpuopt.tracking.quantiles import LogHistogram


def exact(values, q):
    s = sorted(values)
    return s[int(q * (len(s) - 1))]


@pytest.mark.parametrize("dist", ["lognormal", "bimodal", "constant"])
def test_quantiles_within_relative_accuracy(dist):
    rng = random.Random(1)
    if dist == "lognormal":
        values = [rng.lognormvariate(-4.6, 0.3) for _ in range(20_000)]  # ~10 ms steps
    elif dist == "bimodal":
        values = [0.001 if rng.random() < 0.8 else 0.05 for _ in range(20_000)]
    else:
        values = [0.0123] * 1000
    h = LogHistogram(relative_accuracy=0.005)
    for v in values:
        h.add(v)
    for q in (0.5, 0.9, 0.99):
        assert h.quantile(q) == pytest.approx(exact(values, q), rel=0.011)
    assert h.count == len(values)
    assert h.mean == pytest.approx(sum(values) / len(values))
    assert h.quantile(0) == min(values) and h.quantile(1) == max(values)


def test_memory_is_bounded():
    h = LogHistogram()
    size = len(h._counts)
    for i in range(200_000):
        h.add(1e-4 * (1 + i % 1000))
    assert len(h._counts) == size < 10_000
    assert h.count == 200_000


def test_empty_and_out_of_range():
    h = LogHistogram(min_value=1e-6, max_value=10.0)
    assert h.quantile(0.5) is None and h.mean is None
    h.add(0.0)
    h.add(1000.0)
    assert h.quantile(0.0) == 0.0 and h.quantile(1.0) == 1000.0
    with pytest.raises(ValueError):
        LogHistogram(relative_accuracy=0)
