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


def explain_widths(name: str, rows: list[tuple[str, float, list[dict], float]],
                   examples: int = 2) -> list[str]:
    """``--explain-width``: how a task's intervals are composed. ``rows`` holds, per
    prediction, (a label, log(published / predicted), ``predict --json``'s ``width_terms``,
    its ``log_sigma``). Rows are grouped by the set of pieces they combine; per group: how
    many, the coverage of the 90 % interval, the median of each piece, the RMS of the log
    errors beside the median σ (an interval that covers by far more than its errors need
    has RMS ≪ σ), then ``examples`` rows in full."""
    from collections import defaultdict

    z90 = 1.6448536269514722
    groups: dict[tuple[str, ...], list] = defaultdict(list)
    for row in rows:
        groups[tuple(t["term"] for t in row[2])].append(row)
    out = [f"  -- widths of {name} ({len(rows)} predictions)"]
    for names, members in sorted(groups.items(), key=lambda g: -len(g[1])):
        sigmas = [s for _, _, _, s in members]
        errs = [e for _, e, _, _ in members]
        cover = 100.0 * sum(abs(e) <= z90 * s for _, e, _, s in members) / len(members)
        rms = math.sqrt(statistics.fmean(e * e for e in errs))
        pieces = ", ".join(
            f"{n} {statistics.median(t[i]['log_sigma'] for _, _, t, _ in members):.3f}"
            for i, n in enumerate(names)) or "none"
        out.append(f"  n={len(members):3d} σ median {statistics.median(sigmas):.3f} "
                   f"(width {math.exp(2 * z90 * statistics.median(sigmas)):.2f}x), "
                   f"RMS log error {rms:.3f}, coverage {cover:5.1f}%: {pieces}")
        for label, e, terms, s in members[:examples]:
            out.append(f"      {label}: log error {e:+.3f}, σ {s:.3f} = "
                       + " ⊕ ".join(f"{t['log_sigma']:.3f}" for t in terms))
    return out


def net_piece(logs: dict[str, list[tuple[float, float]]]) -> float:
    """The piece a set of transfer pairs shows beyond the widths their intervals already
    hold: ``logs`` holds per model (log(published / predicted), the combined σ of the
    interval's other pieces) per row; sqrt(max(0, mean e² − mean σ²)) over the rows or over
    the models weighted equally (each model's own mean), whichever is larger; 0 where the
    other pieces already hold the errors. 0 for no rows."""
    rows = [x for v in logs.values() for x in v]
    if not rows:
        return 0.0

    def excess(v: list[tuple[float, float]]) -> float:
        return statistics.fmean(e * e - s * s for e, s in v)

    every = excess(rows)
    per_model = statistics.fmean(excess(v) for v in logs.values())
    return math.sqrt(max(0.0, every, per_model))


def leave_one_model_out(logs: dict[str, list[tuple[float, float]]],
                        z: float = 1.6448536269514722) -> tuple[int, int]:
    """(rows covered, rows) when each model's rows get the :func:`net_piece` of the other
    models beside their own other pieces: covered where |e| <= z · hypot(piece, σ)."""
    covered = 0
    for held, own in logs.items():
        piece = net_piece({m: v for m, v in logs.items() if m != held})
        covered += sum(abs(e) <= z * math.hypot(piece, s) for e, s in own)
    return covered, sum(len(v) for v in logs.values())
