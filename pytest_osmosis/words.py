"""The words a user reads about attempts, in one place.

Every display (the results table, live progress, the gate's lines, ``pytest-osmosis
info``, the Markdown and HTML reports) names an attempt's outcome with these four words
and counts them the same way, so no two screens can call the same attempt differently.
pytest shows ``F`` for both ``below threshold`` and ``errored``; ``errored`` is what
``metrics.json`` counts as ``failed`` (a workflow or grader error, a timeout, a missing
reward), never a low reward.

The outcome *keys* (``OUTCOMES``) stay what the JSON outputs and ``metrics.json`` have
always used; only what a person reads is worded here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Outcome keys, in display order: the field names of ``info --json`` and the report data.
OUTCOMES = ("passed", "below_threshold", "failed", "skipped")

PASSED = "passed"
BELOW_THRESHOLD = "below threshold"
ERRORED = "errored"
SKIPPED = "skipped"

#: Outcome key -> the word a user reads.
OUTCOME_WORDS: dict[str, str] = {
    "passed": PASSED,
    "below_threshold": BELOW_THRESHOLD,
    "failed": ERRORED,
    "skipped": SKIPPED,
}

#: What one pytest item is: one (row, attempt).
ATTEMPTS = "attempts"

#: The pass rate's denominator (``metrics.json``'s ``completed_samples``).
PASS_RATE_BASIS = "attempts not skipped"


def summary_counts(summary: Mapping[str, Any]) -> dict[str, int]:
    """Outcome key -> count, from a ``metrics.json`` ``summary``.

    ``failed`` rows carry no reward, so the not-skipped attempts that neither passed nor
    errored are the ones below the threshold; the four counts add up to the total.
    """
    passed = int(summary.get("passed", 0))
    errored = int(summary.get("failed", 0))
    counted = int(summary.get("completed_samples", 0))
    return {
        "passed": passed,
        "below_threshold": max(0, counted - passed - errored),
        "failed": errored,
        "skipped": int(summary.get("skipped", 0)),
    }


def outcomes_text(counts: Mapping[str, int], total: int | None = None) -> str:
    """``8 passed, 0 below threshold, 0 errored, 0 skipped`` (``of 8`` with a total)."""
    text = ", ".join(f"{int(counts.get(key, 0))} {OUTCOME_WORDS[key]}" for key in OUTCOMES)
    return text if total is None else f"{text} of {total}"


def pass_rate_basis(passed: int, counted: int) -> str:
    """``5 passed / 8 attempts not skipped``: what the pass rate divides."""
    return f"{passed} {PASSED} / {counted} {PASS_RATE_BASIS}"


def pass_rate_text(passed: int, counted: int) -> str:
    """``62.5% (5 passed / 8 attempts not skipped)``."""
    rate = passed / counted if counted else 0.0
    return f"{rate:.1%} ({pass_rate_basis(passed, counted)})"
