"""The CI gate: decide a session's exit status from the aggregate, not from single rows.

Without a gate option pytest's own semantics hold (any failed row fails the session).
With ``--osmosis-min-pass-rate`` the rows stay visible, but the exit status says whether
the evaluation as a whole is good enough.

A built-in rule is one entry of :data:`RULES`: its option (which the plugin declares from
here), how its value is read, and its check. Adding a rule is adding an entry. A project
adds a rule of its own without a fork: a conftest or plugin implements the
``pytest_osmosis_gate_verdict`` hook (hookspecs.py) and returns a :class:`Verdict`; the
built-in rules are that hook's first implementation (:class:`BuiltinGate`). An option
without a check is a setting: rules read it (``--osmosis-gate-bound``,
``--osmosis-baseline``), or the controller enforces it while rows run (the budgets,
``--osmosis-max-tokens`` and ``--osmosis-max-cost``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osmosis.core.outcome import FAILED, PASSED, row_passes, summary_counts
from pytest_osmosis.core.words import ERRORED, PASS_RATE_BASIS, pass_rate_text, points

if TYPE_CHECKING:
    from pytest_osmosis.baseline import Baseline, CurrentRun


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
    #: The ``--osmosis-baseline`` run, when one was given.
    baseline: Baseline | None = None


@dataclass(frozen=True)
class RunDetail:
    """What the per-row and baseline rules need beyond ``metrics.json``."""

    rows: Mapping[int, tuple[int, int]]  # dataset row -> (passing attempts, not skipped)
    run_dir: Path | None = None


#: A check: (its option's value, every gate option's value, one run's counts) ->
#: (whether the run passes it, the line that says why, or its lines: the first says why).
Check = Callable[[Any, Mapping[str, Any], Counts], tuple[bool, "str | list[str]"]]


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
    #: Run name -> its ``--osmosis-baseline`` run (filled by :func:`check_runs` before any row).
    baselines: dict[str, Baseline] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(rule.check and self.values.get(rule.dest) is not None for rule in RULES)

    @property
    def budgeted(self) -> bool:
        """A budget stops the session early once spent (the controller enforces it)."""
        return any(self.values.get(name) is not None for name in BUDGETS)


@dataclass
class Verdict:
    """A gate rule's decision on the session's runs: whether they pass, and the lines that
    say why (printed under ``osmosis gate PASSED/FAILED``)."""

    passed: bool
    reasons: list[str] = field(default_factory=list)
    #: Rows worse than in the baseline (the step summary lists them), when one was compared.
    regressions: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"passed": self.passed, "reasons": list(self.reasons)}
        if self.regressions is not None:
            found["regressions"] = list(self.regressions)
        return found

    @classmethod
    def all_of(cls, verdicts: Sequence[Verdict]) -> Verdict:
        """The session's verdict: it passes only when every rule's verdict does."""
        combined = cls(passed=all(verdict.passed for verdict in verdicts))
        for verdict in verdicts:
            combined.reasons += verdict.reasons
            if verdict.regressions is not None:
                combined.regressions = [*(combined.regressions or []), *verdict.regressions]
        return combined


@dataclass(frozen=True)
class GateRun:
    """One finished run as a gate rule sees it."""

    name: str
    metrics: Mapping[str, Any]  # its ``metrics.json``
    records: Sequence[Mapping[str, Any]]  # its journal's records, one per attempt
    pass_threshold: float
    run_dir: Path


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


def _gate_test(flag: str, text: str) -> str:
    if text not in ("paired", "unpaired"):
        raise GateOptionError(f"{flag}: must be paired or unpaired, got {text!r}")
    return text


def _allowed(flag: str, text: str) -> frozenset[str]:
    from pytest_osmosis.baseline import ALLOWABLE

    given = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(given - set(ALLOWABLE))
    if unknown or not given:
        raise GateOptionError(
            f"{flag}: may name {', '.join(ALLOWABLE)} (comma-separated), got {text!r}"
        )
    return given


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


def _max_regression(
    maximum: float, options: Mapping[str, Any], n: Counts
) -> tuple[bool, str | list[str]]:
    """Paired (default): fail when the exact paired test of the rows' changes shows a drop
    (p < ALPHA) larger than ``maximum``. Unpaired: fail when the Newcombe interval shows a
    drop of more than ``maximum`` with 95% confidence."""
    from pytest_osmosis.report.compare import paired_text
    from pytest_osmosis.report.stats import ALPHA

    baseline = n.baseline
    if baseline is None or n.run_dir is None:
        return True, "no baseline run (--osmosis-baseline) to compare with"
    comparison = compare_with_baseline(n.run_dir, baseline)
    common, paired = comparison["common"], comparison["paired"]
    change = comparison["pass_rate_change"]
    drop = f"a drop of more than {maximum * 100:.1f} pp"
    paired_fails = shows_regression("paired", paired, change, maximum)
    unpaired_fails = shows_regression("unpaired", paired, change, maximum)
    rule = f"fails when p < {ALPHA:g} and the drop exceeds"
    paired_says = (
        f"paired test: {paired_text(paired)}; {drop} is "
        f"{'shown' if paired_fails else 'not shown'} ({rule} {maximum * 100:.1f} pp)"
    )
    unpaired_says = (
        f"unpaired test: 95% CI {points(change['ci95_low'])} to "
        f"{points(change['ci95_high'])} (Newcombe, as if the runs were independent samples); "
        f"{drop} is {'shown' if unpaired_fails else 'not shown'}"
    )
    paired_test = options.get("gate_test", "paired") != "unpaired"
    now, then = common["current"], common["baseline"]
    lines = [
        f"against baseline {comparison['baseline']['name']} on the {paired['rows']} rows "
        f"both scored: pass rate {pass_rate_text(now['passed'], now['attempts'])}, baseline "
        f"{pass_rate_text(then['passed'], then['attempts'])}: {points(paired['change'])}",
        f"  deciding: {paired_says if paired_test else unpaired_says}",
        "  not deciding (--osmosis-gate-test): " + (unpaired_says if paired_test else paired_says),
    ]
    need = options.get("row_pass")
    k = need[0] if isinstance(need, tuple) else None

    def flipped(entries: list[dict[str, Any]], before: bool) -> list[int]:
        return sorted(
            e["source_row_index"]
            for e in entries
            if row_passes(e["baseline"]["passes"], e["baseline"]["attempts"], k) is before
            and row_passes(e["current"]["passes"], e["current"]["attempts"], k) is not before
        )

    lost = flipped(comparison["regressed"], True)
    won = flipped(comparison["improved"], False)
    lines.append(
        "  rows that passed in the baseline and fail now: " + (_row_list(lost) if lost else "none")
    )
    lines.append(
        "  rows that failed in the baseline and pass now: " + (_row_list(won) if won else "none")
    )
    if comparison["regressed"] and len(comparison["regressed"]) != len(lost):
        lines.append(
            "  rows with fewer passing attempts: "
            + _row_list(sorted(e["source_row_index"] for e in comparison["regressed"]))
        )
    lines.append(f"  rows: {baseline.match.text()}")
    if baseline.differences:
        lines.append("  differs from the baseline: " + "; ".join(baseline.differences))
    lines += ["  " + line for line in detection_lines(options, baseline)]
    return not (paired_fails if paired_test else unpaired_fails), lines


def shows_regression(
    test: str, paired: Mapping[str, Any], unpaired: Mapping[str, Any], maximum: float
) -> bool:
    """The regression rule (``bench/gate_power.py`` measures it): paired, the exact paired
    permutation test (McNemar for n = 1) shows a drop (p < ALPHA) larger than *maximum*; unpaired,
    Newcombe's 95% interval lies below ``-maximum``. Inputs: ``report.compare``'s
    ``paired_test`` and ``pass_rate_change``."""
    from pytest_osmosis.report.stats import ALPHA

    if test == "unpaired":
        return bool(unpaired["ci95_high"] < -maximum)
    return bool(paired["p_value"] < ALPHA and -paired["change"] > maximum)


def compare_with_baseline(run_dir: Path, baseline: Baseline) -> dict[str, Any]:
    """``report.compare.compare_runs`` of a run (from its journal) and its baseline."""
    from pytest_osmosis.report.compare import compare_runs
    from pytest_osmosis.results.run_reader import load_run

    return compare_runs(
        load_run(run_dir, journal=True),
        baseline.run,
        digests=(baseline.current_digests, baseline.digests),
    )


def regressions(comparison_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step summary's regression list: each row worse than in the baseline."""
    return [
        {
            "row": e["source_row_index"],
            "baseline": f"{e['baseline']['passes']}/{e['baseline']['attempts']}",
            "now": f"{e['current']['passes']}/{e['current']['attempts']}",
        }
        for e in comparison_rows
    ]


def detection_lines(options: Mapping[str, Any], baseline: Baseline) -> list[str]:
    """What the regression gate can detect against *baseline* (its rows in common, n and
    pass rate), and a warning when ``--osmosis-max-regression`` asks for less."""
    n = int((baseline.run["manifest"].get("inputs") or {}).get("n") or 1)
    summary = baseline.run["summary"]
    scored = int(summary.get("completed_samples") or 0)
    rate = int(summary.get("passed") or 0) / scored if scored else 0.5
    return power_lines(options, len(baseline.match.pairs), n, rate)


def power_lines(options: Mapping[str, Any], rows: int, n: int, rate: float) -> list[str]:
    """The smallest drop this gate catches at *rows* rows of *n* attempts with 80% power
    (the plan, the session header and the verdict say it), and a warning line when
    ``--osmosis-max-regression`` is smaller, with the rows that drop would need."""
    from pytest_osmosis.report.stats import POWER

    paired = options.get("gate_test", "paired") != "unpaired"
    maximum = options.get("max_regression")
    smallest, needed = detectable(rows, n, rate, maximum, paired)
    what = (
        "paired test, at best: no row gets better"
        if paired
        else f"unpaired test, {rows * n} attempts a side at a pass rate of {rate:.0%}"
    )
    if smallest is None:
        lines = [f"can detect: no drop at {rows} rows with {POWER:.0%} power ({what})"]
    else:
        lines = [
            f"can detect: a drop of {smallest * 100:.1f} pp or more with {POWER:.0%} power "
            f"at {rows} rows ({what})"
        ]
    if needed is not None and maximum:
        lines.append(
            f"warning: --osmosis-max-regression {maximum * 100:.1f} pp is below what {rows} "
            "rows can detect; "
            f"catching a drop of {maximum * 100:.1f} pp with {POWER:.0%} power takes at least "
            f"{needed} rows" + (f" ({needed * n} attempts at n = {n})" if n > 1 else "")
        )
    return lines


def detectable(
    rows: int, n: int, rate: float, maximum: float | None, paired: bool
) -> tuple[float | None, int | None]:
    """(the smallest drop detected with 80% power at *rows* rows of *n* attempts, the rows
    a drop of *maximum* needs when that is smaller, else None)."""
    from pytest_osmosis.report.stats import (
        paired_power,
        size_needed,
        smallest_drop,
        unpaired_power,
    )

    if paired:
        smallest = smallest_drop(lambda drop: paired_power(rows, drop))
    else:
        smallest = smallest_drop(lambda drop: unpaired_power(rows * n, rate, drop))
    if not maximum or (smallest is not None and maximum >= smallest):
        return smallest, None
    if paired:
        return smallest, size_needed(lambda size: paired_power(size, maximum))
    attempts = size_needed(lambda size: unpaired_power(size, rate, maximum))
    return smallest, -(-attempts // n)


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
        "point (default) or wilson: gate on the 95% Wilson lower bound of the pass rate instead",
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
        "a finished run (name or directory) to compare with (--osmosis-max-regression): "
        "the same n and pass_threshold; rows are matched by content",
        "RUN",
        _run_ref,
    ),
    GateOption(
        "max_regression",
        "--osmosis-max-regression",
        "CI gate: fail when the pass rate fell from the baseline's by more than R (0..1) "
        "and the paired test shows the drop at 5% (--osmosis-gate-test)",
        "R",
        _rate,
        _max_regression,
    ),
    GateOption(
        "gate_test",
        "--osmosis-gate-test",
        "paired (default): --osmosis-max-regression decides with the exact paired permutation "
        "test of the rows' changes (exact McNemar for n = 1); unpaired: with Newcombe's interval",
        "TEST",
        _gate_test,
        default="paired",
    ),
    GateOption(
        "baseline_allow",
        "--osmosis-baseline-allow",
        "compare with a baseline although it differs in this (pass_threshold); the verdict says so",
        "WHAT",
        _allowed,
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
            lines = what if isinstance(what, list) else [what]
            verdict.reasons += [f"{name}: {lines[0]}", *lines[1:]]
            verdict.passed = verdict.passed and ok
    return verdict


def judge_runs(options: GateOptions, runs: Sequence[GateRun]) -> Verdict:
    """The built-in rules' verdict on finished runs. What the session's gate (through
    :class:`BuiltinGate`) and ``pytest-osmosis gate`` both call, so a run is judged the same
    wherever it was gated."""
    from pytest_osmosis.results.row_metrics import attempts_by_row

    details = {
        run.name: RunDetail(attempts_by_row(run.records, run.pass_threshold), run.run_dir)
        for run in runs
    }
    verdict = decide(options, [(run.name, dict(run.metrics)) for run in runs], details)
    verdict.regressions = _baseline_regressions(options, [(run.name, run.run_dir) for run in runs])
    return verdict


class BuiltinGate:
    """The built-in rules as an implementation of ``pytest_osmosis_gate_verdict`` (a pluggy
    plugin: the method's name is the hook's), so they are one rule among a project's.

    A plain class: pytest hashes a plugin when it is registered (pytest 8.4), and the
    options hold dicts."""

    def __init__(self, options: GateOptions) -> None:
        self.options = options

    def pytest_osmosis_gate_verdict(self, runs: Sequence[GateRun]) -> Verdict | None:
        if not self.options.active:
            return None  # no built-in gate option given: no say
        return judge_runs(self.options, runs)


def session_verdict(found: Sequence[object]) -> Verdict | None:
    """The verdicts ``pytest_osmosis_gate_verdict`` returned, combined (None: none had a say).

    A value that is not a :class:`Verdict` fails the gate with a line naming it: a rule
    that cannot say what it decided must not let a run pass.
    """
    verdicts = [
        verdict
        if isinstance(verdict, Verdict)
        else Verdict(
            False,
            [
                "pytest_osmosis_gate_verdict returned "
                f"{type(verdict).__name__} {verdict!r}, not a pytest_osmosis.gate.Verdict or None"
            ],
        )
        for verdict in found
        if verdict is not None
    ]
    return Verdict.all_of(verdicts) if verdicts else None


def _baseline_regressions(
    options: GateOptions, runs: list[tuple[str, Path]]
) -> list[dict[str, Any]] | None:
    """Rows worse than in the baseline, for the step summary (None without one)."""
    if options.values.get("max_regression") is None or not options.baselines:
        return None
    found: list[dict[str, Any]] = []
    for name, run_dir in runs:
        baseline = options.baselines.get(name)
        if baseline is None:
            continue
        comparison = compare_with_baseline(run_dir, baseline)
        found += [{"run": name, **row} for row in regressions(comparison["regressed"])]
    return found


def check_runs(options: GateOptions, runs: list[CurrentRun]) -> None:
    """Before any row: refuse in one line what the gate could not judge at the end.

    The baseline is opened here (into ``options.baselines``): whole, of the same n and
    pass_threshold, with rows in common (``baseline.open_baseline``).
    ``--osmosis-row-pass k/n`` must name the run's n.
    """
    row_pass = options.values.get("row_pass")
    for run in runs:
        n = run.inputs.get("n")
        if row_pass is not None and row_pass[1] != n:
            raise GateOptionError(
                f"--osmosis-row-pass {row_pass[0]}/{row_pass[1]}: run {run.name} makes "
                f"{n} attempts per row (n), not {row_pass[1]}"
            )
    ref = options.values.get("baseline")
    if not ref:
        if options.values.get("max_regression") is not None:
            raise GateOptionError("--osmosis-max-regression: needs --osmosis-baseline RUN")
        return
    from pytest_osmosis.baseline import BaselineError, open_baseline

    allow = options.values.get("baseline_allow") or frozenset()
    for run in runs:
        try:
            options.baselines[run.name] = open_baseline(ref, run, allow)
        except BaselineError as exc:
            raise GateOptionError(str(exc)) from None
