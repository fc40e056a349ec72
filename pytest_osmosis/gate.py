"""The CI gate: decide a session's exit status from the aggregate, not from single rows.

Without a gate option pytest's own semantics hold (any failed row fails the session).
With ``--osmosis-min-pass-rate`` the rows stay visible, but the exit status says whether
the evaluation as a whole is good enough.

A rule is one entry of :data:`RULES`: its option (which the plugin declares from here),
how its value is read, and its check. Adding a rule is adding an entry. An option
without a check is a setting: rules read it (``--osmosis-gate-bound``,
``--osmosis-baseline``), or the controller enforces it while rows run (the budgets,
``--osmosis-max-tokens`` and ``--osmosis-max-cost``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.outcome import FAILED, PASSED, row_passes, summary_counts
from pytest_osmosis.words import ERRORED, PASS_RATE_BASIS, pass_rate_text, percent, points


class GateOptionError(ValueError):
    """A gate option's value is refused; the message names the option."""


@dataclass(frozen=True)
class Counts:
    """One run's numbers a rule judges (from its ``metrics.json`` summary)."""

    passed: int
    errored: int
    scored: int  # attempts not skipped: every rate's denominator
    #: Dataset row -> (passing attempts, attempts not skipped): the per-row rules' input.
    rows: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    #: The run directory (the baseline rule loads it to compare rows).
    run_dir: Path | None = None
    #: The ``--osmosis-baseline`` run (``results.runs.load_run``), when one was given.
    baseline: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RunDetail:
    """What the per-row and baseline rules need beyond ``metrics.json``."""

    rows: Mapping[int, tuple[int, int]]  # dataset row -> (passing attempts, not skipped)
    run_dir: Path | None = None


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
    #: Run name -> its ``--osmosis-baseline`` run as ``results.runs.load_run`` gives it
    #: (filled by :func:`check_runs` before any row).
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(rule.check and self.values.get(rule.dest) is not None for rule in RULES)

    @property
    def budgeted(self) -> bool:
        """A budget stops the session early once spent (the controller enforces it)."""
        return any(self.values.get(name) is not None for name in BUDGETS)


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


def _row_pass(flag: str, text: str) -> tuple[int, int]:
    """``k/n``: a row passes when at least k of its n attempts pass."""
    k_text, slash, n_text = text.partition("/")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        k = n = 0
    if not slash or not 1 <= k <= n:
        raise GateOptionError(f"{flag}: must be k/n with 1 <= k <= n (e.g. 2/3), got {text!r}")
    return k, n


def _positive(flag: str, text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise GateOptionError(f"{flag}: must be a positive number, got {text!r}")
    return number


def _tokens(flag: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise GateOptionError(f"{flag}: must be a positive whole number of tokens, got {text!r}")
    return number


def _run_ref(flag: str, text: str) -> str:
    return text.strip()


def _row_list(rows: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(row) for row in rows[:limit])
    return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def _row_pass_check(
    row_pass: tuple[int, int], options: Mapping[str, Any], n: Counts
) -> tuple[bool, str]:
    need, of = row_pass
    failing = [row for row, (p, a) in sorted(n.rows.items()) if a and not row_passes(p, a, need)]
    judged = sum(1 for _, a in n.rows.values() if a)
    what = f"rows passing {need}/{of}: {judged - len(failing)} of {judged}"
    if failing:
        what += f"; rows that do not: {_row_list(failing)}"
    return not failing, what


def _max_regression(maximum: float, options: Mapping[str, Any], n: Counts) -> tuple[bool, str]:
    """Fail only when the drop beyond ``maximum`` is shown with 95% confidence."""
    baseline = n.baseline
    if baseline is None or n.run_dir is None:
        return True, "no baseline run (--osmosis-baseline) to compare with"
    from pytest_osmosis.report.compare import compare_runs
    from pytest_osmosis.results.runs import load_run

    comparison = compare_runs(load_run(n.run_dir), baseline)
    change = comparison["pass_rate_change"]
    ok = not change["ci95_high"] < -maximum
    what = (
        f"pass rate {percent(comparison['current']['pass_rate'])} against baseline "
        f"{comparison['baseline']['name']} {percent(comparison['baseline']['pass_rate'])}: "
        f"{points(change['difference'])}, 95% CI {points(change['ci95_low'])} to "
        f"{points(change['ci95_high'])}, "
        + (
            f"a drop of more than {maximum * 100:.1f} pp is shown"
            if not ok
            else f"no drop of more than {maximum * 100:.1f} pp is shown"
        )
    )
    need = options.get("row_pass")
    k = need[0] if isinstance(need, tuple) else None
    lost = [
        entry["source_row_index"]
        for entry in comparison["regressed"]
        if row_passes(entry["baseline"]["passes"], entry["baseline"]["attempts"], k)
        and not row_passes(entry["current"]["passes"], entry["current"]["attempts"], k)
    ]
    if lost:
        what += f"; rows that passed in the baseline and fail now: {_row_list(sorted(lost))}"
    return ok, what


#: The budgets' option names (settings the controller enforces while rows run).
BUDGETS = ("max_tokens", "max_cost")

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
    # Issue 17: a baseline run, per-row verdicts from n attempts, budgets.
    GateOption(
        "baseline",
        "--osmosis-baseline",
        "a run name or run directory to compare with (--osmosis-max-regression); it must "
        "have the same dataset, row selection and n",
        "RUN",
        _run_ref,
    ),
    GateOption(
        "max_regression",
        "--osmosis-max-regression",
        "CI gate: fail when the pass rate is lower than the baseline's by more than R "
        "(0..1) with 95%% confidence (Newcombe interval)",
        "R",
        _rate,
        _max_regression,
    ),
    GateOption(
        "row_pass",
        "--osmosis-row-pass",
        "CI gate: a row passes when at least k of its n attempts pass (k/n, n = the run's n); "
        "fail when a row does not",
        "K/N",
        _row_pass,
        _row_pass_check,
    ),
    GateOption(
        "max_tokens",
        "--osmosis-max-tokens",
        "budget: once this session used N tokens no new row starts; rows in flight finish, "
        "the rest stay pending (exit 2)",
        "N",
        _tokens,
    ),
    GateOption(
        "max_cost",
        "--osmosis-max-cost",
        "budget: as --osmosis-max-tokens, in US dollars (LiteLLM's local cost map; "
        "refused for a model without a price)",
        "USD",
        _positive,
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


def decide(
    options: GateOptions,
    runs: list[tuple[str, dict[str, Any]]],
    details: Mapping[str, RunDetail] | None = None,
) -> Verdict:
    """Apply the gate to every run; the session passes only if each run does.

    ``details`` (by run name) gives the per-row counts and run directory the per-row and
    baseline rules need; the totals always come from each run's ``metrics.json``.
    """
    verdict = Verdict(passed=True)
    for name, metrics in runs:
        summary = metrics.get("summary", {})
        counts = summary_counts(summary)
        detail = (details or {}).get(name)
        numbers = Counts(
            passed=counts[PASSED],
            errored=counts[FAILED],
            scored=int(summary.get("completed_samples", 0)),
            rows=detail.rows if detail else {},
            run_dir=detail.run_dir if detail else None,
            baseline=options.baselines.get(name),
        )
        for rule in RULES:
            value = options.values.get(rule.dest)
            if rule.check is None or value is None:
                continue
            ok, what = rule.check(value, options.values, numbers)
            verdict.reasons.append(f"{name}: {what}")
            verdict.passed = verdict.passed and ok
    return verdict


def judge_runs(
    options: GateOptions,
    runs: list[tuple[str, dict[str, Any], Sequence[Mapping[str, Any]], float, Path]],
) -> Verdict:
    """The gate's verdict on finished runs: (name, ``metrics.json``, journal records, pass
    threshold, run directory) each. What the session's controller and ``pytest-osmosis
    gate`` both call, so a run is judged the same wherever it was gated."""
    from pytest_osmosis.results.row_metrics import attempts_by_row

    details = {
        name: RunDetail(attempts_by_row(records, threshold), run_dir)
        for name, _, records, threshold, run_dir in runs
    }
    return decide(options, [(name, metrics) for name, metrics, *_ in runs], details)


def check_runs(options: GateOptions, runs: list[tuple[str, Path, Mapping[str, Any]]]) -> None:
    """Before any row: refuse in one line what the gate could not judge at the end.

    ``runs`` are (run name, run directory, manifest ``inputs``). The baseline is loaded
    here (into ``options.baselines``) and must measure the same thing: the same dataset
    file, row selection and n. ``--osmosis-row-pass k/n`` must name the run's n.
    """
    row_pass = options.values.get("row_pass")
    for name, _, inputs in runs:
        if row_pass is not None and row_pass[1] != inputs.get("n"):
            raise GateOptionError(
                f"--osmosis-row-pass {row_pass[0]}/{row_pass[1]}: run {name} makes "
                f"{inputs.get('n')} attempts per row (n), not {row_pass[1]}"
            )
    ref = options.values.get("baseline")
    if not ref:
        if options.values.get("max_regression") is not None:
            raise GateOptionError("--osmosis-max-regression: needs --osmosis-baseline RUN")
        return
    from pytest_osmosis.errors import RunDirectoryError
    from pytest_osmosis.results.runs import load_run, resolve_run

    for name, run_dir, inputs in runs:
        try:
            found = resolve_run(ref, run_dir.parent)
            if found.resolve() == run_dir.resolve():
                raise GateOptionError(f"--osmosis-baseline {ref}: is this run ({name}) itself")
            baseline = load_run(found)
        except RunDirectoryError as exc:
            raise GateOptionError(f"--osmosis-baseline: {exc}") from None
        theirs = baseline["manifest"].get("inputs") or {}
        differs = [
            f"{what} {mine!r} (baseline {other!r})"
            for what, mine, other in (
                (
                    "dataset sha256",
                    str(_dataset(inputs, "sha256"))[:12],
                    str(_dataset(theirs, "sha256"))[:12],
                ),
                (
                    "row selection",
                    _dataset(inputs, "selected_source_rows"),
                    _dataset(theirs, "selected_source_rows"),
                ),
                ("n", inputs.get("n"), theirs.get("n")),
            )
            if mine != other
        ]
        if differs:
            raise GateOptionError(
                f"--osmosis-baseline {ref}: not comparable with run {name}: " + "; ".join(differs)
            )
        options.baselines[name] = baseline


def _dataset(inputs: Mapping[str, Any], key: str) -> Any:
    dataset = inputs.get("dataset")
    return dataset.get(key) if isinstance(dataset, dict) else None
