"""Inline SVG plots drawn in Python: the report opens offline, with no chart library.

Every plot is an ``<svg class="plot" data-plot=NAME>`` with a ``<title>`` per mark,
so hovering a bar tells its numbers and the page needs no JavaScript to show them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from html import escape

from pytest_osmosis.core.words import PASS_RATE_BASIS

WIDTH, HEIGHT = 360, 220
LEFT, RIGHT, TOP, BOTTOM = 50, 10, 16, 40
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
#: A tick label's width per character and the room kept between two labels, in the
#: plot's units (11 px text: a digit is about 6.6 units wide).
TICK_CHAR_W, TICK_GAP = 6.6, 4.0


def tick_stride(labels: Sequence[str], slot: float) -> int:
    """Label every n-th slot so that no two tick labels overlap (30 rows need every 2nd)."""
    widest = max((len(label) for label in labels), default=0) * TICK_CHAR_W + TICK_GAP
    return max(1, math.ceil(widest / slot)) if slot > 0 else 1


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    return f"{value:.3g}"


def nice_step(raw: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= *raw*."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    magnitude: float = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-12))


def nice_ticks(high: float, count: int = 4, *, whole: bool = False) -> list[float]:
    """0 and round steps up to at least *high* (whole-number steps for counts)."""
    if high <= 0:
        return [0.0, 1.0]
    step = nice_step(high / count)
    if whole and not step.is_integer():
        step = 1.0 if step < 1 else step * 2  # 2.5 * 10^k -> 5 * 10^k
    ticks = [0.0]
    while ticks[-1] < high - 1e-12:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _open(name: str, label: str, width: int = WIDTH) -> list[str]:
    return [
        f'<svg class="plot" data-plot="{escape(name)}" viewBox="0 0 {width} {HEIGHT}" '
        f'width="{width}" height="{HEIGHT}" role="img" aria-label="{escape(label)}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
    ]


def _empty(name: str, label: str, message: str) -> str:
    parts = _open(name, label)
    parts.append(
        f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
        f"{escape(message)}</text></svg>"
    )
    return "".join(parts)


def _y_axis(
    parts: list[str],
    ticks: list[float],
    top: float,
    label: str,
    pct: bool,
    plot_w: float = PLOT_W,
) -> None:
    for tick in ticks:
        y = TOP + PLOT_H - tick / top * PLOT_H
        text = f"{tick * 100:.0f}%" if pct else _fmt(tick)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 3.5:.1f}" text-anchor="end">{text}</text>'
        )
    parts.append(
        f'<text class="axis-label" transform="translate(10 {TOP + PLOT_H / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(label)}</text>'
    )


def _x_label(parts: list[str], label: str, plot_w: float = PLOT_W) -> None:
    parts.append(
        f'<text class="axis-label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{escape(label)}</text>'
    )


def bar_chart(
    name: str,
    label: str,
    bars: Sequence[tuple[str, float, str, str]],
    *,
    x_label: str,
    y_label: str,
    pct: bool = False,
    marker: tuple[float, str] | None = None,
    every: int = 1,
) -> str:
    """Bars of (tick label, height, css class, hover text); *marker* = (x in bar units, text)."""
    if not bars:
        return _empty(name, label, "no data")
    top = 1.0 if pct else max(max(b[1] for b in bars), 1e-9)
    whole = all(float(b[1]).is_integer() for b in bars)
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0] if pct else nice_ticks(top, whole=whole)
    top = ticks[-1]
    parts = _open(name, label)
    _y_axis(parts, ticks, top, y_label, pct)
    slot = PLOT_W / len(bars)
    gap = min(slot * 0.18, 6.0)
    every = max(every, tick_stride([bar[0] for bar in bars], slot))
    for i, (tick, value, css, hover) in enumerate(bars):
        height = max(value / top * PLOT_H, 0.0)
        x = LEFT + i * slot + gap / 2
        y = TOP + PLOT_H - height
        width = max(slot - gap, 0.8)
        if height < 1.5:  # keep zero bars hoverable and visible as a stub
            y, height = TOP + PLOT_H - 1.5, 1.5
        parts.append(
            f'<rect class="bar {css}" x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" '
            f'height="{height:.2f}"><title>{escape(hover)}</title></rect>'
        )
        if i % every == 0:
            parts.append(
                f'<text class="tick" x="{LEFT + (i + 0.5) * slot:.1f}" y="{TOP + PLOT_H + 14}" '
                f'text-anchor="middle">{escape(tick)}</text>'
            )
    if marker is not None:
        x = LEFT + marker[0] * slot
        parts.append(
            f'<line class="marker" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + PLOT_H}"/>'
            f'<text class="marker-label" x="{x + 4:.1f}" y="{TOP + 10}">{escape(marker[1])}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{TOP + PLOT_H}" '
        f'y2="{TOP + PLOT_H}"/>'
    )
    _x_label(parts, x_label)
    parts.append("</svg>")
    return "".join(parts)


def histogram(
    name: str,
    label: str,
    values: Sequence[float],
    *,
    x_label: str,
    unit: str = "",
    bins: int = 20,
    threshold: float | None = None,
) -> str:
    """Counts of *values* in equal bins; bins at or above *threshold* are drawn as passes."""
    if not values:
        return _empty(name, label, "no values to plot")
    low, high = min(values), max(values)
    distinct = sorted(set(values))
    if len(distinct) <= 11:
        bars = []
        for value in distinct:
            count = sum(1 for v in values if v == value)
            css = _side(value, threshold)
            bars.append((_fmt(value) + unit, float(count), css, f"{_fmt(value)}{unit}: {count}"))
        return bar_chart(name, label, bars, x_label=x_label, y_label="count")
    bins = max(1, min(bins, math.ceil(math.sqrt(len(values))) * 2))
    width = nice_step((high - low) / bins)
    start = math.floor(low / width) * width
    count = max(1, math.floor((high - start) / width) + 1)
    counts = [0] * count
    for value in values:
        counts[min(int((value - start) / width), count - 1)] += 1
    bars = []
    for i, n in enumerate(counts):
        left, right = start + i * width, start + (i + 1) * width
        hover = f"{_fmt(left)}{unit} – {_fmt(right)}{unit}: {n}"
        bars.append((_fmt(left), float(n), _side(left, threshold), hover))
    marker = None
    if threshold is not None and start <= threshold <= start + count * width:
        marker = ((threshold - start) / width, f"threshold {_fmt(threshold)}")
    every = max(1, math.ceil(count / 6))
    return bar_chart(
        name, label, bars, x_label=x_label, y_label="count", marker=marker, every=every
    )


def _side(value: float, threshold: float | None) -> str:
    if threshold is None:
        return "neutral"
    return "pass" if value >= threshold else "fail"


def line_chart(
    name: str,
    label: str,
    points: Sequence[tuple[int, float]],
    *,
    x_label: str,
    y_label: str,
    note: str | None = None,
) -> str:
    """A 0–100% line over integer x (pass@k against k)."""
    if not points:
        return _empty(name, label, f"no {PASS_RATE_BASIS}")
    parts = _open(name, label)
    _y_axis(parts, [0.0, 0.25, 0.5, 0.75, 1.0], 1.0, y_label, pct=True)
    first, last = points[0][0], points[-1][0]
    span = max(last - first, 1)

    def xy(k: int, value: float) -> tuple[float, float]:
        x = LEFT + (k - first) / span * PLOT_W if last > first else LEFT + PLOT_W / 2
        return x, TOP + PLOT_H - value * PLOT_H

    coords = [xy(k, v) for k, v in points]
    if len(coords) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline class="line" points="{path}"/>')
    step = max(1, math.ceil(len(points) / 12))
    for i, ((k, value), (x, y)) in enumerate(zip(points, coords, strict=True)):
        parts.append(
            f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5">'
            f"<title>pass@{k}: {value * 100:.1f}%</title></circle>"
        )
        if i % step == 0 or i == len(points) - 1:
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{TOP + PLOT_H + 14}" '
                f'text-anchor="middle">{k}</text>'
            )
    if note:
        parts.append(
            f'<text class="note" x="{LEFT + PLOT_W / 2}" y="{TOP + 16}" '
            f'text-anchor="middle">{escape(note)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{TOP + PLOT_H}" '
        f'y2="{TOP + PLOT_H}"/>'
    )
    _x_label(parts, x_label)
    parts.append("</svg>")
    return "".join(parts)


#: Series of a time chart beyond this many are drawn in the last colour.
SERIES_COLOURS = 6


def time_chart(
    name: str,
    label: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float, str, str | None]]]],
    *,
    y_label: str,
    width: int = 2 * WIDTH,
) -> str:
    """0–100% lines over time: per series, points of (epoch seconds, value, hover, link).

    Each point is a ``<circle>`` (inside an ``<a>`` when it has a link) with its own
    ``<title>``; series get the classes ``s0`` .. ``s5`` and a legend line at the top.
    """
    points = [point for _, line in series for point in line]
    if not points:
        return _empty(name, label, f"no run with {PASS_RATE_BASIS} yet")
    plot_w = width - LEFT - RIGHT
    parts = _open(name, label, width)
    _y_axis(parts, [0.0, 0.25, 0.5, 0.75, 1.0], 1.0, y_label, pct=True, plot_w=plot_w)
    first = min(t for t, _, _, _ in points)
    last = max(t for t, _, _, _ in points)
    span = last - first

    def xy(t: float, value: float) -> tuple[float, float]:
        x = LEFT + (t - first) / span * plot_w if span > 0 else LEFT + plot_w / 2
        return x, TOP + PLOT_H - value * PLOT_H

    # Runs minutes apart need seconds on the axis; runs months apart need only the day.
    shape = "%H:%M:%S" if span < 3600 else "%m-%d %H:%M" if span < 3 * 86400 else "%Y-%m-%d"
    for tick in range(5 if span > 0 else 1):
        t = first + span * tick / 4 if span > 0 else first
        x, _ = xy(t, 0)
        when = datetime.fromtimestamp(t, timezone.utc)
        anchor = "end" if tick == 4 else "middle"  # the last label would leave the plot
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{TOP + PLOT_H + 14}" '
            f'text-anchor="{anchor}">{when.strftime(shape)}</text>'
        )
    for index, (title, line) in enumerate(series):
        css = f"s{min(index, SERIES_COLOURS - 1)}"
        ordered = sorted(line, key=lambda p: p[0])
        coords = [xy(t, v) for t, v, _, _ in ordered]
        if len(coords) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            parts.append(f'<polyline class="line {css}" points="{path}"/>')
        for (_, _, hover, href), (x, y) in zip(ordered, coords, strict=True):
            dot = (
                f'<circle class="point {css}" cx="{x:.1f}" cy="{y:.1f}" r="4">'
                f"<title>{escape(hover)}</title></circle>"
            )
            parts.append(f'<a href="{escape(href)}">{dot}</a>' if href else dot)
        parts.append(
            f'<text class="legend-entry {css}" x="{LEFT + 8 + (index % 3) * plot_w / 3:.1f}" '
            f'y="{TOP + 10 + (index // 3) * 13}">&#9679; {escape(title)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{TOP + PLOT_H}" '
        f'y2="{TOP + PLOT_H}"/>'
    )
    _x_label(parts, "run started (UTC)", plot_w)
    parts.append("</svg>")
    return "".join(parts)
