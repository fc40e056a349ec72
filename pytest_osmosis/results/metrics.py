"""The ``metrics.json`` summary, computed exactly as the Osmosis platform does.

The platform recomputes these numbers from the uploaded index, so a local value
that disagreed would show the user two truths. Definitions (contract §6):
skipped rows leave every denominator but still count tokens; failed rows stay in
the pass-rate denominator as non-passes; pass@k uses the unbiased estimator for
k = 1, 2, 4, ... <= n.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from pytest_osmosis.core.outcome import PASSED, SKIPPED, classify


def _sqrt_of_fraction(value: Fraction) -> float:
    """Correctly rounded square root of a non-negative exact fraction.

    Python 3.12 made ``statistics.pstdev`` correctly rounded; 3.10 and 3.11 can be
    one ulp off. The SDK runs on 3.12+, so we compute the same value everywhere:
    integer square root with round-to-odd, then one rounding to a float.
    """
    num, den = value.numerator, value.denominator
    if num == 0:
        return 0.0
    # Scale by 4**e so the integer root carries >= 60 significant bits.
    e = max(0, (120 - (num.bit_length() - den.bit_length())) // 2 + 1)
    scaled_num = num << (2 * e)
    root = math.isqrt(scaled_num // den)
    if root * root * den != scaled_num:
        root |= 1  # inexact: round to odd so the float conversion rounds correctly
    return math.ldexp(float(root), -e)


def population_std(values: Sequence[float]) -> float:
    """Population standard deviation, correctly rounded (Python 3.12's ``pstdev``)."""
    exact = [Fraction(v) for v in values]
    n = len(exact)
    mean = sum(exact, Fraction(0)) / n
    variance = sum(((x - mean) ** 2 for x in exact), Fraction(0)) / n
    return _sqrt_of_fraction(variance)


def pass_at_k(*, attempts: int, passes: int, k: int) -> float:
    """Unbiased pass@k for one row: ``1 - C(fails, k) / C(attempts, k)``."""
    if k > attempts:
        raise ValueError(f"k={k} exceeds the attempt count {attempts}")
    fails = attempts - passes
    if fails < k:
        return 1.0
    all_fail = 1.0
    for i in range(k):
        all_fail *= (fails - i) / (attempts - i)
    return 1.0 - all_fail


def pass_hat_k(*, attempts: int, passes: int, k: int) -> float:
    """Unbiased pass^k for one row: the chance that k attempts drawn without replacement
    all pass, ``C(passes, k) / C(attempts, k)`` (pass@k asks for at least one)."""
    if k > attempts:
        raise ValueError(f"k={k} exceeds the attempt count {attempts}")
    if passes < k:
        return 0.0
    all_pass = 1.0
    for i in range(k):
        all_pass *= (passes - i) / (attempts - i)
    return all_pass


def ks_up_to(limit: int) -> list[int]:
    ks: list[int] = []
    k = 1
    while k <= limit:
        ks.append(k)
        k *= 2
    return ks


def aggregate_metrics(
    index_rows: Iterable[Mapping[str, Any]], pass_threshold: float
) -> dict[str, Any]:
    """The ``summary`` object of ``metrics.json`` for *index_rows* (``index.jsonl`` rows).

    Key order and value types match the SDK's output byte for byte once
    serialized (``pass_rate`` is the integer ``0`` when nothing was scored). A pass is
    :func:`outcome.classify`'s; the SDK's ``reward >= pass_threshold`` is the same rule
    because only a success carries a reward.
    """
    attempts: dict[int, int] = {}
    passes: dict[int, int] = {}
    rewards: list[float] = []
    total = passed = graded = skipped = failed = tokens_used = 0
    max_run = -1
    for row in index_rows:  # one pass, none kept: the run directory makes them one by one
        total += 1
        run_index = row.get("run_index")
        if isinstance(run_index, int):
            max_run = max(max_run, run_index)
        tokens = row.get("tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens_used += tokens
        verdict = classify(row, pass_threshold)
        if verdict == SKIPPED:
            skipped += 1
            continue
        if row.get("status") == "failed":
            failed += 1
        reward = row.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            graded += 1
            rewards.append(float(reward))
        is_pass = verdict == PASSED
        passed += int(is_pass)
        row_index = row.get("row_index")
        if isinstance(row_index, int):
            attempts[row_index] = attempts.get(row_index, 0) + 1
            passes[row_index] = passes.get(row_index, 0) + int(is_pass)

    scored = total - skipped
    summary: dict[str, Any] = {
        "total_samples": total,
        "completed_samples": scored,
        "graded": graded,
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "pass_rate": passed / scored if scored else 0,
        "pass_threshold": pass_threshold,
        "tokens_used": tokens_used,
    }
    if rewards:
        summary["reward_stats"] = {
            "mean": statistics.fmean(rewards),
            "median": statistics.median(rewards),
            "std": population_std(rewards) if len(rewards) > 1 else 0.0,
            "min": min(rewards),
            "max": max(rewards),
        }
    n_runs = max_run + 1
    if n_runs >= 2:
        summary["n_runs"] = n_runs
        points: list[dict[str, Any]] = []
        for k in ks_up_to(n_runs):
            values = [
                pass_at_k(attempts=attempts[r], passes=passes[r], k=k)
                for r in sorted(attempts)
                if attempts[r] >= k
            ]
            if values:
                points.append({"k": k, "value": statistics.fmean(values)})
        if len(points) >= 2:
            summary["pass_at_k"] = points
    return summary
