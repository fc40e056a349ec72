"""Inline SVG plots: the report opens offline, with no chart library.

This module computes where each mark goes; ``templates/chart.html`` draws it (autoescaped,
as every page). Every plot is an ``<svg class="plot" data-plot=NAME>`` with a ``<title>`` per mark,
so hovering a bar tells its numbers and the page needs no JavaScript to show them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from pytest_osmosis.core.words import PASS_RATE_BASIS
from pytest_osmosis.report.templating import render

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


def _frame(name: str, label: str, width: int = WIDTH) -> dict[str, Any]:
    """The plot area of a *width* wide chart, in the units the template draws in."""
    plot_w = width - LEFT - RIGHT
    return {
        "name": name,
        "label": label,
        "width": width,
        "height": HEIGHT,
        "left": LEFT,
        "right": LEFT + plot_w,
        "top": TOP,
        "bottom": TOP + PLOT_H,
        "middle_x": LEFT + plot_w / 2,
        "middle_y": TOP + PLOT_H / 2,
        "tick_y": TOP + PLOT_H + 14,
    }


def _draw(frame: dict[str, Any], **chart: Any) -> str:
    """``templates/chart.html``: the markup of every chart, its texts autoescaped."""
    return render("chart.html", frame=frame, chart=chart)


def _empty(name: str, label: str, message: str) -> str:
    return _draw(_frame(name, label), kind="empty", message=message)


def _grid(ticks: list[float], top: float, pct: bool) -> list[tuple[float, str]]:
    """The y axis: (height in the plot, label) per tick."""
    return [
        (TOP + PLOT_H - tick / top * PLOT_H, f"{tick * 100:.0f}%" if pct else _fmt(tick))
        for tick in ticks
    ]


PCT_TICKS = [0.0, 0.25, 0.5, 0.75, 1.0]


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
    ticks = PCT_TICKS if pct else nice_ticks(top, whole=whole)
    top = ticks[-1]
    slot = PLOT_W / len(bars)
    gap = min(slot * 0.18, 6.0)
    every = max(every, tick_stride([bar[0] for bar in bars], slot))
    marks = []
    for i, (tick, value, css, hover) in enumerate(bars):
        height = max(value / top * PLOT_H, 0.0)
        y = TOP + PLOT_H - height
        if height < 1.5:  # keep zero bars hoverable and visible as a stub
            y, height = TOP + PLOT_H - 1.5, 1.5
        marks.append(
            {
                "css": css,
                "x": LEFT + i * slot + gap / 2,
                "y": y,
                "width": max(slot - gap, 0.8),
                "height": height,
                "hover": hover,
                "tick": tick if i % every == 0 else None,
                "tick_x": LEFT + (i + 0.5) * slot,
            }
        )
    line = None if marker is None else {"x": LEFT + marker[0] * slot, "text": marker[1]}
    return _draw(
        _frame(name, label),
        kind="bar",
        grid=_grid(ticks, top, pct),
        y_label=y_label,
        x_label=x_label,
        bars=marks,
        marker=line,
    )


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
    first, last = points[0][0], points[-1][0]
    span = max(last - first, 1)

    def xy(k: int, value: float) -> tuple[float, float]:
        x = LEFT + (k - first) / span * PLOT_W if last > first else LEFT + PLOT_W / 2
        return x, TOP + PLOT_H - value * PLOT_H

    coords = [xy(k, v) for k, v in points]
    step = max(1, math.ceil(len(points) / 12))
    marks = [
        {"k": k, "value": value, "x": x, "y": y, "tick": i % step == 0 or i == len(points) - 1}
        for i, ((k, value), (x, y)) in enumerate(zip(points, coords, strict=True))
    ]
    return _draw(
        _frame(name, label),
        kind="line",
        grid=_grid(PCT_TICKS, 1.0, True),
        y_label=y_label,
        x_label=x_label,
        coords=coords,
        marks=marks,
        note=note,
    )


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
    first = min(t for t, _, _, _ in points)
    last = max(t for t, _, _, _ in points)
    span = last - first

    def xy(t: float, value: float) -> tuple[float, float]:
        x = LEFT + (t - first) / span * plot_w if span > 0 else LEFT + plot_w / 2
        return x, TOP + PLOT_H - value * PLOT_H

    # Runs minutes apart need seconds on the axis; runs months apart need only the day.
    shape = "%H:%M:%S" if span < 3600 else "%m-%d %H:%M" if span < 3 * 86400 else "%Y-%m-%d"
    ticks = []
    for tick in range(5 if span > 0 else 1):
        t = first + span * tick / 4 if span > 0 else first
        when = datetime.fromtimestamp(t, timezone.utc)
        anchor = "end" if tick == 4 else "middle"  # the last label would leave the plot
        ticks.append({"x": xy(t, 0)[0], "anchor": anchor, "text": when.strftime(shape)})
    lines = []
    for index, (title, line) in enumerate(series):
        ordered = sorted(line, key=lambda p: p[0])
        coords = [xy(t, v) for t, v, _, _ in ordered]
        dots = [
            {"x": x, "y": y, "hover": hover, "href": href}
            for (_, _, hover, href), (x, y) in zip(ordered, coords, strict=True)
        ]
        lines.append(
            {
                "css": f"s{min(index, SERIES_COLOURS - 1)}",
                "title": title,
                "coords": coords,
                "dots": dots,
                "legend_x": LEFT + 8 + (index % 3) * plot_w / 3,
                "legend_y": TOP + 10 + (index // 3) * 13,
            }
        )
    return _draw(
        _frame(name, label, width),
        kind="time",
        grid=_grid(PCT_TICKS, 1.0, True),
        y_label=y_label,
        x_label="run started (UTC)",
        ticks=ticks,
        series=lines,
    )
