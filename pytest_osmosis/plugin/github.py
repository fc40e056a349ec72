"""GitHub Actions: a step summary in Markdown and ``::error`` annotations on dataset lines.

When ``GITHUB_ACTIONS=true`` (GitHub sets it in every job) and ``--osmosis-github`` is not
``off``, the controller appends one section per run to ``$GITHUB_STEP_SUMMARY`` (outcomes,
the pass rate with its 95% Wilson interval, the gate's verdict and regressions, the worst
attempts with their headline) and prints one workflow command per attempt that did not
pass, at the dataset file and line of its row (GitHub shows them on the pull request's
diff). Everything is read from what the session finished with (``metrics.json``, the
journal's records, the gate's verdict), the same data as the results table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import ControllerRun, EvalSession

#: Annotations of one config's attempts (GitHub shows 10 errors a step); the rest are one count.
MAX_ANNOTATIONS = 10
#: Attempts listed in a run's "worst attempts" table.
MAX_WORST = 10
MODES = ("auto", "off")


def github_mode(value: str | None, source: str) -> str:
    """``--osmosis-github`` / ``osmosis_github``: auto (the default) or off."""
    mode = (value or "auto").strip().lower()
    if mode not in MODES:
        raise pytest.UsageError(f"{source}: must be auto or off, got {value!r}")
    return mode


def active(mode: str, environ: Mapping[str, str] = os.environ) -> bool:
    return mode == "auto" and environ.get("GITHUB_ACTIONS") == "true"


@dataclass(frozen=True)
class Attempt:
    """One attempt that did not pass, as the summary and an annotation show it."""

    run_name: str
    source_row: int
    run_index: int
    outcome: str  # outcome.BELOW_THRESHOLD or outcome.FAILED
    reward: float | None
    headline: str
    dataset: Path
    line: int | None


class GitHubHooks:
    """Controller only: remember this session's headlines, then write at the end.

    Everything the session prints between its start and its end can carry what a rollout
    or a model wrote (tracebacks, captured output, headlines): the runner is told to obey
    no workflow command in it (``::stop-commands::<token>``, a token nothing else knows),
    except for our own annotations, printed while commands are briefly on again.
    """

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        #: (config path, row_index, run_index) -> this session's headline of the attempt.
        self.headlines: dict[tuple[str, int, int], str] = {}
        self._stopped: str | None = None  # the token commands are off under, while they are

    def _stop_commands(self, config: pytest.Config) -> None:
        import secrets

        self._stopped = secrets.token_hex(16)
        _print(config, f"::stop-commands::{self._stopped}")

    def _resume_commands(self, config: pytest.Config) -> None:
        if self._stopped is not None:
            _print(config, f"::{self._stopped}::")
            self._stopped = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._stop_commands(session.config)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._resume_commands(config)  # what the job prints after pytest is obeyed again

    def pytest_osmosis_row_result(self, config: pytest.Config, result: dict[str, Any]) -> None:
        from pytest_osmosis.plugin.collect import pytest_verdict

        _, text, _ = pytest_verdict(result, result["source_row_index"], result["run_index"])
        if text:
            key = (str(result["config"]), result["row_index"], result["run_index"])
            self.headlines[key] = text

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After the controller wrote metrics.json and applied the gate (its hook is tryfirst)."""
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if not path:
            return
        try:
            text = step_summary(self.session, self.headlines)
            if text:
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(text)
        except Exception as exc:  # a CI surface never changes the exit status
            _surface_failed(session.config, f"the GitHub step summary {path}", exc)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        config = self.session.config
        try:
            base = Path(os.environ.get("GITHUB_WORKSPACE") or config.rootpath)
            runs = [run for run in self.session.runs.values() if run.metrics]
            lines = [
                line
                for run in runs
                for line in annotation_lines(not_passed(run, self.headlines), base)
            ]
        except Exception as exc:  # a CI surface never changes the exit status
            _surface_failed(config, "the GitHub annotations", exc)
            return
        self._resume_commands(config)
        for line in lines:
            terminalreporter.write_line(line)
        self._stop_commands(config)  # pytest's short summary (headlines) comes next


def _print(config: pytest.Config, line: str) -> None:
    """A line of ours on the terminal, past any row's captured output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, flush=True)


def _surface_failed(config: pytest.Config, surface: str, exc: BaseException) -> None:
    """One warning line: a CI surface that could not be written changes nothing else."""
    from pytest_osmosis.core.words import one_line, safe_text

    why = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
    _print(config, f"osmosis: warning: cannot write {surface}: {one_line(safe_text(str(why)))}")


def not_passed(run: ControllerRun, headlines: Mapping[tuple[str, int, int], str]) -> list[Attempt]:
    """A run's attempts that did not pass, worst first: errors, then the lowest rewards."""
    from pytest_osmosis.core.outcome import BELOW_THRESHOLD, FAILED, classify
    from pytest_osmosis.plugin.collect import pytest_verdict
    from pytest_osmosis.plugin.session import resumed_result

    plan = run.plan
    threshold = plan.settings.pass_threshold
    found: list[Attempt] = []
    for key, record in sorted(run.rundir.records.items()):
        outcome = classify(record, threshold)
        if outcome not in (BELOW_THRESHOLD, FAILED):
            continue
        source = plan.dataset.source_row_index(key[0])
        headline = headlines.get((str(plan.config_path), *key))
        if headline is None:  # recorded by an earlier session: the journal has no message
            headline = pytest_verdict(resumed_result(record, plan), source, key[1])[1]
        reward = record.get("reward")
        found.append(
            Attempt(
                run_name=plan.run_name,
                source_row=source,
                run_index=key[1],
                outcome=outcome,
                reward=float(reward) if isinstance(reward, (int, float)) else None,
                headline=headline,
                dataset=plan.dataset.path,
                line=plan.dataset.line(key[0]),
            )
        )
    found.sort(key=lambda a: (a.outcome != FAILED, a.reward if a.reward is not None else 0.0))
    return found


# -- the step summary -------------------------------------------------------------------


def step_summary(session: EvalSession, headlines: Mapping[tuple[str, int, int], str]) -> str:
    """The Markdown appended to ``$GITHUB_STEP_SUMMARY``: one section per run, then the gate."""
    verdict = session.verdict.as_dict() if session.verdict is not None else None
    parts = [run_section(run, headlines) for run in session.runs.values() if run.metrics]
    if verdict is not None:
        parts.append(gate_section(verdict))
    return "".join(parts)


def run_section(run: ControllerRun, headlines: Mapping[tuple[str, int, int], str]) -> str:
    from pytest_osmosis.core.outcome import OUTCOMES, summary_counts
    from pytest_osmosis.core.words import OUTCOME_WORDS, pass_rate_text
    from pytest_osmosis.report.stats import wilson_interval

    metrics = run.metrics
    eval_run: dict[str, Any] = metrics.get("eval_run", {})
    summary: dict[str, Any] = metrics.get("summary", {})
    counts = summary_counts(summary)
    passed, counted = int(summary.get("passed", 0)), int(summary.get("completed_samples", 0))
    low, high = wilson_interval(passed, counted)
    lines = [
        f"## pytest-osmosis: {_cell(run.plan.run_name)}",
        "",
        f"rollout `{_cell(eval_run.get('rollout_name'))}`, model "
        f"`{_cell(eval_run.get('model_name'))}`, dataset `{_cell(eval_run.get('dataset_name'))}`"
        f", status **{_cell(eval_run.get('status'))}**",
        "",
        "| " + " | ".join(OUTCOME_WORDS[key] for key in OUTCOMES) + " | total |",
        "| " + " | ".join("---:" for _ in OUTCOMES) + " | ---: |",
        "| "
        + " | ".join(str(counts[key]) for key in OUTCOMES)
        + f" | {int(summary.get('total_samples', 0))} |",
        "",
        f"**Pass rate** {pass_rate_text(passed, counted)}, 95% Wilson interval "
        f"{low:.1%} to {high:.1%}, pass_threshold {summary.get('pass_threshold')}",
        "",
    ]
    worst = not_passed(run, headlines)
    if worst:
        lines += [
            f"### Worst attempts ({min(len(worst), MAX_WORST)} of {len(worst)})",
            "",
            "| row | run | outcome | reward | headline |",
            "| ---: | ---: | --- | ---: | --- |",
        ]
        for attempt in worst[:MAX_WORST]:
            reward = f"{attempt.reward:.2f}" if attempt.reward is not None else ""
            lines.append(
                f"| {attempt.source_row} | {attempt.run_index} | "
                f"{OUTCOME_WORDS[attempt.outcome]} | {reward} | {_cell(attempt.headline)} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def gate_section(verdict: Mapping[str, Any]) -> str:
    """The gate's verdict and reasons; regressions against a baseline when the verdict has them.

    ``regressions`` is read defensively: a list of lines, or of mappings shown key by key.
    """
    word = "PASSED" if verdict.get("passed") else "FAILED"
    lines = [f"### Gate: {word}", ""]
    lines += [f"- {_cell(reason)}" for reason in verdict.get("reasons") or []]
    regressions = verdict.get("regressions")
    if isinstance(regressions, Iterable) and not isinstance(regressions, (str, bytes)):
        shown = [_regression(item) for item in regressions]
        lines += ["", f"### Regressions against the baseline ({len(shown)})", ""]
        lines += [f"- {line}" for line in shown] if shown else ["none"]
    return "\n".join(lines) + "\n\n"


def _regression(item: Any) -> str:
    if isinstance(item, Mapping):
        return _cell(", ".join(f"{key} {value}" for key, value in item.items()))
    return _cell(item)


def _cell(value: Any) -> str:
    """Text safe inside a Markdown table cell: one line, no pipe to split the cell."""
    from pytest_osmosis.core.words import one_line, safe_text

    return one_line(safe_text(str(value)), 300).replace("|", "\\|")


# -- annotations ------------------------------------------------------------------------


def annotation_lines(attempts: list[Attempt], base: Path) -> list[str]:
    """``::error`` workflow commands at a run's attempts' dataset lines (each config gets its
    own ``MAX_ANNOTATIONS``); past the limit, one count."""
    lines = []
    for attempt in attempts[:MAX_ANNOTATIONS]:
        where = {"file": _relative(attempt.dataset, base)}
        if attempt.line is not None:
            where["line"] = str(attempt.line)
        where["title"] = f"{attempt.run_name}: row {attempt.source_row} run {attempt.run_index}"
        lines.append(command("error", where, attempt.headline))
    if len(attempts) > MAX_ANNOTATIONS:
        more = len(attempts) - MAX_ANNOTATIONS
        lines.append(
            command(
                "warning",
                {},
                f"{attempts[0].run_name}: {more} more attempts did not pass (see the step summary)",
            )
        )
    return lines


def command(name: str, properties: Mapping[str, str], message: str) -> str:
    """One GitHub workflow command, escaped as GitHub's toolkit escapes it."""
    props = ",".join(f"{key}={_escape(value, True)}" for key, value in properties.items())
    return f"::{name}{' ' + props if props else ''}::{_escape(message, False)}"


def _escape(value: str, is_property: bool) -> str:
    from pytest_osmosis.core.words import safe_text

    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if is_property:
        value = value.replace(":", "%3A").replace(",", "%2C")
    return safe_text(value)


def _relative(path: Path, base: Path) -> str:
    """The dataset as GitHub names files: relative to the checkout, where it is inside it."""
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)
