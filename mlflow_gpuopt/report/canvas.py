"""A small raster plotter on Pillow: log axes, grid, lines, markers, bands, a legend; PNG out.

A chart is data (:class:`Chart` holding frozen items) and :func:`render_png` draws it; nothing
here reads or writes files. Everything is drawn at :data:`SUPERSAMPLE` times the output size and
box-reduced, which anti-aliases lines and markers; text is anti-aliased by FreeType.

Why not matplotlib: every logged ``recommend`` draws two charts, and matplotlib's import
(~0.27 s of CPU) plus laying out the legends (~0.6 s for both charts) cost more than the rest of
the command beyond MLflow's own import. Pillow draws both in a few hundredths of a second, and
the charts need only what is here: log axes, points, lines, steps, bands, error bars, a legend.

Sizes are in output pixels (``*_px``); data values are in the axes' own units (positive: both
axes are logarithmic).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

RGB = tuple[int, int, int]

#: Drawn at this multiple of the output size, then box-reduced (anti-aliasing).
SUPERSAMPLE = 2

#: Matplotlib's "tab20" colours, the ten strong ones first so that up to ten series never get
#: a pale shade.
PALETTE: tuple[RGB, ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
    (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    (196, 156, 148), (247, 182, 210), (199, 199, 199), (219, 219, 141), (158, 218, 229))

BLACK: RGB = (0, 0, 0)
_TEXT: RGB = (31, 35, 40)
_GRID: RGB = (226, 228, 232)
_GRID_MINOR: RGB = (242, 243, 245)
_FRAME: RGB = (87, 96, 106)

#: Font sizes and the legend's swatch width, in output pixels.
_FONT_PX = {"title": 15, "label": 13, "tick": 12, "legend": 11}
_SWATCH_PX = 26

#: Marker names (matplotlib's letters): circle, square, triangles, diamond, plus, x, star.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
#: Line styles: solid, dashed, dotted, dash-dot; on/off lengths in output pixels.
DASHES: dict[str, tuple[float, ...]] = {"-": (), "--": (6.0, 3.5), ":": (1.5, 2.5),
                                        "-.": (6.0, 2.5, 1.5, 2.5)}


@dataclass(frozen=True)
class Points:
    """Markers at (xs, ys). ``edge`` outlines them; ``fill=None`` draws hollow ones."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    fill: RGB | None
    marker: str = "o"
    radius_px: float = 3.0
    alpha: float = 1.0
    edge: RGB | None = None
    label: str = ""


@dataclass(frozen=True)
class Line:
    """A polyline through (xs, ys), optionally dashed, with markers; ``steps_post`` draws
    matplotlib's ``step(where="post")`` (each value held until the next x)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    color: RGB
    width_px: float = 1.5
    dash: str = "-"
    marker: str | None = None
    marker_radius_px: float = 2.5
    steps_post: bool = False
    label: str = ""


@dataclass(frozen=True)
class Band:
    """The area between ``low`` and ``high`` over ``xs``, translucent."""

    xs: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    color: RGB
    alpha: float = 0.08


@dataclass(frozen=True)
class VLine:
    """A vertical line across the axes at ``x`` (the x axis widens to hold it)."""

    x: float
    color: RGB
    dash: str = "--"
    width_px: float = 1.0
    label: str = ""


@dataclass(frozen=True)
class ErrorBar:
    """Horizontal and vertical whiskers with caps around (x, y)."""

    x: float
    y: float
    x_low: float
    x_high: float
    y_low: float
    y_high: float
    color: RGB = BLACK


Item = Points | Line | Band | VLine | ErrorBar


@dataclass(frozen=True)
class Chart:
    """What to draw: items in drawing order, on log axes of the given bases.

    The legend lists the labelled items, each label once, in order; it sits right of the axes
    and the image grows to hold it (never clipped).
    """

    title: str
    x_label: str
    y_label: str
    items: tuple[Item, ...]
    x_log_base: float = 10.0
    y_log_base: float = 10.0
    axes_width_px: int = 620
    axes_height_px: int = 380
    legend: bool = True


@dataclass(frozen=True)
class LogAxis:
    """A logarithmic axis from ``lo`` to ``hi`` (data units, ``0 < lo < hi``)."""

    lo: float
    hi: float
    base: float = 10.0

    @classmethod
    def spanning(cls, values: Sequence[float], base: float = 10.0,
                 margin: float = 0.05) -> LogAxis:
        """The axis over the positive finite ``values``, padded by ``margin`` of its log span
        on each side (matplotlib's default margin); a decade around 1 with none."""
        vals = [v for v in values if v > 0 and math.isfinite(v)]
        if not vals:
            return cls(1.0 / base, base, base)
        lo, hi = math.log(min(vals), base), math.log(max(vals), base)
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        pad = (hi - lo) * margin
        return cls(base ** (lo - pad), base ** (hi + pad), base)

    def fraction(self, value: float) -> float:
        """Where ``value`` lies, 0 at ``lo`` and 1 at ``hi`` (a value a log axis cannot show,
        zero, negative or NaN, sits at ``lo``; infinity at ``hi``)."""
        if not value > 0:
            value = self.lo
        elif value == math.inf:
            value = self.hi
        return (math.log(value) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))

    def contains(self, value: float) -> bool:
        return value > 0 and self.lo <= value <= self.hi


def log_ticks(axis: LogAxis) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(labelled, unlabelled) tick values inside ``axis``.

    Labelled: the powers of the base. A base-10 axis with fewer than three of them labels its
    2× and 5× values too, and one still short of two gets evenly stepped ticks (1, 2, 2.5 or 5
    × a power of ten) so that every axis can be read. Unlabelled (minor grid): the 2…9 × 10^k
    values of a base-10 axis.
    """
    lo_e = math.floor(math.log(axis.lo, axis.base) + 1e-9)
    hi_e = math.ceil(math.log(axis.hi, axis.base) - 1e-9)
    major = [axis.base ** e for e in range(lo_e, hi_e + 1) if axis.contains(axis.base ** e)]
    if axis.base != 10:
        return tuple(major), ()
    minor = [m * 10.0 ** e for e in range(lo_e, hi_e + 1) for m in range(2, 10)
             if axis.contains(m * 10.0 ** e)]
    if len(major) < 3:
        major = sorted(major + [v for v in minor if _mantissa(v) in (2, 5)])
        minor = [v for v in minor if v not in major]
    if len(major) < 2:
        major = list(_linear_ticks(axis.lo, axis.hi))
    return tuple(major), tuple(minor)


def _mantissa(v: float) -> int:
    return round(v / 10.0 ** math.floor(math.log10(v) + 1e-9))


def _linear_ticks(lo: float, hi: float, want: int = 4) -> tuple[float, ...]:
    raw = (hi - lo) / want
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return tuple(round(k * step, 12) for k in range(first, math.floor(hi / step + 1e-9) + 1))


def tick_text(value: float) -> str:
    """A tick label: plain digits from 0.001 to 999,999 (``0.15``, ``12.5``, ``100000``),
    else exponent form (``1e+06``, ``2.5e-05``)."""
    if 1e-3 <= abs(value) < 1e6:
        return f"{value:.6g}"
    return f"{value:.2g}"


@functools.lru_cache(maxsize=16)
def _font(size_px: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size_px)


def _text_size(text: str, font) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return right - left, bottom - top


def _draw_text(draw, x: float, y: float, text: str, font, fill: RGB,
               h_align: str = "left", v_align: str = "top") -> None:
    """``text`` with its ink box placed by (x, y) and the alignments (left/center/right,
    top/middle/bottom), computed from the font's own box so any Pillow font works."""
    left, top, right, bottom = font.getbbox(text)
    w, h = right - left, bottom - top
    x -= {"left": 0, "center": w / 2, "right": w}[h_align] + left
    y -= {"top": 0, "middle": h / 2, "bottom": h}[v_align] + top
    draw.text((x, y), text, font=font, fill=fill)


def _rgba(color: RGB, alpha: float) -> tuple[int, int, int, int]:
    return (*color, round(255 * max(0.0, min(1.0, alpha))))


def marker_polygon(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The outline of a marker of "radius" ``r`` centred on (cx, cy); circles excluded."""
    if kind == "s":
        r *= 0.85
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if kind in ("^", "v"):
        s = -1 if kind == "^" else 1
        return [(cx, cy + s * r), (cx + 0.95 * r, cy - s * 0.6 * r),
                (cx - 0.95 * r, cy - s * 0.6 * r)]
    if kind == "D":
        return [(cx, cy - r), (cx + 0.75 * r, cy), (cx, cy + r), (cx - 0.75 * r, cy)]
    if kind in ("P", "X"):
        t = 0.36 * r
        arm = [(t, r), (t, t), (r, t), (r, -t), (t, -t), (t, -r), (-t, -r), (-t, -t), (-r, -t),
               (-r, t), (-t, t), (-t, r)]
        a = math.pi / 4 if kind == "X" else 0.0
        c, s = math.cos(a), math.sin(a)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in arm]
    if kind == "*":
        return [(cx + (r if i % 2 == 0 else 0.4 * r) * math.sin(i * math.pi / 5),
                 cy - (r if i % 2 == 0 else 0.4 * r) * math.cos(i * math.pi / 5))
                for i in range(10)]
    raise ValueError(f"unknown marker {kind!r}; known: {', '.join(MARKERS)}")


def _marker(draw, kind: str, cx: float, cy: float, r: float, fill, edge, edge_w: int) -> None:
    if kind == "o":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=edge,
                     width=edge_w if edge else 0)
    else:
        draw.polygon(marker_polygon(kind, cx, cy, r), fill=fill, outline=edge,
                     width=edge_w if edge else 0)


def _dashed(draw, pts: Sequence[tuple[float, float]], pattern: Sequence[float], fill,
            width: int) -> None:
    """A polyline drawn as dashes of ``pattern`` (on, off, … in drawing pixels)."""
    if not pattern:
        draw.line(list(pts), fill=fill, width=width, joint="curve")
        return
    k, left, on = 0, pattern[0], True
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        seg = math.hypot(x1 - x0, y1 - y0)
        pos = 0.0
        while pos < seg:
            step = min(left, seg - pos)
            if on:
                a, b = pos / seg, (pos + step) / seg
                draw.line([(x0 + (x1 - x0) * a, y0 + (y1 - y0) * a),
                           (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)], fill=fill, width=width)
            pos += step
            left -= step
            if left <= 1e-9:
                k = (k + 1) % len(pattern)
                left, on = pattern[k], not on


def _step_post(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    sx, sy = [xs[0]], [ys[0]]
    for x, y, prev in zip(xs[1:], ys[1:], ys, strict=False):
        sx += [x, x]
        sy += [prev, y]
    return sx, sy


def _extent(items: Sequence[Item]) -> tuple[list[float], list[float]]:
    """Every x and y value the axes must show (a vertical line too: a deadline in the legend
    is a deadline on the axes)."""
    xs: list[float] = []
    ys: list[float] = []
    for it in items:
        if isinstance(it, (Points, Line)):
            xs += it.xs
            ys += it.ys
        elif isinstance(it, Band):
            xs += it.xs
            ys += [*it.low, *it.high]
        elif isinstance(it, ErrorBar):
            xs += [it.x_low, it.x_high]
            ys += [it.y_low, it.y_high]
        elif isinstance(it, VLine):
            xs.append(it.x)
    return xs, ys


@dataclass(frozen=True)
class _Entry:
    label: str
    color: RGB
    marker: str | None
    dash: str | None
    edge: RGB | None
    hollow: bool


def legend_entries(items: Sequence[Item]) -> tuple[_Entry, ...]:
    """One entry per distinct label, in drawing order."""
    seen: dict[str, _Entry] = {}
    for it in items:
        label = getattr(it, "label", "")
        if not label or label in seen:
            continue
        if isinstance(it, Points):
            seen[label] = _Entry(label, it.fill or it.edge or BLACK, it.marker, None, it.edge,
                                 it.fill is None)
        elif isinstance(it, Line):
            seen[label] = _Entry(label, it.color, it.marker, it.dash, None, False)
        elif isinstance(it, VLine):
            seen[label] = _Entry(label, it.color, None, it.dash, None, False)
    return tuple(seen.values())


@dataclass(frozen=True)
class _Layout:
    """Where the parts go, in drawing pixels (output pixels × :data:`SUPERSAMPLE`)."""

    width: int
    height: int
    left: int  # the axes' left edge
    top: int  # the axes' top edge
    axes_w: int
    axes_h: int
    pad: int
    tick_len: int
    tick_h: int
    legend_w: int
    legend_h: int
    row_h: int


def _layout(chart: Chart, fonts: dict, entries: Sequence[_Entry],
            y_major: Sequence[float]) -> _Layout:
    """Margins sized to the text they hold: the y tick labels and the rotated y label on the
    left, the title on top, tick labels and the x label below, the legend on the right."""
    s = SUPERSAMPLE
    pad, tick_len = 8 * s, 4 * s
    y_tick_w = max((_text_size(tick_text(v), fonts["tick"])[0] for v in y_major), default=0)
    tick_h = _text_size("0123456789", fonts["tick"])[1]
    label_h = _text_size("Ag", fonts["label"])[1]
    aw, ah = chart.axes_width_px * s, chart.axes_height_px * s
    left = pad + label_h + pad + y_tick_w + tick_len + 3 * s
    top = pad + _text_size("Ag", fonts["title"])[1] + pad
    row_h = round(_text_size("Ag", fonts["legend"])[1] * 1.55)
    legend_w = (_SWATCH_PX * s + 3 * pad + max(_text_size(e.label, fonts["legend"])[0]
                                               for e in entries)) if entries else 0
    legend_h = len(entries) * row_h + pad
    width = max(left + aw + (pad + legend_w if entries else 0) + pad,
                left + _text_size(chart.title, fonts["title"])[0] + pad)
    height = max(top + ah + tick_len + 3 * s + tick_h + pad + label_h + pad,
                 top + legend_h + pad)
    return _Layout(width, height, left, top, aw, ah, pad, tick_len, tick_h, legend_w,
                   legend_h, row_h)


def render_png(chart: Chart) -> bytes:
    """The chart as PNG bytes: title, axes with log ticks and grid, the items, the legend."""
    from PIL import Image, ImageDraw

    s = SUPERSAMPLE
    fonts = {k: _font(v * s) for k, v in _FONT_PX.items()}
    xs, ys = _extent(chart.items)
    xa = LogAxis.spanning(xs, chart.x_log_base)
    ya = LogAxis.spanning(ys, chart.y_log_base)
    x_major, x_minor = log_ticks(xa)
    y_major, y_minor = log_ticks(ya)
    entries = legend_entries(chart.items) if chart.legend else ()
    lay = _layout(chart, fonts, entries, y_major)
    aw, ah = lay.axes_w, lay.axes_h

    def px(x: float) -> float:
        return xa.fraction(x) * (aw - 1)

    def py(y: float) -> float:
        return (1.0 - ya.fraction(y)) * (ah - 1)

    # The data go on an image of the axes' size: whatever falls outside is clipped.
    axes = Image.new("RGB", (aw, ah), "white")
    d = ImageDraw.Draw(axes, "RGBA")
    for values, color in ((x_minor, _GRID_MINOR), (x_major, _GRID)):
        for v in values:
            d.line([(px(v), 0), (px(v), ah)], fill=color, width=s)
    for values, color in ((y_minor, _GRID_MINOR), (y_major, _GRID)):
        for v in values:
            d.line([(0, py(v)), (aw, py(v))], fill=color, width=s)
    for it in chart.items:
        _draw_item(d, it, px, py, xa, s, ah)

    img = Image.new("RGB", (lay.width, lay.height), "white")
    img.paste(axes, (lay.left, lay.top))
    d = ImageDraw.Draw(img)
    left, top, tick_len = lay.left, lay.top, lay.tick_len
    d.rectangle((left - s, top - s, left + aw, top + ah), outline=_FRAME, width=s)
    for v in x_major:
        x = left + px(v)
        d.line([(x, top + ah), (x, top + ah + tick_len)], fill=_FRAME, width=s)
        _draw_text(d, x, top + ah + tick_len + 3 * s, tick_text(v), fonts["tick"], _TEXT,
                   "center", "top")
    for v in y_major:
        y = top + py(v)
        d.line([(left - tick_len, y), (left, y)], fill=_FRAME, width=s)
        _draw_text(d, left - tick_len - 3 * s, y, tick_text(v), fonts["tick"], _TEXT,
                   "right", "middle")
    _draw_text(d, left, lay.pad, chart.title, fonts["title"], _TEXT)
    _draw_text(d, left + aw / 2, top + ah + tick_len + 3 * s + lay.tick_h + lay.pad,
               chart.x_label, fonts["label"], _TEXT, "center", "top")
    _paste_vertical(img, chart.y_label, fonts["label"], lay.pad, top + ah / 2)
    if entries:
        _draw_legend(ImageDraw.Draw(img, "RGBA"), entries, left + aw + lay.pad, top,
                     lay.legend_w, lay.legend_h, lay.row_h, fonts["legend"])

    out = io.BytesIO()
    img.reduce(s).save(out, format="PNG")
    return out.getvalue()


def _draw_item(d, it: Item, px, py, xa: LogAxis, s: int, height: int) -> None:
    if isinstance(it, Band):
        top = [(px(x), py(h)) for x, h in zip(it.xs, it.high, strict=True)]
        bottom = [(px(x), py(lo)) for x, lo in zip(it.xs, it.low, strict=True)]
        if len(top) > 1:
            d.polygon(top + bottom[::-1], fill=_rgba(it.color, it.alpha))
    elif isinstance(it, Line):
        xs, ys = _step_post(it.xs, it.ys) if it.steps_post else (it.xs, it.ys)
        pts = [(px(x), py(y)) for x, y in zip(xs, ys, strict=True)]
        if len(pts) > 1:
            _dashed(d, pts, [v * s for v in DASHES[it.dash]], it.color,
                    max(1, round(it.width_px * s)))
        if it.marker:
            for x, y in zip(it.xs, it.ys, strict=True):
                _marker(d, it.marker, px(x), py(y), it.marker_radius_px * s, it.color, None, 0)
    elif isinstance(it, Points):
        fill = _rgba(it.fill, it.alpha) if it.fill else None
        for x, y in zip(it.xs, it.ys, strict=True):
            _marker(d, it.marker, px(x), py(y), it.radius_px * s, fill, it.edge, s)
    elif isinstance(it, VLine):
        if xa.contains(it.x):
            x = px(it.x)
            _dashed(d, [(x, 0), (x, height)], [v * s for v in DASHES[it.dash]], it.color,
                    max(1, round(it.width_px * s)))
    elif isinstance(it, ErrorBar):
        cap = 3 * s
        x0, x1, y = px(it.x_low), px(it.x_high), py(it.y)
        y0, y1, x = py(it.y_low), py(it.y_high), px(it.x)
        for seg in (((x0, y), (x1, y)), ((x0, y - cap), (x0, y + cap)),
                    ((x1, y - cap), (x1, y + cap)), ((x, y0), (x, y1)),
                    ((x - cap, y0), (x + cap, y0)), ((x - cap, y1), (x + cap, y1))):
            d.line(list(seg), fill=it.color, width=s)


def _paste_vertical(img, text: str, font, x: float, cy: float) -> None:
    """``text`` rotated a quarter turn counter-clockwise, its left edge at x, centred on cy."""
    from PIL import Image, ImageDraw

    left, top, right, bottom = font.getbbox(text)
    strip = Image.new("L", (right - left + 2, bottom - top + 2), 0)
    ImageDraw.Draw(strip).text((-left + 1, -top + 1), text, font=font, fill=255)
    strip = strip.rotate(90, expand=True)
    img.paste(_TEXT, (round(x), round(cy - strip.height / 2)), strip)


def _draw_legend(d, entries: Sequence[_Entry], x: float, y: float, w: float, h: float,
                 row_h: float, font) -> None:
    s = SUPERSAMPLE
    d.rectangle((x, y, x + w, y + h), fill=(255, 255, 255, 235), outline=_GRID, width=s)
    pad = 8 * s
    for i, e in enumerate(entries):
        cy = y + pad / 2 + row_h * (i + 0.5)
        x0, x1 = x + pad, x + pad + _SWATCH_PX * s
        if e.dash is not None:
            _dashed(d, [(x0, cy), (x1, cy)], [v * s for v in DASHES[e.dash]], e.color,
                    max(1, round(1.5 * s)))
        if e.marker:
            fill = None if e.hollow else e.color
            r = (5 if e.marker == "*" else 3) * s
            _marker(d, e.marker, (x0 + x1) / 2, cy, r, fill, e.edge, s)
        _draw_text(d, x1 + pad, cy, e.label, font, _TEXT, "left", "middle")
