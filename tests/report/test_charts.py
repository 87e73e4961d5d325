"""The recommendation's charts: log axes, ticks, where things land in the PNG, the legend."""

from __future__ import annotations

import io
import math

import pytest
from PIL import Image
from support.recommend import GPUS, OFFERS, RESNET, AnalyticPredictor, hardware_for

from mlflow_gpuopt.perfmodel import Observation
from mlflow_gpuopt.recommend import Target, recommend
from mlflow_gpuopt.report.canvas import (
    Band,
    Chart,
    ErrorBar,
    Line,
    LogAxis,
    Points,
    VLine,
    legend_entries,
    log_ticks,
    render_png,
    tick_text,
)
from mlflow_gpuopt.report.charts import pareto_chart, scaling_chart, scaling_series

RED, GREEN, BLUE = (255, 0, 0), (0, 160, 0), (0, 0, 255)


def _image(png: bytes) -> Image.Image:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return Image.open(io.BytesIO(png)).convert("RGB")


def _centroid(img: Image.Image, rgb, tol: int = 40) -> tuple[float, float, int]:
    """Mean (x, y) of the pixels within ``tol`` of ``rgb`` on every channel, and their count."""
    w = img.width
    sx = sy = n = 0
    for i, px in enumerate(img.getdata()):
        if all(abs(a - b) <= tol for a, b in zip(px, rgb, strict=True)):
            sx += i % w
            sy += i // w
            n += 1
    assert n, f"no pixel of colour {rgb}"
    return sx / n, sy / n, n


def _rec():
    target = Target(total_samples=90 * 1_281_167, deadline_hours=24.0, per_rank_batch=256)
    return recommend(AnalyticPredictor(RESNET), RESNET, OFFERS, GPUS, target,
                     hardware_for=hardware_for)


def test_log_ticks_label_decades_and_fall_back_to_readable_steps():
    major, minor = log_ticks(LogAxis(0.8, 250))
    assert major == (1, 10, 100)
    assert {2, 9, 20, 90, 200} <= set(minor) and not set(minor) & set(major)
    # under three decades: the 2x and 5x values are labelled too
    assert log_ticks(LogAxis(0.08, 0.6))[0] == pytest.approx((0.1, 0.2, 0.5))
    assert log_ticks(LogAxis(7, 150))[0] == pytest.approx((10, 20, 50, 100))
    # inside one decade with a single 2x/5x value: evenly stepped ticks (step 0.05 here)
    assert log_ticks(LogAxis(0.15, 0.35))[0] == pytest.approx((0.15, 0.2, 0.25, 0.3, 0.35))
    assert log_ticks(LogAxis(0.9, 17, base=2)) == ((1, 2, 4, 8, 16), ())


def test_tick_text_is_plain_in_the_everyday_range():
    assert [tick_text(v) for v in (0.001, 0.15, 12.5, 100000, 1e6, 2.5e-5)] == [
        "0.001", "0.15", "12.5", "100000", "1e+06", "2.5e-05"]


def test_log_axis_spans_the_data_with_a_margin_and_never_takes_a_log_of_zero():
    ax = LogAxis.spanning([10, 1000, 0, -3, math.nan, math.inf])
    assert ax.lo == pytest.approx(10 / 10 ** 0.1) and ax.hi == pytest.approx(1000 * 10 ** 0.1)
    assert ax.fraction(100) == pytest.approx(0.5)
    assert ax.fraction(0) == 0 and ax.fraction(math.inf) == 1


def test_points_land_where_their_log_values_say():
    """Three markers at 1, 10, 100 (x) and 1000, 100, 10 (y): on log axes the middle one sits
    halfway between the others, and a larger y is drawn higher."""
    chart = Chart("t", "x", "y", (Points((1.0,), (1000.0,), RED, radius_px=4),
                                  Points((10.0,), (100.0,), GREEN, radius_px=4),
                                  Points((100.0,), (10.0,), BLUE, radius_px=4)), legend=False)
    img = _image(render_png(chart))
    (rx, ry, _), (gx, gy, _), (bx, by, _) = (_centroid(img, c) for c in (RED, GREEN, BLUE))
    assert gx == pytest.approx((rx + bx) / 2, abs=1.0)
    assert gy == pytest.approx((ry + by) / 2, abs=1.0)
    assert rx < gx < bx and ry < gy < by  # y grows upwards
    assert bx - rx > 300  # spread over the axes, not bunched


def test_every_item_kind_renders_and_a_zero_lower_error_is_kept_on_the_axes():
    items = (Band((1, 2, 4), (5, 9, 15), (8, 14, 30), GREEN),
             Line((1, 2, 4), (6, 11, 20), GREEN, dash="--", marker="s", label="line"),
             Line((1, 2, 4), (20, 12, 7), BLUE, steps_post=True, label="steps"),
             Points((2,), (10,), None, marker="D", edge=(0, 0, 0), label="hollow"),
             VLine(3, RED, label="deadline"),
             ErrorBar(2, 10, 1.5, 3, 0.0, 12),
             Points((2,), (10,), (255, 215, 0), marker="*", radius_px=9, edge=(0, 0, 0)))
    for marker in ("o", "^", "v", "P", "X"):
        items += (Points((3,), (9,), BLUE, marker=marker),)
    img = _image(render_png(Chart("every kind", "x", "y", items, x_log_base=2)))
    _centroid(img, (255, 215, 0), tol=10)  # the star
    _centroid(img, RED, tol=10)  # the deadline (and its legend swatch)
    assert [e.label for e in legend_entries(items)] == ["line", "steps", "hollow", "deadline"]


def test_a_vertical_line_beyond_the_data_widens_the_axis_to_show_it():
    """A deadline past every plan still appears where the legend says it is."""
    chart = Chart("t", "x", "y", (Points((1.0, 2.0), (1.0, 2.0), BLUE),
                                  VLine(40.0, RED, dash="-", width_px=2, label="deadline")),
                  legend=False)
    img = _image(render_png(chart))
    rx, _, n = _centroid(img, RED, tol=10)
    bx, _, _ = _centroid(img, BLUE, tol=60)
    assert n > 100 and rx > bx + 200  # a long red line, far right of the points


def test_unknown_marker_is_refused():
    with pytest.raises(ValueError, match="unknown marker"):
        render_png(Chart("t", "x", "y", (Points((1,), (1,), RED, marker="?"),)))


def test_the_image_grows_to_hold_a_long_legend_and_the_same_chart_gives_the_same_bytes():
    short = Chart("t", "x", "y", (Points((1, 10), (1, 10), RED, label="a"),))
    long = Chart("t", "x", "y", (Points((1, 10), (1, 10), RED, label="a" * 150),))
    w_short, w_long = _image(render_png(short)).width, _image(render_png(long)).width
    assert w_long - w_short > 149 * 4  # each "a" is several pixels wide at 11 px
    tall = Chart("t", "x", "y", tuple(Points((1,), (1,), RED, label=f"gpu {i}")
                                      for i in range(60)))
    assert _image(render_png(tall)).height > 60 * 11  # sixty rows, none cut off
    assert render_png(long) == render_png(long)


def test_pareto_chart_has_one_series_per_gpu_the_front_the_deadline_and_the_winner():
    rec = _rec()
    assert rec.winner is not None and rec.pareto
    chart = pareto_chart(rec)
    labels = [e.label for e in legend_entries(chart.items)]
    gpus = sorted({c.offer.gpu for c in rec.candidates})
    assert labels == [*gpus, "Pareto front", "deadline 24 h", "recommended"]
    star = next(i for i in chart.items if isinstance(i, Points) and i.marker == "*")
    assert (star.xs, star.ys) == ((rec.winner.hours,), (rec.winner.cost_usd,))
    bar = next(i for i in chart.items if isinstance(i, ErrorBar))
    assert (bar.x_low, bar.x_high) == (rec.winner.hours_low, rec.winner.hours_high)
    _centroid(_image(render_png(chart)), (255, 215, 0), tol=10)


def test_scaling_chart_draws_one_line_per_gpu_type_and_each_measured_gpu_once_in_the_legend():
    rec = _rec()
    measured = [Observation(gpu="A100-80GB-SXM4", gpu_count=n, throughput_samples_per_s=t,
                            micro_batch=256, strategy="ddp", precision="fp16")
                for n, t in ((1, 2400), (8, 16000))]
    chart = scaling_chart(rec.scaling, measured)
    families = scaling_series(rec.scaling)
    # the expected lines, from the per-family series: each GPU type's family of highest
    # throughput, fastest type first
    best: dict[str, object] = {}
    for s in families:
        if s.gpu not in best or max(s.throughput_samples_per_s) > max(
                best[s.gpu].throughput_samples_per_s):
            best[s.gpu] = s
    expected = sorted(best.values(), key=lambda s: -max(s.throughput_samples_per_s))[:10]
    assert len(families) > len(expected)  # some types are sold as several families
    labelled = [i for i in chart.items if isinstance(i, Line) and i.label]
    assert [(ln.xs, ln.ys) for ln in labelled] == [(s.gpus, s.throughput_samples_per_s)
                                                   for s in expected]
    assert len({ln.color for ln in labelled}) == len(labelled)  # one colour per GPU type
    bands = [i for i in chart.items if isinstance(i, Band)]
    assert [(b.xs, b.low, b.high) for b in bands] == [(s.gpus, s.low, s.high)
                                                      for s in expected[:3]]
    shown = {s.gpu for s in expected}
    assert [e.label for e in legend_entries(chart.items)] == [
        *(s.label for s in expected),
        *(["A100-80GB-SXM4 measured"] if "A100-80GB-SXM4" in shown else [])]
    assert ("diamonds: measured" in chart.title) == ("A100-80GB-SXM4" in shown)
    assert chart.x_log_base == 2
    assert _image(render_png(chart)).width > chart.axes_width_px
    # without measurements the title promises none
    assert "diamonds" not in scaling_chart(rec.scaling).title


def test_scaling_chart_keeps_at_most_ten_gpu_types():
    from mlflow_gpuopt.recommend.types import ScalingPoint

    points = [ScalingPoint(gpu=f"GPU-{k:02d}", gpus=n, throughput_samples_per_s=100.0 * k * n,
                           low=50.0 * k * n, high=150.0 * k * n, provider="aws", family=fam,
                           instance_type=f"{fam}.x", nodes=1)
              for k in range(1, 15) for fam in ("a", "b") for n in (1, 2, 4)]
    chart = scaling_chart(points)
    labelled = [i for i in chart.items if isinstance(i, Line) and i.label]
    assert [ln.label.split(" ")[0] for ln in labelled] == [f"GPU-{k:02d}" for k in
                                                           range(14, 4, -1)]
    assert sum(isinstance(i, Band) for i in chart.items) == 3
    assert "the 10 fastest of 14 GPU types" in chart.title
