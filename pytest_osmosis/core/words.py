"""The words a user reads about attempts, in one place.

Every display (the results table, live progress, the gate's lines, ``pytest-osmosis
info``, the Markdown and HTML reports) names an attempt's outcome with these four words
and counts them the same way, so no two screens can call the same attempt differently.
pytest shows ``F`` for both ``below threshold`` and ``errored``; ``errored`` is what
``metrics.json`` counts as ``failed`` (a workflow or grader error, a timeout, a missing
reward), never a low reward.

The outcome *keys* (``outcome.OUTCOMES``) stay what the JSON outputs and ``metrics.json`` have
always used; only what a person reads is worded here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_osmosis.core import outcome
from pytest_osmosis.core.outcome import OUTCOMES as OUTCOMES  # the keys are outcome's

PASSED = "passed"
BELOW_THRESHOLD = "below threshold"
ERRORED = "errored"
SKIPPED = "skipped"

#: Outcome key -> the word a user reads.
OUTCOME_WORDS: dict[str, str] = {
    outcome.PASSED: PASSED,
    outcome.BELOW_THRESHOLD: BELOW_THRESHOLD,
    outcome.FAILED: ERRORED,
    outcome.SKIPPED: SKIPPED,
}

#: What one pytest item is: one (row, attempt).
ATTEMPTS = "attempts"

#: The pass rate's denominator (``metrics.json``'s ``completed_samples``).
PASS_RATE_BASIS = "attempts not skipped"


def outcomes_text(counts: Mapping[str, int], total: int | None = None) -> str:
    """``8 passed, 0 below threshold, 0 errored, 0 skipped`` (``of 8`` with a total)."""
    text = ", ".join(f"{int(counts.get(key, 0))} {OUTCOME_WORDS[key]}" for key in OUTCOMES)
    return text if total is None else f"{text} of {total}"


def pass_rate_basis(passed: int, counted: int) -> str:
    """``5 passed / 8 attempts not skipped``: what the pass rate divides (``1 attempt``)."""
    basis = PASS_RATE_BASIS.replace("attempts", "attempt", 1) if counted == 1 else PASS_RATE_BASIS
    return f"{passed} {PASSED} / {counted} {basis}"


#: A rate of nothing (0 of 0 attempts): not 0.0%, which reads as "every attempt failed".
NO_RATE = "n/a"


def rate_text(passed: int, counted: int) -> str:
    """``62.5%``; ``n/a`` when nothing was counted."""
    return f"{passed / counted:.1%}" if counted else NO_RATE


def pass_rate_text(passed: int, counted: int) -> str:
    """``62.5% (5 passed / 8 attempts not skipped)``; ``n/a (0 passed / 0 ...)``."""
    return f"{rate_text(passed, counted)} ({pass_rate_basis(passed, counted)})"


def percent(value: Any) -> str:
    """A rate as ``62.5%``; ``–`` for anything that is not a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value) * 100:.1f}%"
    return "–"


def points(change: float) -> str:
    """A change of a rate in percentage points: ``-12.5 pp``."""
    return f"{change * 100:+.1f} pp"


def dollars(cost: Any) -> str:
    """A cost as ``$0.000123`` (six decimals: one row of a small model costs well under a
    cent); ``unknown`` when a model has no price in LiteLLM's cost map."""
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        return f"${float(cost):.6f}"
    return "unknown"


def short_dollars(cost: float) -> str:
    """A running cost in a few characters: ``$0.04``; ``<$0.01`` rather than a ``$0.00`` that
    reads as free (a small model's rows cost millionths of a dollar)."""
    return f"${cost:.2f}" if cost >= 0.005 or cost == 0 else "<$0.01"


def cost_words(total: float, priced: int, attempts: int, *, short: bool = False) -> str:
    """``$0.000123 for 3 of 5 priced attempts``, or ``unknown`` when no attempt had a priced
    model call: the cost the results table, the status line and the report show (an attempt
    without one has an unknown cost, never $0). ``short`` (the status line, once one attempt
    was priced): :func:`short_dollars`, with ``(3/5 priced)`` while some attempts are not."""
    if short:
        partial = f" ({priced}/{attempts} priced)" if priced < attempts else ""
        return short_dollars(total) + partial
    if priced == 0:
        return "unknown"
    return f"{dollars(total)} for {priced} of {attempts} priced attempts"


def priced_costs(costs: Iterable[Any]) -> tuple[float, int, int]:
    """(sum of the priced, how many were priced, how many attempts) of attempts' costs
    (anything but a number: not priced)."""
    import math

    every = list(costs)
    known = [float(c) for c in every if isinstance(c, (int, float)) and not isinstance(c, bool)]
    return math.fsum(known), len(known), len(every)


def costs_text(costs: Iterable[Any]) -> str:
    """:func:`cost_words` of attempts' costs (anything but a number: not priced)."""
    return cost_words(*priced_costs(costs))


def one_line(text: str, limit: int | None = None) -> str:
    """Text as one line (white space folded), cut to *limit* characters with ``...``."""
    flat = " ".join(text.split())
    if limit is None or len(flat) <= limit:
        return flat
    return flat[: limit - 3] + "..."


#: What no surface writes raw: C0 controls but tab and newline, DEL, C1 controls, the
#: Unicode line and paragraph separators, and lone surrogates (a ``surrogateescape`` decode).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def safe_text(text: str) -> str:
    """Any string as every surface can write it: what a terminal would obey (ESC, BEL, a
    carriage return) or an encoder refuse (a lone surrogate) shown as its ``\\u001b`` or
    ``\\udcff`` escape; tabs and newlines kept. Every surface calls this. The escapes are
    JSON's, so JSON text stays valid JSON of the same strings."""
    if text.isascii() and text.isprintable():
        return text
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"
