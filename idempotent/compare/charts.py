"""The report's SVG charts: axes with round ticks, linear or log scales, and text sized to fit.

No plotting library and no script: the page must render offline. Every chart computes its
margins from the text it holds (an estimate of each string's width, on the generous side),
so titles, tick labels and the rotated system names stay inside the chart's box; the render
test in headless Chromium checks that none of them overflows.

* :func:`linear_scale` puts ticks on round values (1, 2, 2.5 or 5 times a power of ten) from
  0 up to the first tick at or above the largest value.
* :func:`log_scale` spans whole decades, so values that differ a thousandfold (the latency
  of SQLite in process and of a restarted Kafka) are both readable.
* :func:`bar_chart` draws grouped bars, optionally with a dashed reference line (the
  offered rate); :func:`timeline_chart` a run's acknowledgements over time with its fault
  windows shaded.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)
_NARROW = set("fijlrt.,:;!|'()[] ·")
_WIDE = set("mwMW%@")
_ROTATION = 35.0


def text_width(text: str, size: float, bold: bool = False) -> float:
    """A generous estimate of ``text``'s width in px at ``size`` px (sans-serif)."""
    em = 0.0
    for char in text:
        if char in _NARROW:
            em += 0.36
        elif char in _WIDE:
            em += 0.98
        elif char.isupper():
            em += 0.74
        else:
            em += 0.64
    return em * size * (1.1 if bold else 1.0)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _decimals(step: float) -> int:
    for decimals in range(8):
        if abs(round(step, decimals) - step) <= step * 1e-9:
            return decimals
    return 8


def tick_label(value: float, step: float | None = None) -> str:
    """A tick's label: thousands separated, with the decimals ``step`` needs (none for whole
    numbers); without ``step`` (log scales), as few as ``value`` needs."""
    if value == 0:
        return "0"
    decimals = _decimals(step if step is not None else value)
    return f"{value:,.{decimals}f}"


@attrs.frozen
class Scale:
    """A value axis: ``low`` .. ``high``, linear or logarithmic, with its tick values."""

    low: float
    high: float
    log: bool
    ticks: tuple[float, ...]
    step: float | None = None

    def fraction(self, value: float) -> float:
        """Where ``value`` lies on the axis, 0 (``low``) .. 1 (``high``), clamped."""
        if self.log:
            if value <= 0:
                return 0.0
            span = math.log10(self.high) - math.log10(self.low)
            at = (math.log10(value) - math.log10(self.low)) / span
        else:
            at = (value - self.low) / (self.high - self.low)
        return min(1.0, max(0.0, at))

    def labels(self) -> list[str]:
        """The tick labels, in tick order."""
        return [tick_label(t, self.step) for t in self.ticks]


def nice_step(span: float, intervals: int) -> float:
    """The smallest round step (1, 2, 2.5 or 5 x 10^k) that covers ``span`` in ``intervals``."""
    raw = span / max(1, intervals)
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in _STEPS if m * power >= raw * (1 - 1e-12))


def linear_scale(peak: float, intervals: int = 4) -> Scale:
    """0 .. the first round tick at or above ``peak`` (1 when ``peak`` is not positive)."""
    peak = peak if peak > 0 and math.isfinite(peak) else 1.0
    step = nice_step(peak, intervals)
    count = max(1, math.ceil(peak / step - 1e-9))
    ticks = tuple(float(f"{i * step:.12g}") for i in range(count + 1))
    return Scale(0.0, ticks[-1], False, ticks, step)


def log_scale(values: Sequence[float], floor: float | None = None) -> Scale:
    """Whole decades around the positive ``values`` (1 .. 10 when there are none), starting
    at ``floor`` or lower (counts start at 1); 2 and 5 are ticks too when the scale spans at
    most two decades."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    low_exp = math.floor(math.log10(min(positive))) if positive else 0
    if floor is not None:
        low_exp = min(low_exp, math.floor(math.log10(floor)))
    high_exp = math.ceil(math.log10(max(positive))) if positive else 1
    high_exp = max(high_exp, low_exp + 1)
    multiples = (1, 2, 5) if high_exp - low_exp <= 2 else (1,)
    ticks = [float(f"{m * 10.0**e:.12g}") for e in range(low_exp, high_exp) for m in multiples]
    ticks.append(float(f"{10.0**high_exp:.12g}"))
    return Scale(ticks[0], ticks[-1], True, tuple(ticks))


def _rotated_extent(text: str, size: float) -> tuple[float, float]:
    """How far a label rotated by -35 degrees (anchored at its end) reaches left and down."""
    width = text_width(text, size)
    angle = math.radians(_ROTATION)
    return width * math.cos(angle) + size * math.sin(angle), width * math.sin(angle) + size * math.cos(angle)


def _legend(items: Sequence[tuple[str, str]], x0: float, y0: float, right: float) -> tuple[list[str], float]:
    """Legend entries (colour or ``"dashed"``, label) flowing in rows from (x0, y0) up to
    ``right``; returns the SVG parts and the y below the last row."""
    parts: list[str] = []
    x, y = x0, y0
    for colour, label in items:
        width = 14 + text_width(label, 11) + 16
        if x > x0 and x + width > right:
            x, y = x0, y + 18
        if colour == "dashed":
            parts.append(f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 10:.1f}" y2="{y - 4}" stroke="#333" '
                         'stroke-dasharray="3 2"/>')  # fmt: skip
        else:
            parts.append(f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text class="legend" x="{x + 14:.1f}" y="{y}" font-size="11">{_esc(label)}</text>')
        x += width
    return parts, y + 8


def bar_chart(
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    value: Callable[[str, str], float | None],
    unit: str,
    chart_id: str,
    *,
    log: bool = False,
    counts: bool = False,
    subtitle: str = "",
    reference: tuple[float, str] | None = None,
) -> str:
    """Grouped bars: one group per ``groups`` entry, one bar per ``series`` entry.

    ``log`` draws the values on a log scale (a value of 0 or less gets no bar; with
    ``counts`` the scale starts at 1 or lower);
    ``reference`` is a (value, legend label) drawn as a dashed horizontal line.
    """
    values = [[value(g, s) for s in series] for g in groups]
    present = [v for row in values for v in row if v is not None]
    if reference is not None:
        present.append(reference[0])
    scale = log_scale(present, 1.0 if counts else None) if log else linear_scale(max(present, default=0.0))
    labels = scale.labels()
    tick_w = max(text_width(label, 10) for label in labels)
    group_w = max(40.0, len(series) * 10 + 14)
    extents = [_rotated_extent(g, 11) for g in groups]
    left = 8 + 16 + tick_w + 6
    for index, (reach, _down) in enumerate(extents):
        left = max(left, reach + 4 - group_w * (index + 0.5))
    plot_w, plot_h = group_w * max(1, len(groups)), 200.0
    top = 30 + (16 if subtitle else 0) + 8
    axis_y = top + plot_h
    legend_y = axis_y + 8 + max((down for _reach, down in extents), default=0) + 18
    items = [(PALETTE[i % len(PALETTE)], name) for i, name in enumerate(series)]
    if reference is not None:
        items.append(("dashed", reference[1]))
    longest_item = max((14 + text_width(label, 11) + 16 for _c, label in items), default=0)
    width = max(
        left + plot_w + 12, 16 + text_width(title, 14, bold=True), 16 + text_width(subtitle, 11), 8 + longest_item, 360
    )
    legend, bottom = _legend(items, 8, legend_y, width - 8)
    height = bottom + 4
    parts = [
        f'<svg id="{chart_id}" class="chart" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" font-family="sans-serif">',
        f'<text class="title" x="8" y="20" font-size="14" font-weight="bold">{_esc(title)}</text>',
    ]
    if subtitle:
        parts.append(f'<text class="subtitle" x="8" y="37" font-size="11" fill="#555">{_esc(subtitle)}</text>')
    for tick, label in zip(scale.ticks, labels, strict=True):
        y = axis_y - plot_h * scale.fraction(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(
            f'<text class="tick" x="{left - 5:.1f}" y="{y + 3.5:.1f}" text-anchor="end" font-size="10">{label}</text>'
        )
    middle = top + plot_h / 2
    parts.append(
        f'<text class="unit" x="20" y="{middle:.1f}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 20 {middle:.1f})">{_esc(unit + (", log scale" if log else ""))}</text>'
    )
    drawn = 0
    for gi, group in enumerate(groups):
        x0 = left + gi * group_w + 7
        bar_w = (group_w - 14) / max(1, len(series))
        for si, v in enumerate(values[gi]):
            if v is None or (log and v <= 0):
                continue
            h = max(1.0, plot_h * scale.fraction(v))
            drawn += 1
            parts.append(
                f'<rect class="bar" x="{x0 + si * bar_w:.1f}" y="{axis_y - h:.1f}" width="{max(1.0, bar_w - 1):.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}"><title>{_esc(group)} / '
                f"{_esc(series[si])}: {_esc(_plain(v))} {_esc(unit)}</title></rect>"
            )
        cx, cy = left + (gi + 0.5) * group_w, axis_y + 12
        parts.append(
            f'<text class="group" x="{cx:.1f}" y="{cy:.1f}" font-size="11" text-anchor="end" '
            f'transform="rotate(-{_ROTATION:g} {cx:.1f} {cy:.1f})">{_esc(group)}</text>'
        )
    if reference is not None:
        y = axis_y - plot_h * scale.fraction(reference[0])
        parts.append(
            f'<line class="reference" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#333" '
            'stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
    if not drawn:
        parts.append(
            f'<text class="empty" x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
            'font-size="12" fill="#555">none</text>'
        )
    parts += [
        f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" stroke="#333"/>',
        *legend,
        "</svg>",
    ]
    return "\n".join(parts)


def _plain(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def timeline_chart(run: dict[str, Any], chart_id: str) -> str:
    """Acknowledgements per second over the run, with each fault window shaded."""
    acks = run["timeline"]["acks"]
    bucket = run["timeline"]["bucket_s"] or 1.0
    span = bucket * len(acks)
    rates = [a / bucket for a in acks]
    y_scale = linear_scale(max(rates, default=0.0), 2)
    x_scale = linear_scale(span, 4)
    y_labels, x_labels = y_scale.labels(), x_scale.labels()
    title = f"{run['system']} · {run['fault']} · seed {run['seed']}"
    left = max(50.0, 6 + max(text_width(label, 10) for label in y_labels) + 5)
    plot_w, plot_h, top = 340.0, 90.0, 30.0
    right = max(10.0, text_width(x_labels[-1] + " s", 10) / 2 + 4)
    width = max(left + plot_w + right, 8 + text_width(title, 12, bold=True))
    axis_y = top + plot_h
    height = axis_y + 34
    parts = [
        f'<svg id="{chart_id}" class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" font-family="sans-serif">',
        f'<text class="title" x="4" y="15" font-size="12" font-weight="bold">{_esc(title)}</text>',
    ]
    for window in run.get("faults", []):
        if not window.get("applied"):
            continue
        x = left + plot_w * x_scale.fraction(window["start_s"])
        w = max(2.0, plot_w * (x_scale.fraction(window["end_s"]) - x_scale.fraction(window["start_s"])))
        parts.append(
            f'<rect class="fault" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{plot_h}" fill="#e15759" '
            f'fill-opacity="0.25"><title>{_esc(window["fault"])} at {window["start_s"]:.2f}-{window["end_s"]:.2f} s'
            "</title></rect>"
        )
    for tick, label in zip(y_scale.ticks, y_labels, strict=True):
        y = axis_y - plot_h * y_scale.fraction(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(
            f'<text class="tick" x="{left - 4:.1f}" y="{y + 3.5:.1f}" text-anchor="end" font-size="10">{label}</text>'
        )
    for index, (tick, label) in enumerate(zip(x_scale.ticks, x_labels, strict=True)):
        x = left + plot_w * x_scale.fraction(tick)
        text = label + (" s" if index == len(x_labels) - 1 else "")
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{axis_y + 13}" text-anchor="middle" font-size="10">{text}</text>'
        )
    points = " ".join(
        f"{left + plot_w * x_scale.fraction((i + 0.5) * bucket):.1f},{axis_y - plot_h * y_scale.fraction(r):.1f}"
        for i, r in enumerate(rates)
    )
    parts += [
        f'<polyline points="{points}" fill="none" stroke="#4e79a7" stroke-width="1.5"/>',
        f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" stroke="#333"/>',
        f'<text class="caption" x="{left}" y="{height - 4}" font-size="10" fill="#555">'
        "acknowledgements/s over time</text>",
        "</svg>",
    ]
    return "\n".join(parts)


__all__ = [
    "PALETTE",
    "Scale",
    "bar_chart",
    "linear_scale",
    "log_scale",
    "nice_step",
    "text_width",
    "tick_label",
    "timeline_chart",
]
