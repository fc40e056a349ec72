"""The CI gate: decide a session's exit status from the aggregate, not from single rows.

Without a gate option pytest's own semantics hold (any failed row fails the session).
With ``--osmosis-min-pass-rate`` the rows stay visible, but the exit status says whether
the evaluation as a whole is good enough.

A rule is one entry of :data:`RULES`: its option (which the plugin declares from here),
how its value is read, and its check. Adding a rule is adding an entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_osmosis.outcome import FAILED, PASSED, summary_counts
from pytest_osmosis.words import ERRORED, PASS_RATE_BASIS, pass_rate_text


class GateOptionError(ValueError):
    """A gate option's value is refused; the message names the option."""


@dataclass(frozen=True)
class Counts:
    """One run's numbers a rule judges (from its ``metrics.json`` summary)."""

    passed: int
    errored: int
    scored: int  # attempts not skipped: every rate's denominator


#: A check: (its option's value, every gate option's value, one run's counts) ->
#: (whether the run passes it, the line that says why).
Check = Callable[[Any, Mapping[str, Any], Counts], tuple[bool, str]]


@dataclass(frozen=True)
class GateOption:
    """An option of the gate: a rule when it has a check, else a setting rules read."""

    dest: str
    flag: str
    help: str
    metavar: str
    parse: Callable[[str, str], Any]  # (flag, text) -> value; raises GateOptionError
    check: Check | None = None
    default: Any = None


@dataclass(frozen=True)
class GateOptions:
    """Every gate option's value (None where not given and without a default)."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(rule.check and self.values.get(rule.dest) is not None for rule in RULES)


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": list(self.reasons)}


def _rate(flag: str, text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise GateOptionError(f"{flag}: must be a number from 0 to 1, got {text!r}")
    return number


def _bound(flag: str, text: str) -> str:
    if text not in ("point", "wilson"):
        raise GateOptionError(f"{flag}: must be point or wilson, got {text!r}")
    return text


def _at_least(a: float, b: float) -> str:
    return ">=" if a >= b else "<"


def _min_pass_rate(minimum: float, options: Mapping[str, Any], n: Counts) -> tuple[bool, str]:
    rate = n.passed / n.scored if n.scored else 0.0
    what = f"pass rate {pass_rate_text(n.passed, n.scored)}"
    if options.get("gate_bound") == "wilson":
        from pytest_osmosis.report.stats import wilson_interval

        bound = wilson_interval(n.passed, n.scored)[0]
        what += f", 95% Wilson lower bound {bound:.1%}"
        return bound >= minimum, f"{what} {_at_least(bound, minimum)} {minimum:.1%}"
    return rate >= minimum, f"{what} {_at_least(rate, minimum)} {minimum:.1%}"


def _max_error_rate(maximum: float, options: Mapping[str, Any], n: Counts) -> tuple[bool, str]:
    errors = n.errored / n.scored if n.scored else 0.0
    ok = errors <= maximum
    return ok, (
        f"error rate {errors:.1%} ({n.errored} {ERRORED} / {n.scored} {PASS_RATE_BASIS}) "
        f"{'<=' if ok else '>'} {maximum:.1%}"
    )


#: The gate's options, in the order ``--help`` lists them.
RULES: tuple[GateOption, ...] = (
    GateOption(
        "min_pass_rate",
        "--osmosis-min-pass-rate",
        "CI gate: the exit status is 0 when every run's pass rate reaches RATE (0..1), else 1",
        "RATE",
        _rate,
        _min_pass_rate,
    ),
    GateOption(
        "gate_bound",
        "--osmosis-gate-bound",
        "point (default) or wilson: gate on the 95%% Wilson lower bound of the pass rate instead",
        "BOUND",
        _bound,
        default="point",
    ),
    GateOption(
        "max_error_rate",
        "--osmosis-max-error-rate",
        "CI gate: workflow/grader errors "
        "(not low rewards) may be at most this share of scored rows",
        "RATE",
        _rate,
        _max_error_rate,
    ),
)


def gate_options(value_of: Callable[[str], Any]) -> GateOptions:
    """The gate's options from ``value_of(dest)`` (the command line > ini merge)."""
    values: dict[str, Any] = {}
    for rule in RULES:
        raw = value_of(rule.dest)
        if raw is None or (raw == "" and rule.default is not None):
            values[rule.dest] = rule.default  # a setting written blank keeps its default
        else:
            values[rule.dest] = rule.parse(rule.flag, str(raw))
    return GateOptions(values)


def decide(options: GateOptions, runs: list[tuple[str, dict[str, Any]]]) -> Verdict:
    """Apply the gate to every run; the session passes only if each run does."""
    verdict = Verdict(passed=True)
    for name, metrics in runs:
        summary = metrics.get("summary", {})
        counts = summary_counts(summary)
        numbers = Counts(
            passed=counts[PASSED],
            errored=counts[FAILED],
            scored=int(summary.get("completed_samples", 0)),
        )
        for rule in RULES:
            value = options.values.get(rule.dest)
            if rule.check is None or value is None:
                continue
            ok, what = rule.check(value, options.values, numbers)
            verdict.reasons.append(f"{name}: {what}")
            verdict.passed = verdict.passed and ok
    return verdict
