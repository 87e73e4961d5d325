"""PNG charts of a recommendation: cost vs time (with the Pareto front) and scaling.

``*_chart`` build a :class:`~mlflow_gpuopt.report.canvas.Chart` (data); ``*_png`` render it
to PNG bytes. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.types import Observation
from mlflow_gpuopt.recommend.explain import hours_text
from mlflow_gpuopt.recommend.types import Recommendation, ScalingPoint
from mlflow_gpuopt.report.canvas import (BLACK, MARKERS, PALETTE, Band, Chart, ErrorBar, Line,
                                         Points, VLine, render_png)

_GOLD = (255, 215, 0)
_CRIMSON = (220, 20, 60)


def colors(names: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """One palette colour per distinct name, in sorted order (stable across charts)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(set(names)))}


def pareto_png(rec: Recommendation) -> bytes:
    """:func:`pareto_chart` as PNG bytes."""
    return render_png(pareto_chart(rec))


def scaling_png(points: Sequence[ScalingPoint], measured: Sequence[Observation] = ()) -> bytes:
    """:func:`scaling_chart` as PNG bytes."""
    return render_png(scaling_chart(points, measured))


def pareto_chart(rec: Recommendation) -> Chart:
    """Predicted hours (x) vs expected cost (y) for every feasible plan, by GPU type.

    The Pareto front is drawn as a step line, the deadline as a vertical line, the winner as
    a star with its interval. Log axes: plans span orders of magnitude in both.
    """
    cands = rec.candidates
    palette = colors([c.offer.gpu for c in cands])
    items: list = []
    for gpu, color in palette.items():
        pts = [c for c in cands if c.offer.gpu == gpu]
        items.append(Points(tuple(c.hours for c in pts), tuple(c.cost_usd for c in pts),
                            fill=color, alpha=0.6, label=gpu))
    if rec.pareto:
        hours = tuple(c.hours for c in rec.pareto)
        cost = tuple(c.cost_usd for c in rec.pareto)
        items += [Line(hours, cost, BLACK, width_px=1.2, steps_post=True, label="Pareto front"),
                  Points(hours, cost, fill=None, radius_px=3.5, edge=BLACK)]
    if rec.target.deadline_hours:
        items.append(VLine(rec.target.deadline_hours, _CRIMSON,
                           label=f"deadline {hours_text(rec.target.deadline_hours)}"))
    if rec.winner is not None:
        w = rec.winner
        items += [ErrorBar(w.hours, w.cost_usd, w.hours_low, w.hours_high,
                           max(w.cost_low_usd, w.cost_usd * 1e-3), w.cost_high_usd),
                  Points((w.hours,), (w.cost_usd,), fill=_GOLD, marker="*", radius_px=10,
                         edge=BLACK, label="recommended")]
    return Chart(title="Cost vs time of every feasible plan",
                 x_label="predicted time to train (hours)", y_label="expected cost (USD)",
                 items=tuple(items))


@dataclass(frozen=True)
class ScalingSeries:
    """One predicted line of the scaling chart: one GPU type on one instance family.

    ``gpus`` ascending; ``shapes`` names the machine each point was predicted on
    (``p4d.24xlarge × 2``), so the line joins only points of the same family.
    """

    gpu: str
    provider: str
    family: str
    label: str
    gpus: tuple[int, ...]
    throughput_samples_per_s: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    shapes: tuple[str, ...]


def scaling_series(points: Sequence[ScalingPoint]) -> list[ScalingSeries]:
    """The chart's lines: one per (GPU, provider, instance family), labelled with both."""
    groups: dict[tuple[str, str, str], list[ScalingPoint]] = {}
    for p in points:
        groups.setdefault((p.gpu, p.provider, p.family), []).append(p)
    out = []
    for (gpu, provider, family), pts in sorted(groups.items()):
        pts = sorted(pts, key=lambda p: p.gpus)
        where = " ".join(dict.fromkeys(w for w in (provider, family) if w))  # "colab" once
        out.append(ScalingSeries(
            gpu=gpu, provider=provider, family=family,
            label=f"{gpu} on {where} (predicted)" if where else f"{gpu} (predicted)",
            gpus=tuple(p.gpus for p in pts),
            throughput_samples_per_s=tuple(p.throughput_samples_per_s for p in pts),
            low=tuple(p.low for p in pts), high=tuple(p.high for p in pts),
            shapes=tuple(f"{p.instance_type} × {p.nodes}" if p.instance_type else ""
                         for p in pts)))
    return out


#: Lines on the scaling chart at most: more cannot be told apart by colour.
MAX_SCALING_SERIES = 10
#: Prediction-interval bands drawn (the fastest GPU types'): more stack into a grey block.
MAX_SCALING_BANDS = 3


def _peak(s: ScalingSeries) -> float:
    return max(s.throughput_samples_per_s, default=0.0)


def chart_series(points: Sequence[ScalingPoint],
                 max_series: int = MAX_SCALING_SERIES) -> list[ScalingSeries]:
    """The lines the chart draws: one per GPU type, on its best instance family (the one
    that reaches the highest throughput; ties: more GPU counts), the ``max_series`` GPU
    types of highest throughput, fastest first."""
    best: dict[str, ScalingSeries] = {}
    for s in scaling_series(points):
        key = (_peak(s), len(s.gpus))
        if s.gpu not in best or key > (_peak(best[s.gpu]), len(best[s.gpu].gpus)):
            best[s.gpu] = s
    ranked = sorted(best.values(), key=lambda s: (-_peak(s), s.gpu))
    return ranked[:max_series]


def scaling_chart(points: Sequence[ScalingPoint],
                  measured: Sequence[Observation] = ()) -> Chart:
    """Predicted global throughput vs GPU count: one line per GPU type on its best instance
    family (:func:`chart_series`), the prediction interval as a band for the fastest
    :data:`MAX_SCALING_BANDS`, and the measured runs of the GPU types shown as diamonds."""
    series = chart_series(points)
    shown = {s.gpu for s in series}
    dots_of = [o for o in measured if o.gpu in shown]
    palette = {s.gpu: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    # a light fill and dotted edges: where the intervals overlap, the edges still tell them
    # apart and the fills do not darken into one block
    bands: list = []
    for s in series[:MAX_SCALING_BANDS]:
        bands += [Band(s.gpus, s.low, s.high, palette[s.gpu], alpha=0.05),
                  Line(s.gpus, s.low, palette[s.gpu], width_px=1.0, dash=":"),
                  Line(s.gpus, s.high, palette[s.gpu], width_px=1.0, dash=":")]
    lines = [Line(s.gpus, s.throughput_samples_per_s, palette[s.gpu], width_px=1.8,
                  dash=("-", "--")[i // len(MARKERS) % 2], marker=MARKERS[i % len(MARKERS)],
                  marker_radius_px=3.0, label=s.label) for i, s in enumerate(series)]
    dots = [Points((o.gpu_count,), (o.throughput_samples_per_s,), fill=palette[o.gpu],
                   marker="D", radius_px=5, edge=BLACK, label=f"{o.gpu} measured")
            for o in dots_of]
    types = len({p.gpu for p in points})
    what = (f"the {len(series)} fastest of {types} GPU types" if types > len(series)
            else f"{types} GPU type{'s' if types != 1 else ''}")
    keys = [f"band, dotted: interval of the fastest {min(len(series), MAX_SCALING_BANDS)}"]
    if dots:
        keys.append("diamonds: measured")
    return Chart(
        title=f"Predicted scaling: {what}, each on its best instance family "
              f"({'; '.join(keys)})",
        x_label="GPUs (data parallel: DDP, or ZeRO/FSDP where DDP does not fit)",
        y_label="throughput (samples/s)", items=(*bands, *lines, *dots), x_log_base=2,
        axes_width_px=660, axes_height_px=420)
