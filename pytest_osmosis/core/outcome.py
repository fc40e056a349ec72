"""A row's outcome, in one place: the result an attempt produces and what it counts as.

Every consumer (pytest's verdict in ``collect``, live progress, the results table,
``metrics.json``, the gate, ``info`` and the report) asks :func:`classify`, so the
terminal, the files and the exit status cannot disagree about one attempt. Results stay
dicts of builtins on the wire (they travel to the xdist controller on the test report
and into the journal); :class:`RowResult` is how one is built, so every builder writes
the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

#: The four outcome keys, in display order (the field names of ``info --json``, the
#: report data and ``metrics.json``'s counters). ``failed`` is an error, never a low reward.
PASSED = "passed"
BELOW_THRESHOLD = "below_threshold"
FAILED = "failed"
SKIPPED = "skipped"
OUTCOMES = (PASSED, BELOW_THRESHOLD, FAILED, SKIPPED)


def classify(row: Mapping[str, Any], threshold: float) -> str:
    """passed / below_threshold / failed / skipped for one result or journal record.

    Only a ``success`` carries a reward (a failure's is nulled, as the SDK's server does);
    it passes when the reward reaches the threshold.
    """
    status = row.get("status")
    if status == SKIPPED:
        return SKIPPED
    if status != "success":
        return FAILED
    reward = row.get("reward")
    if isinstance(reward, (int, float)) and not isinstance(reward, bool) and reward >= threshold:
        return PASSED
    return BELOW_THRESHOLD


#: A dataset row's class over its attempts not skipped: every one passed, they disagree, or
#: none passed. ``flaky`` needs n >= 2; a row with every attempt skipped has no class.
ROW_PASSED = "passed"
ROW_FLAKY = "flaky"
ROW_FAILED = "failed"
ROW_CLASSES = (ROW_PASSED, ROW_FLAKY, ROW_FAILED)


def row_class(passes: int, attempts: int) -> str | None:
    """passed / flaky / failed for a row with ``passes`` of ``attempts`` (not skipped)."""
    if attempts <= 0:
        return None
    if passes >= attempts:
        return ROW_PASSED
    return ROW_FLAKY if passes > 0 else ROW_FAILED


def row_passes(passes: int, attempts: int, need: int | None) -> bool:
    """A row's verdict: at least ``need`` passing attempts (``--osmosis-row-pass k/n``),
    every attempt when no k is given."""
    return attempts > 0 and passes >= (attempts if need is None else need)


#: Error types of what a row ran on rather than of its code: a budget or a client's own
#: timeout, the backstop, the process that died under it.
INFRASTRUCTURE_ERRORS = frozenset(
    {"timeout", "workflow_timeout", "grader_timeout", "backstop_timeout", "worker_crashed"}
)


def is_infrastructure(row: Mapping[str, Any]) -> bool:
    """An errored attempt whose cause is infrastructure: worth running again as it is.

    The error types above, or an error after the provider answered a model call with a
    5xx (``provider_errors``, counted by the bridge). Never a low reward, never a bug in
    the rollout (``agent_error``, ``validation_error``): running those again costs the
    same and says the same. What pytest-rerunfailures may re-run (rerun.py).
    """
    if classify(row, 0.0) != FAILED:
        return False
    return row.get("error_type") in INFRASTRUCTURE_ERRORS or bool(row.get("provider_errors"))


def is_retried(row: Mapping[str, Any], below_threshold: float | None = None) -> bool:
    """What ``--osmosis-retry-failed`` runs again: errored and skipped attempts (what the
    SDK's ``--retry-failed`` runs again); given ``--osmosis-retry-below-threshold``'s
    threshold, attempts whose reward is below it too (what pytest calls failed)."""
    if row.get("status") in (FAILED, SKIPPED):
        return True
    return below_threshold is not None and classify(row, below_threshold) == BELOW_THRESHOLD


@dataclass
class RowResult:
    """One attempt's result as every builder makes it (the runner, a crash, a backstop)."""

    row_index: int
    run_index: int
    source_row_index: int
    rollout_id: str
    status: str  # success / failed / skipped: the journal's and the SDK's
    pass_threshold: float
    reward: float | None = None
    tokens: int | None = None
    duration_ms: float = 0.0
    error_type: str | None = None
    message: str = ""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The wire form, with ``passed`` decided by :func:`classify`."""
        # Not dataclasses.asdict: it deep-copies, and the exception kept for --pdb must
        # stay the one raised in the rollout's frames.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        values.update(self.extra)
        # The rollout's own words (an exception's message): escaped once, here, so the journal,
        # the xdist channel and every surface can carry them (a lone surrogate cannot).
        from pytest_osmosis.core.words import safe_text

        for key in ("error_type", "message", "detail", "trajectory_problem"):
            if isinstance(values.get(key), str):
                values[key] = safe_text(values[key])
        values["passed"] = classify(values, self.pass_threshold) == PASSED
        return values


def failure(
    *,
    row_index: int,
    run_index: int,
    source_row_index: int,
    pass_threshold: float,
    error_type: str,
    message: str,
    **extra: Any,
) -> dict[str, Any]:
    """The result of an attempt that ended before the runner could say (a crash, a backstop)."""
    import uuid

    return RowResult(
        row_index=row_index,
        run_index=run_index,
        source_row_index=source_row_index,
        rollout_id=uuid.uuid4().hex,
        status=FAILED,
        pass_threshold=pass_threshold,
        error_type=error_type,
        message=message,
        extra=extra,
    ).as_dict()


def resumed(record: Mapping[str, Any], threshold: float) -> dict[str, Any]:
    """A recorded result as the item that reuses it reports it."""
    return {
        **record,
        "resumed": True,
        "message": "recorded by an earlier session",
        "detail": "",
        "pass_threshold": threshold,
        "passed": classify(record, threshold) == PASSED,
    }


def summary_counts(summary: Mapping[str, Any]) -> dict[str, int]:
    """Outcome key -> count, from a ``metrics.json`` ``summary``.

    ``failed`` rows carry no reward, so the not-skipped attempts that neither passed nor
    errored are the ones below the threshold; the four counts add up to the total.
    """
    passed = int(summary.get(PASSED, 0))
    errored = int(summary.get(FAILED, 0))
    counted = int(summary.get("completed_samples", 0))
    return {
        PASSED: passed,
        BELOW_THRESHOLD: max(0, counted - passed - errored),
        FAILED: errored,
        SKIPPED: int(summary.get(SKIPPED, 0)),
    }


#: How pytest reports each outcome: the one mapping every item and every exit status uses.
#: ``error`` is raised in the item's setup (pytest's phase for errors); ``failed`` in its
#: call, as a failed assertion.
PYTEST_OUTCOMES: dict[str, str] = {
    PASSED: "passed",
    BELOW_THRESHOLD: "failed",
    FAILED: "error",
    SKIPPED: "skipped",
}
#: The pytest outcomes that make a session's exit status 1.
_FAILING_PYTEST_OUTCOMES = ("failed", "error")


def pytest_outcome(verdict: str) -> str:
    """How pytest reports an attempt of this outcome (``passed``/``failed``/``error``/...)."""
    return PYTEST_OUTCOMES[verdict]


def fails_session(verdict: str) -> bool:
    """Whether an attempt of this outcome makes the pytest session fail."""
    return pytest_outcome(verdict) in _FAILING_PYTEST_OUTCOMES


def summary_fails_session(summary: Mapping[str, Any]) -> bool:
    """Whether a finished run's ``metrics.json`` summary holds an attempt that fails the
    session: a finished run run again exits as it did when its rows ran."""
    return any(count and fails_session(key) for key, count in summary_counts(summary).items())


def no_trajectory_text(result: Mapping[str, Any]) -> str:
    """``; no trajectory written: <why>``, the end of the headline of a row recorded
    without its trajectory (the SDK saves trajectories best-effort, silently)."""
    problem = result.get("trajectory_problem")
    return f"; {problem}" if problem else ""
