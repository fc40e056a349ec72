"""Collection: an eval TOML becomes one pytest item per (dataset row, attempt).

Items hold only indices; the row is read from the dataset when the item runs, so a
100,000-row dataset collects quickly. Node ids name the dataset's own row
(``row_<source row>_run_<attempt>``), so they do not change with ``-n``, ``--osmosis-limit``
or the concurrency, and ``--lf``, ``--deselect`` and ``-k row_7_`` keep working.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.errors import OsmosisError
from pytest_osmosis.outcome import BELOW_THRESHOLD, FAILED, SKIPPED, classify

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from pytest_osmosis.session import EvalSession
    from pytest_osmosis.workspace.plan import EvalPlan


class EvalFailure(Exception):
    """A row that did not pass: low reward, or a workflow/grader error."""

    def __init__(self, headline: str, detail: str = "") -> None:
        super().__init__(headline)
        self.headline = headline
        self.detail = detail


class EvalConfigFile(pytest.File):
    """``configs/eval/<name>.toml``: yields one item per selected row and attempt."""

    plan: EvalPlan

    def collect(self) -> Iterator[EvalItem]:
        session: EvalSession = self.config.stash[SESSION_KEY]
        try:
            plan = session.plan_for(self.path)
            session.load_rollout(plan)
        except OsmosisError as exc:
            hint = _how_to_run_the_others(self.config, self.path)
            raise self.CollectError(f"{exc}{hint}") from None
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
        backstop = _backstop_seconds(plan, self.config)
        if backstop is not None:
            # pytest-timeout catches code that blocks the loop (where our budgets cannot
            # fire). Signal method only: the thread method kills the process and its results.
            self.add_marker(pytest.mark.timeout(backstop, method="signal", func_only=True))
        sources = plan.dataset.selected_source_rows
        n = plan.settings.n
        for row_index, source in enumerate(sources):
            for run_index in range(n):
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
        session: EvalSession = self.config.stash[SESSION_KEY]
        session.start_ahead(self)

    def runtest(self) -> None:
        session: EvalSession = self.config.stash[SESSION_KEY]
        result = session.run_item(self)
        self.stash[RESULT_KEY] = result
        outcome, text, detail = pytest_verdict(result, self.source_row_index, self.run_index)
        if outcome == "skipped":
            raise pytest.skip.Exception(text, _use_item_location=True)
        if result["status"] == "failed" and self.config.option.usepdb and result.get("exception"):
            raise result["exception"]  # --pdb: post-mortem in the rollout's own frames
        if outcome == "failed":
            raise EvalFailure(text, detail)

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, EvalFailure):
            failure = excinfo.value
            return f"{failure.headline}\n{failure.detail}".rstrip()
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, 0, self.name


def _how_to_run_the_others(config: pytest.Config, broken: Path) -> str:
    """pytest stops a session at a collection error; say how the other configs still run.

    (The official template ships a placeholder ``configs/eval/default.toml``, so a plain
    ``pytest --osmosis-eval`` there would otherwise run nothing, with no way out named.)
    """
    if config.option.continue_on_collection_errors:
        return ""
    from pytest_osmosis.discover import find_eval_configs
    from pytest_osmosis.plugin import _named_paths, is_eval_config

    session: EvalSession = config.stash[SESSION_KEY]
    named = _named_paths(config)
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
        f"; to run the other configs, add --continue-on-collection-errors "
        f"or name them: pytest {' '.join(shown[:3])}{more}"
    )


def pytest_verdict(
    result: Mapping[str, Any], source_row: int, run_index: int
) -> tuple[str, str, str]:
    """An attempt's result as pytest reports it: (outcome, headline, detail).

    The one mapping from :func:`outcome.classify` to pytest's outcomes: ``passed``,
    ``failed`` (an error or a reward below the threshold), ``skipped``; the headline names
    the dataset row, as node ids do.
    """
    where = f"(row {source_row}, run {run_index})"
    resumed = " [resumed]" if result.get("resumed") else ""
    threshold = result["pass_threshold"]
    verdict = classify(result, threshold)
    if verdict == SKIPPED:
        return "skipped", f"{result.get('message') or 'sample removed'} {where}{resumed}", ""
    if verdict == FAILED:
        headline = f"{result.get('error_type') or 'failed'}: {result.get('message', '')}"
        return "failed", f"{headline.rstrip(': ')} {where}{resumed}", result.get("detail", "")
    if verdict == BELOW_THRESHOLD:
        headline = f"reward {result['reward']:.2f} < pass_threshold {threshold:.2f}"
        return "failed", f"{headline} {where}{resumed}", ""
    return "passed", "", ""


def junit_properties(result: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``osmosis_*`` properties of an attempt's JUnit test case."""
    return [
        (f"osmosis_{key}", result[key])
        for key in ("reward", "pass_threshold", "error_type", "tokens")
        if result.get(key) is not None
    ]


def recorded_reports(
    nodeid: str, result: Mapping[str, Any], source_row: int, run_index: int
) -> list[pytest.TestReport]:
    """Call and teardown reports of an attempt recorded by an earlier session.

    What a replayed item would report, built without running pytest's protocol: a
    finished run's items are deselected (nothing runs), and these let ``--junitxml``
    still list its rows with their recorded outcome and duration.
    """
    outcome: Any
    outcome, text, detail = pytest_verdict(result, source_row, run_index)
    path, _, name = nodeid.rpartition("::")
    location = (path, 0, name)
    longrepr: Any = None
    if outcome == "failed":
        longrepr = f"{text}\n{detail}".rstrip()
    elif outcome == "skipped":
        longrepr = (path, 1, f"Skipped: {text}")
    duration = float(result.get("duration_ms") or 0.0) / 1000.0
    properties = junit_properties(result)
    return [
        pytest.TestReport(nodeid, location, {}, outcome, longrepr, "call", duration=duration),
        pytest.TestReport(
            nodeid, location, {}, "passed", None, "teardown", user_properties=properties
        ),
    ]


def _backstop_seconds(plan: EvalPlan, config: pytest.Config) -> float | None:
    """Both budgets plus a grace, when both are bounded and SIGALRM exists."""
    import signal

    settings = plan.settings
    if settings.agent_timeout_s is None or settings.grader_timeout_s is None:
        return None
    if not hasattr(signal, "SIGALRM") or not config.pluginmanager.hasplugin("timeout"):
        return None
    try:
        grace = float(config.getini("osmosis_backstop_grace") or 30)
    except ValueError:
        raise pytest.UsageError("osmosis_backstop_grace: must be a number of seconds") from None
    return settings.agent_timeout_s + settings.grader_timeout_s + grace


SESSION_KEY = pytest.StashKey["EvalSession"]()
RESULT_KEY = pytest.StashKey[dict[str, Any]]()
