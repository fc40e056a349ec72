"""Small statistics the report needs: Wilson and Newcombe intervals, the pass@k curve.

Kept dependency-free (no scipy): a report must render wherever the plugin runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from pytest_osmosis.results.metrics import pass_at_k
from pytest_osmosis.results.row_metrics import per_row_passes

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


#: The gate's significance level (two-sided) and the power its "can detect" line promises.
ALPHA = 0.05
POWER = 0.8


def fewest_flips(alpha: float = ALPHA) -> int:
    """The fewest rows, all worse and none better, the paired test calls significant (6 at 5%)."""
    flips = 1
    while permutation_test([Fraction(-1)] * flips) >= alpha:
        flips += 1
    return flips


def binomial_at_least(k: int, trials: int, p: float) -> float:
    """P(X >= k) for X ~ binomial(trials, p)."""
    if k <= 0:
        return 1.0
    if k > trials or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    below = sum(
        math.exp(math.lgamma(trials + 1) - math.lgamma(i + 1) - math.lgamma(trials - i + 1))
        * p**i
        * (1 - p) ** (trials - i)
        for i in range(k)
    )
    return max(0.0, 1.0 - below)


def paired_power(rows: int, drop: float, margin: float = 0.0, alpha: float = ALPHA) -> float:
    """The paired gate's power at best: each row fails with probability *drop*, none improves.

    The gate then fails when at least :func:`fewest_flips` rows got worse and more than
    ``margin * rows`` did (the drop exceeds ``--osmosis-max-regression``). Rows that change
    both ways (a flaky rollout) only lower it, so this is an upper bound on the power.
    With one attempt a row the test is exact McNemar; with more, a row that only gets worse
    loses all its attempts here, so the bound holds for any n.
    """
    need = max(fewest_flips(alpha), math.floor(margin * rows + 1e-9) + 1)
    return binomial_at_least(need, rows, drop)


def unpaired_power(
    attempts: int, rate: float, drop: float, margin: float = 0.0, z: float = Z95
) -> float:
    """The unpaired (Newcombe) gate's power, normal approximation: *attempts* per side at
    pass rate *rate* (the baseline's), a true drop of *drop*, failing when the interval's
    upper end is below ``-margin``."""
    spread = rate * (1 - rate) + (rate - drop) * (1 - rate + drop)
    if attempts <= 0 or spread <= 0:
        return 1.0 if drop > margin else 0.0
    shift = (drop - margin) / math.sqrt(spread / attempts) - z
    return 0.5 * math.erfc(-shift / math.sqrt(2))


def smallest_drop(power: Callable[[float], float], target: float = POWER) -> float | None:
    """The smallest true drop in (0, 1] detected with *target* power (None: not even 1)."""
    if power(1.0) < target:
        return None
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if power(middle) >= target:
            high = middle
        else:
            low = middle
    return high


def size_needed(power: Callable[[int], float], target: float = POWER) -> int:
    """The smallest size (rows or attempts) whose *power* reaches *target* (power grows with it)."""
    high = 1
    while power(high) < target:
        high *= 2
        if high > 1 << 40:
            return high
    low = high // 2
    while low + 1 < high:
        middle = (low + high) // 2
        if power(middle) >= target:
            high = middle
        else:
            low = middle
    return high


#: Above this many bits the permutation test's exact distribution gives way to the normal one.
EXACT_BITS = 1 << 26


def permutation_test(changes: Sequence[Fraction]) -> float:
    """Two-sided exact paired permutation (sign-flip) test of the rows' changes.

    Under no change each row's change is as likely to have either sign, so the p-value is
    the share of the 2^m sign flips whose total is at least as far from 0 as the observed
    one. Rows that did not change drop out. With one attempt a row every change is +-1 and
    this is the exact McNemar test (the two-sided binomial test on the rows that flipped).
    Computed exactly from the subset sums of the integer-scaled changes (Python integers as
    polynomials); past ``EXACT_BITS`` (rows of many attempts with uneven skips) from the
    normal approximation with continuity correction.
    """
    moved = [abs(change) for change in changes if change != 0]
    if not moved:
        return 1.0
    scale = math.lcm(*(change.denominator for change in moved))
    scores = [int(change * scale) for change in moved]
    total = sum(scores)
    observed = abs(int(sum(changes) * scale))
    width = (len(scores) + 8) // 8 * 8  # bits a count needs (at most 2^m), in whole bytes
    if (total + 1) * width > EXACT_BITS:
        spread = math.sqrt(sum(score * score for score in scores))
        z = (observed - (1 if observed else 0)) / spread
        return min(1.0, math.erfc(z / math.sqrt(2)))
    counts = 1  # coefficient k: the sign flips whose positive scores sum to k
    for score in scores:
        counts += counts << (score * width)
    raw = counts.to_bytes((total + 1) * width // 8, "little")
    step = width // 8
    # The total of a flip is 2k - total; it is as extreme as observed when |2k - total| >= it.
    extreme = sum(
        int.from_bytes(raw[k * step : (k + 1) * step], "little")
        for k in range(total + 1)
        if abs(2 * k - total) >= observed
    )
    return min(1.0, extreme / (1 << len(scores)))
