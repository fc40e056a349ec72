"""Collection: an eval TOML becomes one pytest item per (dataset row, attempt).

Items hold only indices; the row is read from the dataset when the item runs, so a
100,000-row dataset collects quickly. Node ids name the dataset's own row
(``row_<source row>_run_<attempt>``), so they do not change with ``-n``, ``--osmosis-limit``
or the concurrency, and ``--lf``, ``--deselect`` and ``-k row_7_`` keep working.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.core.errors import OsmosisError
from pytest_osmosis.core.outcome import (
    BELOW_THRESHOLD,
    FAILED,
    SKIPPED,
    classify,
    no_trajectory_text,
    pytest_outcome,
)
from pytest_osmosis.core.words import safe_text

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from pytest_osmosis.plugin.session import EvalSession
    from pytest_osmosis.workspace.plan import EvalPlan


class EvalFailure(Exception):
    """A row that did not pass: low reward, or a workflow/grader error."""

    def __init__(self, headline: str, detail: str = "") -> None:
        super().__init__(headline)
        self.headline = headline
        self.detail = detail


class RewardBelowThreshold(EvalFailure, AssertionError):
    """The row ran and was graded, and its reward is too low: a failed assertion.

    An ``AssertionError`` so that tools which tell a failed check from a broken test by the
    exception's type (Allure, pytest-html) say "failed", as pytest does.
    """


class RowErrored(EvalFailure):
    """The row could not be judged (its code raised, a budget ran out): a test error.

    Raised from the item's setup, so pytest and every report built from its reports
    (the terminal's ``E``, ``<error>`` in JUnit, pytest-html's "Error") count it among
    errors, not failures. The phase is the only thing ``--junitxml`` reads to tell them
    apart (a failed ``call`` report is a ``<failure>``, any other failed report an
    ``<error>``): pytest's public report model, no private writer touched.
    """


class InfrastructureError(RowErrored):
    """An error of what the row ran on, not of the rollout (``outcome.is_infrastructure``).

    Its own type, so pytest-rerunfailures re-runs it while every other row outcome is
    named in its ``rerun_except`` (rerun.py).
    """


#: What an item raises for each pytest outcome that fails it (``outcome.PYTEST_OUTCOMES``);
#: pytest-rerunfailures never re-runs these (rerun.never_rerun derives its patterns from it).
RAISED_FOR: dict[str, type[EvalFailure]] = {"failed": RewardBelowThreshold, "error": RowErrored}


class EvalConfigFile(pytest.File):
    """``configs/eval/<name>.toml``: yields one item per selected row and attempt."""

    plan: EvalPlan

    def collect(self) -> Iterator[EvalItem]:
        session: EvalSession = self.config.stash[SESSION_KEY]
        try:
            plan = session.plans.plan_for(self.path)
            session.rollouts.ready(plan, lambda: session.executor)
        except OsmosisError as exc:
            session.collection_failed(self.path)  # its run keeps what it logged (logs.txt)
            raise self.CollectError(
                with_hint(str(exc), how_to_run_the_others(self.config, self.path))
            ) from None
        self.plan = plan
        experiment = plan.config.experiment
        self.add_marker(
            pytest.mark.osmosis(
                config=self.path.stem,
                rollout=experiment.rollout,
                model=plan.settings.model_path,
                dataset=experiment.dataset,
            )
        )
        backstop = _backstop_seconds(plan, self.config, session.options.backstop_grace)
        if backstop is not None:
            # pytest-timeout catches code that blocks the loop (where our budgets cannot
            # fire). Signal method only: the thread method kills the process and its results.
            self.add_marker(pytest.mark.timeout(backstop, method="signal", func_only=True))
        sources = plan.dataset.selected_source_rows
        n = plan.settings.n
        # --osmosis-shard: this shard's items only (shard.py); else every row and attempt
        keys = (
            plan.work_keys()
            if plan.shard is not None
            else ((r, i) for r in range(len(sources)) for i in range(n))
        )
        for row_index, run_index in keys:
            source = sources[row_index]
            yield EvalItem.from_parent(
                self,
                name=item_name(source, run_index),
                row_index=row_index,
                run_index=run_index,
                source_row_index=source,
            )


def item_name(source_row: int, run_index: int) -> str:
    """An item's name: the dataset's own row and the attempt (``row_7_run_0``)."""
    return f"row_{source_row}_run_{run_index}"


_ITEM_NAME = re.compile(r"::row_(\d+)_run_(\d+)$")


def split_item_nodeid(nodeid: str) -> tuple[str, int, int] | None:
    """``(file part, source row, run index)`` of an eval item's node id, else None."""
    match = _ITEM_NAME.search(nodeid)
    if match is None:
        return None
    return nodeid[: match.start()], int(match.group(1)), int(match.group(2))


class EvalItem(pytest.Item):
    """One (row, attempt): runs the workflow and the grader, passes when reward >= threshold."""

    parent: EvalConfigFile

    def __init__(
        self, *, row_index: int, run_index: int, source_row_index: int, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.row_index = row_index
        self.run_index = run_index
        self.source_row_index = source_row_index

    @property
    def key(self) -> tuple[int, int]:
        return (self.row_index, self.run_index)

    def setup(self) -> None:
        """Start rows ahead, then wait for this one: an errored row is a setup error.

        The wait is here, not in ``runtest``, so that an error can be reported in the
        phase pytest reserves for errors (see :class:`RowErrored`); ``runtest`` then
        only judges the reward.
        """
        session: EvalSession = self.config.stash[SESSION_KEY]
        if RESULT_KEY in self.stash:  # a re-run (pytest-rerunfailures) starts afresh
            del self.stash[RESULT_KEY]
        session.start_ahead(self)
        result = self._wait(session)
        self.stash[RESULT_KEY] = result
        # What the row's own code printed, whenever it ran (row_output.py): it ran here.
        for name, text in session.row_output.take(self.nodeid).items():
            self.add_report_section("setup", name, text)
        outcome, text, detail = pytest_verdict(result, self.source_row_index, self.run_index)
        if outcome != "error":
            return
        if self.config.option.usepdb and result.get("exception"):
            raise result["exception"]  # --pdb: post-mortem in the rollout's own frames
        from pytest_osmosis.core.outcome import is_infrastructure

        raise (InfrastructureError if is_infrastructure(result) else RAISED_FOR[outcome])(
            text, detail
        )

    def _wait(self, session: EvalSession) -> dict[str, Any]:
        """This row's result, under the backstop of the item's ``timeout`` marker.

        pytest-timeout arms its timers around the call phase only (``func_only``), and
        the wait is in setup, so the backstop (our own SIGALRM timer, the one
        ``EvalHooks.pytest_timeout_set_timer`` arms) is armed here for the same seconds.
        Not under a debugger, as pytest-timeout would not either.
        """
        marker = self.get_closest_marker("timeout")
        seconds = marker.args[0] if marker is not None and marker.args else None
        cancel = None
        debugging = self.config.option.usepdb or getattr(self.config.option, "trace", False)
        if seconds and not debugging:
            from pytest_osmosis.execution.executor import arm_backstop

            cancel = arm_backstop(float(seconds))
        try:
            return session.run_item(self)
        finally:
            if cancel is not None:
                cancel()

    def runtest(self) -> None:
        result = self.stash[RESULT_KEY]
        outcome, text, detail = pytest_verdict(result, self.source_row_index, self.run_index)
        if outcome == "skipped":
            raise pytest.skip.Exception(text, _use_item_location=True)
        if outcome == "xfailed":
            raise pytest.xfail.Exception(text)
        if outcome == "failed":
            raise RAISED_FOR[outcome](text, detail)

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, EvalFailure):
            failure = excinfo.value
            return f"{failure.headline}\n{failure.detail}".rstrip()
        return super().repr_failure(excinfo, style=style)

    def _repr_failure_py(  # type: ignore[override]  # a str, as repr_failure's (pytest takes both)
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        """What pytest shows for a setup error (an errored row): the row's own headline.

        pytest would otherwise render our frames with ``ast.parse`` on the main thread, only
        for describe_report to replace it, while the loop thread may be formatting a
        rollout's traceback: on Python 3.11 two threads parsing at once can end the session
        (``SystemError: AST constructor recursion depth mismatch``, CPython gh-106905).
        """
        if isinstance(excinfo.value, EvalFailure):
            return self.repr_failure(excinfo, style=style)
        return super()._repr_failure_py(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, 0, self.name


def how_to_run_the_others(config: pytest.Config, broken: Path) -> str:
    """pytest stops a session at a collection error; say how the other configs still run.

    (The official template ships a placeholder ``configs/eval/default.toml``, so a plain
    ``pytest --osmosis-eval`` there would otherwise run nothing, with no way out named.)
    """
    if config.option.continue_on_collection_errors:
        return ""
    from pytest_osmosis.plugin.discover import find_eval_configs, is_eval_config, named_paths

    session: EvalSession = config.stash[SESSION_KEY]
    named = named_paths(config)
    if session.collect_all:
        configs = find_eval_configs(config, named)
    else:
        configs = [p for p in named if is_eval_config(p) and p.is_file()]
    others = [p for p in configs if p != broken.resolve()]
    if not others:
        return ""
    base = config.invocation_params.dir
    shown = [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in others]
    more = f" (and {len(shown) - 3} more)" if len(shown) > 3 else ""
    return (
        f"to run the other configs, add --continue-on-collection-errors "
        f"or name them: pytest {' '.join(shown[:3])}{more}"
    )


def with_hint(message: str, hint: str) -> str:
    """``message; hint``, or the hint on a line of its own after a message of several lines
    (a traceback's last line is its source line: a hint there reads as code)."""
    if not hint:
        return message
    return f"{message.rstrip()}\n{hint}" if "\n" in message.strip() else f"{message}; {hint}"


def pytest_verdict(
    result: Mapping[str, Any], source_row: int, run_index: int
) -> tuple[str, str, str]:
    """An attempt's result as pytest reports it: (outcome, headline, detail).

    The outcome is :func:`outcome.pytest_outcome` of :func:`outcome.classify` (``passed``,
    ``failed`` for a reward below the threshold, ``error`` when the row could not be judged:
    the item's setup raises it, ``skipped``); the headline names the dataset row, as node
    ids do.
    """
    where = f"(row {source_row}, run {run_index})"
    resumed = (" [resumed]" if result.get("resumed") else "") + no_trajectory_text(result)
    threshold = result["pass_threshold"]
    verdict = classify(result, threshold)
    headline = ""
    detail = ""
    if verdict == SKIPPED:
        headline = f"{result.get('message') or 'sample removed'} {where}{resumed}"
    elif verdict == FAILED:
        # The rollout's own words: shown, never obeyed by a terminal or refused by an encoder.
        text = safe_text(f"{result.get('error_type') or 'failed'}: {result.get('message', '')}")
        headline = f"{text.rstrip(': ')} {where}{resumed}"
        detail = safe_text(str(result.get("detail") or ""))
    elif verdict == BELOW_THRESHOLD:
        text = f"reward {result['reward']:.2f} < pass_threshold {threshold:.2f}"
        headline = f"{text} {where}{resumed}"
    outcome = pytest_outcome(verdict)
    return outcome, headline if outcome != "passed" else "", detail


def properties_wanted(config: pytest.Config) -> bool:
    """Whether this session writes the rows' ``osmosis_*`` properties anywhere: JUnit XML.

    Only then are they made: pytest copies an item's ``user_properties`` onto its
    teardown report and keeps every report to the end of the session (~750 bytes a row,
    an eighth of a 100,000-row run's memory, for nobody). An xdist worker is told by its
    controller, which writes the XML (``osmosis_properties`` in its ``workerinput``).
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return bool(workerinput.get("osmosis_properties"))
    return bool(config.option.xmlpath)


def junit_properties(
    result: Mapping[str, Any], plan: EvalPlan, source_row: int, run_index: int
) -> list[tuple[str, Any]]:
    """``osmosis_*`` properties of an attempt's JUnit test case.

    The item's ``user_properties``: pytest's public way to give a test case properties
    (made only when JUnit XML is written: :func:`properties_wanted`).
    """
    properties: list[tuple[str, Any]] = [
        (f"osmosis_{key}", safe_text(value) if isinstance(value, str) else value)
        for key in ("reward", "pass_threshold", "error_type", "tokens")
        if (value := result.get(key)) is not None
    ]
    properties += [
        ("osmosis_duration_s", f"{row_seconds(result):.3f}"),
        ("osmosis_model", plan.settings.model_path),
        ("osmosis_dataset_row", source_row),
        ("osmosis_attempt", run_index),
    ]
    return properties + trajectory_property(plan.run_dir, result.get("rollout_id"))


def trajectory_property(run_dir: Path, rollout_id: str | None) -> list[tuple[str, Any]]:
    """``osmosis_trajectory``: the attempt's trajectory file, when the run directory has it.

    A worker on another host has none there (the controller writes its files), so the
    controller gives that row's report its property (``Controller.name_trajectory``).
    """
    if not rollout_id:
        return []
    from pytest_osmosis.results.index import CANONICAL_TRAJECTORY_FILENAME, TRIALS_DIRNAME

    trajectory = os.path.join(run_dir, TRIALS_DIRNAME, rollout_id, CANONICAL_TRAJECTORY_FILENAME)
    return [("osmosis_trajectory", trajectory)] if os.path.isfile(trajectory) else []


def row_seconds(result: Mapping[str, Any]) -> float:
    """The attempt's own duration: what its JUnit ``time`` and report durations say.

    Rows run ahead and overlap, so the time pytest measured while an item waited is not
    the row's (the first item would also carry the session's start-up).
    """
    return float(result.get("duration_ms") or 0.0) / 1000.0


def recorded_reports(
    nodeid: str, result: Mapping[str, Any], plan: EvalPlan, source_row: int, run_index: int
) -> list[pytest.TestReport]:
    """The reports of an attempt recorded by an earlier session, as its item would make them.

    Built without running pytest's protocol: a finished run's items are deselected
    (nothing runs), and these let ``--junitxml`` still list its rows with their recorded
    outcome and duration. An error is a failed setup report, as a running item makes it.
    """
    outcome: Any
    outcome, text, detail = pytest_verdict(result, source_row, run_index)
    path, _, name = nodeid.rpartition("::")
    location = (path, 0, name)
    longrepr: Any = None
    if outcome in ("failed", "error"):
        longrepr = f"{text}\n{detail}".rstrip()
    elif outcome == "skipped":
        longrepr = (path, 1, f"Skipped: {text}")
    duration = row_seconds(result)
    properties = junit_properties(result, plan, source_row, run_index)
    teardown = pytest.TestReport(
        nodeid, location, {}, "passed", None, "teardown", user_properties=properties
    )
    if outcome == "error":
        setup = pytest.TestReport(
            nodeid, location, {}, "failed", longrepr, "setup", duration=duration
        )
        return [setup, teardown]
    call = pytest.TestReport(nodeid, location, {}, outcome, longrepr, "call", duration=duration)
    return [call, teardown]


def _backstop_seconds(plan: EvalPlan, config: pytest.Config, grace: float) -> float | None:
    """Both budgets plus a grace, when both are bounded and SIGALRM exists."""
    import signal

    settings = plan.settings
    if settings.agent_timeout_s is None or settings.grader_timeout_s is None:
        return None
    if not hasattr(signal, "SIGALRM") or not config.pluginmanager.hasplugin("timeout"):
        return None
    return settings.agent_timeout_s + settings.grader_timeout_s + grace


SESSION_KEY = pytest.StashKey["EvalSession"]()
RESULT_KEY = pytest.StashKey[dict[str, Any]]()


def describe_report(item: EvalItem, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """Make an eval item's phase report say what the row did (runner process).

    The report of the phase that decided the row (setup for an error, else call)
    carries the result as ``report.osmosis`` (builtins: it crosses xdist to the
    controller, which journals it), the row's own duration, and its headline; the other
    phases take no time. pytest's JUnit writer sums the phases' ``report.duration``
    (``junit_duration_report = total``), so a test case's ``time`` is the row's own.
    """
    # What the rollout printed, as every surface shows it (pytest prints it on a failure).
    report.sections = [(title, safe_text(text)) for title, text in report.sections]
    result = item.stash.get(RESULT_KEY, None)
    if result is None:
        return
    if call.when == "call" or (call.when == "setup" and report.failed):
        session: EvalSession = item.config.stash[SESSION_KEY]
        report.osmosis = {  # type: ignore[attr-defined]
            **{k: v for k, v in result.items() if k != "exception"},
            "config": session.reported_config(item.parent.plan),
        }
        files = session.returned_files(result.get("rollout_id"))
        if files is not None:  # a worker on another host: the controller writes them
            report.osmosis_files = files  # type: ignore[attr-defined]
        report.duration = row_seconds(result)
        # pytest renders a setup failure as a traceback; the row's headline is the news.
        if call.excinfo is not None and isinstance(call.excinfo.value, EvalFailure):
            report.longrepr = item.repr_failure(call.excinfo)
        # The item's list (junitxml reads it from the teardown report); ours replaced, not
        # added again, when pytest-rerunfailures runs the item once more.
        if session.properties:
            item.user_properties[:] = [
                prop for prop in item.user_properties if not str(prop[0]).startswith("osmosis_")
            ] + junit_properties(result, item.parent.plan, item.source_row_index, item.run_index)
    else:
        report.duration = 0.0
        if call.when == "teardown":  # the row is reported: an item keeps none of its result
            del item.stash[RESULT_KEY]


def crashed_status(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """A row whose xdist worker died is an error, as every other row that was not judged.

    xdist reports it in no phase (``when == "???"``), which JUnit writes as ``<error>``
    but pytest's terminal would count as failed; the controller recorded it
    ``worker_crashed`` (``report.osmosis``) before the terminal asks.
    """
    if str(report.when) == "???" and report.failed and getattr(report, "osmosis", None):
        return "error", "E", "ERROR"
    return None
