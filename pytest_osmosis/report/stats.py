"""Small statistics the report needs: Wilson and Newcombe intervals, the pass@k curve.

Kept dependency-free (no scipy): a report must render wherever the plugin runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pytest_osmosis.outcome import PASSED, SKIPPED
from pytest_osmosis.results.metrics import pass_at_k

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion; ``(0, 1)`` when *total* is 0."""
    if total <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= total:
        raise ValueError(f"successes {successes} outside 0..{total}")
    p = successes / total
    z2 = z * z
    denominator = 1 + z2 / total
    center = (p + z2 / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / denominator
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == total else min(1.0, center + half)
    return low, high


def newcombe_difference(
    successes_a: int, total_a: int, successes_b: int, total_b: int, z: float = Z95
) -> tuple[float, float, float]:
    """``p_a - p_b`` with Newcombe's hybrid score interval (method 10, 1998).

    Chosen over the Wald interval because pass rates sit near 0 or 1 and samples are
    small, where Wald is too narrow or leaves [-1, 1]. Returns (difference, low, high).
    """
    p_a = successes_a / total_a if total_a else 0.0
    p_b = successes_b / total_b if total_b else 0.0
    low_a, high_a = wilson_interval(successes_a, total_a, z)
    low_b, high_b = wilson_interval(successes_b, total_b, z)
    difference = p_a - p_b
    low = difference - math.sqrt((p_a - low_a) ** 2 + (high_b - p_b) ** 2)
    high = difference + math.sqrt((high_a - p_a) ** 2 + (p_b - low_b) ** 2)
    return difference, max(-1.0, low), min(1.0, high)


def per_row_passes(
    rows: Iterable[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], Any] = lambda row: row.get("row_index"),
) -> dict[int, tuple[int, int]]:
    """``{row: (passes, attempts)}`` over non-skipped attempts (skips are not attempts).

    *key* names a row (default its selection position; the report passes the dataset row).
    """
    counts: dict[int, tuple[int, int]] = {}
    for row in rows:
        index = key(row)
        if not isinstance(index, int):
            continue
        passes, attempts = counts.get(index, (0, 0))
        if row.get("outcome") == SKIPPED:
            counts[index] = (passes, attempts)
            continue
        counts[index] = (passes + int(row.get("outcome") == PASSED), attempts + 1)
    return counts


def pass_at_k_curve(rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """pass@k for every k from 1 to the largest attempt count (metrics.json has only 2^i)."""
    counts = [c for c in per_row_passes(rows).values() if c[1] > 0]
    if not counts:
        return []
    curve: list[tuple[int, float]] = []
    for k in range(1, max(attempts for _, attempts in counts) + 1):
        values = [
            pass_at_k(attempts=attempts, passes=passes, k=k)
            for passes, attempts in counts
            if attempts >= k
        ]
        if values:
            curve.append((k, math.fsum(values) / len(values)))
    return curve


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted-or-not *values* (non-empty)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
