"""Scoring lines the accuracy benchmarks share: the p90 of absolute errors and one summary
line per task (median and p90 error, interval coverage, median interval width)."""

from __future__ import annotations

import math
import statistics


def p90(errs: list[float]) -> float:
    """The 90th percentile of ``errs`` (sorted ascending), nearest-rank."""
    return errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]


def summary_line(name: str, results: list[tuple[float, bool, float]],
                 empty: str = "(no pairs)") -> str:
    """One summary line: median and p90 absolute error (%), interval coverage, and the
    median interval width as high / low (a 90% interval of ±25% is 1.67)."""
    if not results:
        return f"  {name:40s} n=  0  {empty}"
    errs = sorted(e for e, _, _ in results)
    cover = 100.0 * sum(c for _, c, _ in results) / len(results)
    width = statistics.median(w for _, _, w in results)
    return (f"  {name:40s} n={len(results):3d} median {statistics.median(errs):6.1f}%  "
            f"p90 {p90(errs):6.1f}%  coverage {cover:5.1f}%  width {width:5.2f}x")
