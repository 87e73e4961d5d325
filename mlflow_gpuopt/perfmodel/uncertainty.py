"""Prediction intervals: the fit's own spread plus a term for every way a prediction
extrapolates beyond what was measured.

Widths are standard deviations of log(throughput), added in quadrature. The constants are
set once from the spread of published scaling and cross-GPU ratios (NVIDIA's
DeepLearningExamples tables; see ``benchmarks/bench_accuracy.py``), not per workload.
"""

from __future__ import annotations

import math

#: z for a central 90% interval of a normal.
Z90 = 1.6448536269514722
#: Run-to-run noise of a measured throughput: the narrowest an interval gets.
SIGMA_FLOOR = 0.03
#: No GPU measurement at all (a CPU run or none): FLOPs / peak at a prior efficiency.
SIGMA_PRIOR_ONLY = 0.6
#: Calibrated on another GPU type (roofline transfer, Habitat-style).
SIGMA_OTHER_GPU = 0.25
#: Calibrated on the same GPU at another precision (tensor-core efficiency differs).
SIGMA_OTHER_PRECISION = 0.2
#: More data-parallel replicas than any observation had: per doubling beyond the largest.
SIGMA_PER_DOUBLING_BEYOND = 0.035
#: A strategy, a node count > 1 or a micro-batch never observed.
SIGMA_UNOBSERVED_STRATEGY = 0.10
SIGMA_UNOBSERVED_MULTINODE = 0.08
SIGMA_PER_BATCH_DOUBLING = 0.05


def combine(*sigmas: float) -> float:
    """Independent log-normal widths added in quadrature."""
    return math.sqrt(sum(s * s for s in sigmas))


def scale_beyond(replicas: int, max_observed_replicas: int) -> float:
    """Width for predicting more replicas than measured (0 when within the measured range)."""
    if replicas <= max_observed_replicas:
        return 0.0
    return SIGMA_PER_DOUBLING_BEYOND * math.log2(replicas / max(1, max_observed_replicas))


def batch_away(micro_batch: float, observed: frozenset[float], split_identified: bool) -> float:
    """Width for a micro-batch away from the measured ones when ``a``/``b`` was not fitted."""
    if split_identified or not observed or micro_batch in observed:
        return 0.0
    nearest = min(abs(math.log2(micro_batch / m)) for m in observed if m > 0)
    return SIGMA_PER_BATCH_DOUBLING * nearest


def interval(value: float, log_sigma: float, z: float = Z90) -> tuple[float, float]:
    """(low, high) of a log-normal around ``value`` at ``z`` standard deviations."""
    return value * math.exp(-z * log_sigma), value * math.exp(z * log_sigma)
