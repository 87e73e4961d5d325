"""PNG charts of a recommendation: cost vs time (with the Pareto front) and scaling.

Uses matplotlib's object API on the Agg canvas (no pyplot global state, no display needed);
each function returns PNG bytes and writes nothing.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.types import Observation
from mlflow_gpuopt.recommend.explain import hours_text
from mlflow_gpuopt.recommend.types import Recommendation, ScalingPoint

_DPI = 110


def _figure(width: float = 7.5, height: float = 4.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    """The figure cropped to its artists plus ``savefig.pad_inches``, as PNG bytes.

    The same crop as ``bbox_inches="tight"``, measured with ``get_tightbbox`` (text extents,
    ticks, legend) instead of the full draw with rendering disabled that ``savefig`` does
    for "tight" before the real one (about a tenth of the chart's CPU). Byte-identical PNG.
    """
    from matplotlib import rcParams

    pad = rcParams["savefig.pad_inches"]
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad, pad)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches=bbox)
    return buf.getvalue()


def _plain_log_labels(ax, x_base: float = 10, y_base: float = 10) -> None:
    """Log-axis tick labels as plain text (``100``, ``1e+04``) instead of matplotlib's default
    mathtext (``$10^{2}$``): parsing mathtext costs more CPU than drawing the rest of the
    chart."""
    from matplotlib.ticker import LogFormatter

    for axis, base in ((ax.xaxis, x_base), (ax.yaxis, y_base)):
        axis.set_major_formatter(LogFormatter(base))
        axis.set_minor_formatter(LogFormatter(base, labelOnlyBase=False))


def _colors(names: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {name: cmap(i % 20) for i, name in enumerate(sorted(set(names)))}


def pareto_png(rec: Recommendation) -> bytes:
    """Predicted hours (x) vs expected cost (y) for every feasible plan, by GPU type.

    The Pareto front is drawn as a step line, the deadline as a vertical line, the winner as
    a star. Log axes: plans span orders of magnitude in both.
    """
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    cands = rec.candidates
    colors = _colors([c.offer.gpu for c in cands])
    for gpu, color in colors.items():
        pts = [c for c in cands if c.offer.gpu == gpu]
        ax.scatter([c.hours for c in pts], [c.cost_usd for c in pts], s=16, alpha=0.55,
                   color=color, label=gpu, edgecolors="none")
    if rec.pareto:
        ax.step([c.hours for c in rec.pareto], [c.cost_usd for c in rec.pareto], where="post",
                color="black", linewidth=1.2, label="Pareto front")
        ax.scatter([c.hours for c in rec.pareto], [c.cost_usd for c in rec.pareto], s=28,
                   facecolors="none", edgecolors="black", linewidths=0.9)
    if rec.target.deadline_hours:
        ax.axvline(rec.target.deadline_hours, color="crimson", linestyle="--", linewidth=1,
                   label=f"deadline {hours_text(rec.target.deadline_hours)}")
    if rec.winner is not None:
        w = rec.winner
        ax.scatter([w.hours], [w.cost_usd], marker="*", s=260, color="gold",
                   edgecolors="black", zorder=5, label="recommended")
        ax.errorbar([w.hours], [w.cost_usd],
                    xerr=[[w.hours - w.hours_low], [w.hours_high - w.hours]],
                    yerr=[[max(0.0, w.cost_usd - w.cost_low_usd)],
                          [max(0.0, w.cost_high_usd - w.cost_usd)]],
                    fmt="none", ecolor="black", elinewidth=0.8, capsize=3, zorder=4)
    if cands:
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_labels(ax)
    ax.set_xlabel("predicted time to train (hours)")
    ax.set_ylabel("expected cost (USD)")
    ax.set_title("Cost vs time of every feasible plan")
    ax.grid(True, which="both", alpha=0.25)
    if cands:  # outside the axes: the cheap corner is where the eye must go
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.85)
    return _png(fig)


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


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def scaling_png(points: Sequence[ScalingPoint], measured: Sequence[Observation] = ()) -> bytes:
    """Predicted global throughput vs GPU count per GPU type and instance family (colour:
    GPU; marker and dash: family), with the measured points."""
    fig = _figure(8.5, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    series = scaling_series(points)
    names = [s.gpu for s in series] + [o.gpu for o in measured]
    colors = _colors(names)
    nth: dict[str, int] = {}
    for s in series:
        k = nth[s.gpu] = nth.get(s.gpu, -1) + 1
        ax.plot(s.gpus, s.throughput_samples_per_s, marker=_MARKERS[k % len(_MARKERS)],
                markersize=4, linestyle=("-", "--", ":", "-.")[k % 4], color=colors[s.gpu],
                label=s.label)
        ax.fill_between(s.gpus, s.low, s.high, color=colors[s.gpu], alpha=0.05, linewidth=0)
    for o in measured:
        ax.scatter([o.gpu_count], [o.throughput_samples_per_s], marker="D", s=46,
                   color=colors.get(o.gpu, "black"), edgecolors="black", zorder=5,
                   label=f"{o.gpu} measured")
    if points or measured:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_labels(ax, x_base=2)
        handles, labels = ax.get_legend_handles_labels()
        seen: dict[str, object] = {}
        for h, lab in zip(handles, labels, strict=True):
            seen.setdefault(lab, h)
        ax.legend(list(seen.values()), list(seen), fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), framealpha=0.85)
    ax.set_xlabel("GPUs (data parallel: DDP, or ZeRO/FSDP where DDP does not fit)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("Predicted scaling per GPU type and instance family "
                 "(band: interval; diamonds: measured)")
    ax.grid(True, which="both", alpha=0.25)
    return _png(fig)
