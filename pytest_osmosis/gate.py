"""The CI gate: decide a session's exit status from the aggregate, not from single rows.

Without a gate option pytest's own semantics hold (any failed row fails the session).
With ``--osmosis-min-pass-rate`` the rows stay visible, but the exit status says whether
the evaluation as a whole is good enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pytest_osmosis.words import ERRORED, PASS_RATE_BASIS, pass_rate_text


@dataclass(frozen=True)
class GateOptions:
    min_pass_rate: float | None
    bound: str  # "point" or "wilson"
    max_error_rate: float | None

    @property
    def active(self) -> bool:
        return self.min_pass_rate is not None or self.max_error_rate is not None


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": list(self.reasons)}


def wilson_lower_bound(passed: int, total: int, z: float = 1.959963984540054) -> float:
    """Lower end of the 95% Wilson score interval: honest about small samples."""
    if total <= 0:
        return 0.0
    p = passed / total
    denominator = 1 + z * z / total
    centre = p + z * z / (2 * total)
    margin = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, (centre - margin) / denominator)


def decide(options: GateOptions, runs: list[tuple[str, dict[str, Any]]]) -> Verdict:
    """Apply the gate to every run; the session passes only if each run does."""
    verdict = Verdict(passed=True)
    for name, metrics in runs:
        summary = metrics.get("summary", {})
        scored = int(summary.get("completed_samples", 0))
        passed = int(summary.get("passed", 0))
        failed = int(summary.get("failed", 0))
        if options.min_pass_rate is not None:
            rate = passed / scored if scored else 0.0
            if options.bound == "wilson":
                bound = wilson_lower_bound(passed, scored)
                ok = bound >= options.min_pass_rate
                what = (
                    f"pass rate {pass_rate_text(passed, scored)}, 95% Wilson lower bound "
                    f"{bound:.1%} {'>=' if ok else '<'} {options.min_pass_rate:.1%}"
                )
            else:
                ok = rate >= options.min_pass_rate
                what = (
                    f"pass rate {pass_rate_text(passed, scored)} "
                    f"{'>=' if ok else '<'} {options.min_pass_rate:.1%}"
                )
            verdict.reasons.append(f"{name}: {what}")
            verdict.passed = verdict.passed and ok
        if options.max_error_rate is not None:
            errors = failed / scored if scored else 0.0
            ok = errors <= options.max_error_rate
            verdict.reasons.append(
                f"{name}: error rate {errors:.1%} "
                f"({failed} {ERRORED} / {scored} {PASS_RATE_BASIS}) "
                f"{'<=' if ok else '>'} {options.max_error_rate:.1%}"
            )
            verdict.passed = verdict.passed and ok
    return verdict
