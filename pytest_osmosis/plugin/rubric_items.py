"""Rubric checks as pytest items: ``pytest --osmosis-rubric DATA.jsonl ...``.

Each record x run of the JSONL file becomes one item that passes when the judge's score
reaches ``--osmosis-min-score``, so rubric checks get pytest's selection (``-k``,
``--lf``), xdist, junitxml and its exit status. The input rules and the judge are those
of ``pytest-osmosis rubric`` (`pytest_osmosis.rubric.command`, `pytest_osmosis.rubric.judge`).

As in eval sessions, the judge calls of the items this process will run are started
ahead on one background loop (at most 8 in flight); an item only waits for its own.

This module is a pytest plugin of its own (hooks at the bottom), registered by
``plugin/__init__.py`` only when ``--osmosis-rubric`` (or its ini twin) is given; the options
themselves, and how their values are read (`rubric_value`), live in ``plugin/options.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.plugin.options import rubric_option, rubric_value

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from pytest_osmosis.execution.executor import Executor
    from pytest_osmosis.rubric.command import RubricRecord
    from pytest_osmosis.rubric.judge import RubricJudge

__all__ = [
    "RubricFile",
    "RubricItem",
    "collect_rubric_file",
    "configure_rubric",
]


@dataclass(frozen=True)
class RubricSettings:
    data: Path
    judge: RubricJudge
    min_score: float
    n: int


def _number(config: pytest.Config, dest: str, default: float | None) -> tuple[float, str]:
    opt = rubric_option(dest)
    entry = rubric_value(config, opt)
    if entry is None:
        if default is None:
            raise pytest.UsageError(f"--osmosis-rubric needs {opt.flag} (or ini {opt.ini})")
        return default, opt.ini
    text, _, where = entry
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise pytest.UsageError(f"{where}: expected a finite number, got {text!r}")
    return value, where


def _settings(config: pytest.Config) -> RubricSettings | None:
    from pytest_osmosis.core.errors import OsmosisError

    data_entry = rubric_value(config, rubric_option("rubric"))
    if data_entry is None:
        return None
    data_text, data_base, data_where = data_entry
    data = (data_base / Path(data_text).expanduser()).resolve()
    if not data.is_file():
        what = "is a directory" if data.is_dir() else "does not exist"
        raise pytest.UsageError(f"{data_where} {data_text}: data file {data} {what}")
    text_option, model_option = rubric_option("rubric_text"), rubric_option("judge_model")
    rubric_entry = rubric_value(config, text_option)
    model_entry = rubric_value(config, model_option)
    for entry, opt in ((rubric_entry, text_option), (model_entry, model_option)):
        if entry is None:
            raise pytest.UsageError(f"--osmosis-rubric needs {opt.flag} (or ini {opt.ini})")
    assert rubric_entry is not None and model_entry is not None
    min_score, min_where = _number(config, "min_score", None)
    score_min, _ = _number(config, "rubric_score_min", 0.0)
    score_max, _ = _number(config, "rubric_score_max", 1.0)
    n_value, n_where = _number(config, "rubric_n", 1.0)
    if n_value < 1 or not n_value.is_integer():
        raise pytest.UsageError(f"{n_where}: expected a whole number >= 1, got {n_value:g}")
    if not score_min <= min_score <= score_max:
        raise pytest.UsageError(
            f"{min_where}: {min_score:g} is outside the score range "
            f"[{score_min:g}, {score_max:g}]"
        )
    from pytest_osmosis.rubric.command import resolve_rubric_text
    from pytest_osmosis.rubric.judge import RubricJudge

    try:
        rubric = resolve_rubric_text(rubric_entry[0], rubric_entry[1])
        judge = RubricJudge(rubric, model_entry[0], score_min=score_min, score_max=score_max)
    except OsmosisError as exc:
        raise pytest.UsageError(f"--osmosis-rubric: {exc}") from None
    return RubricSettings(data=data, judge=judge, min_score=min_score, n=int(n_value))


class RubricRun:
    """Per-process state: settings, the background loop, and which items started ahead."""

    def __init__(self, settings: RubricSettings, *, is_worker: bool) -> None:
        self.settings = settings
        self.is_worker = is_worker
        self.collected = False
        self._executor: Executor | None = None
        self._prefetched = False

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            from pytest_osmosis.execution.executor import Executor
            from pytest_osmosis.rubric.command import CONCURRENCY

            self._executor = Executor(CONCURRENCY)
        return self._executor

    def result(self, item: RubricItem) -> dict[str, Any]:
        """The judge's verdict for `item` (started ahead when this process runs everything)."""
        if not self._prefetched:
            self._prefetched = True
            # An xdist worker cannot know which items it will be sent: judge only its own.
            if not self.is_worker:
                for other in item.session.items:
                    if isinstance(other, RubricItem):
                        self.executor.submit(other.nodeid, other.judge_factory())
        outcome: dict[str, Any] = self.executor.result(item.nodeid, item.judge_factory())
        return outcome

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None


_RUN_KEY = pytest.StashKey[RubricRun]()


def configure_rubric(config: pytest.Config) -> None:
    """Turn rubric collection on when ``--osmosis-rubric`` (or its ini twin) is set."""
    settings = _settings(config)
    if settings is None:
        return
    config.stash[_RUN_KEY] = RubricRun(settings, is_worker=hasattr(config, "workerinput"))
    base = config.invocation_params.dir
    for arg in config.args:
        target = (base / arg.split("::", 1)[0]).resolve()
        if target == settings.data or (target.is_dir() and settings.data.is_relative_to(target)):
            return
    # The data file may sit outside testpaths or the paths given: collect it anyway.
    config.args.append(str(settings.data))


def collect_rubric_file(file_path: Path, parent: pytest.Collector) -> RubricFile | None:
    """``pytest_collect_file``: the ``--osmosis-rubric`` data file becomes a `RubricFile`."""
    run = parent.config.stash.get(_RUN_KEY, None)
    if run is None or file_path.resolve() != run.settings.data:
        return None
    run.collected = True
    return RubricFile.from_parent(parent, path=file_path)


class RubricFile(pytest.File):
    """The JSONL data file: one item per record and run."""

    records: list[RubricRecord]

    def collect(self) -> Iterator[RubricItem]:
        from pytest_osmosis.core.errors import OsmosisError
        from pytest_osmosis.rubric.command import load_records

        run = self.config.stash[_RUN_KEY]
        try:
            self.records = load_records(self.path)
        except OsmosisError as exc:
            raise self.CollectError(str(exc)) from None
        for position, record in enumerate(self.records):
            for run_index in range(run.settings.n):
                item = RubricItem.from_parent(
                    self,
                    name=f"record_{record.index}_run_{run_index}",
                    position=position,
                    run_index=run_index,
                )
                if record.record_id:
                    item.extra_keyword_matches.add(record.record_id)
                yield item


class RubricFailure(Exception):
    """An item whose score is below the minimum, or whose judge call failed."""

    def __init__(self, headline: str, detail: str = "") -> None:
        super().__init__(headline)
        self.headline = headline
        self.detail = detail


class RubricItem(pytest.Item):
    """One (record, run): passes when the judge's score reaches ``--osmosis-min-score``."""

    parent: RubricFile

    def __init__(self, *, position: int, run_index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.position = position
        self.run_index = run_index

    @property
    def record(self) -> RubricRecord:
        return self.parent.records[self.position]

    def judge_factory(self) -> Any:
        """A coroutine factory returning builtins: ``{"score", "explanation"}`` or ``{"error"}``."""
        judge = self.config.stash[_RUN_KEY].settings.judge
        record = self.record

        async def run() -> dict[str, Any]:
            from pytest_osmosis.rubric.judge import JudgeError, one_line

            try:
                verdict = await record.judged_by(judge)
            except JudgeError as exc:
                return {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one line per item, never a traceback
                return {"error": f"{type(exc).__name__}: {one_line(str(exc))}"}
            return {"score": verdict.score, "explanation": verdict.explanation}

        return run

    def runtest(self) -> None:
        run = self.config.stash[_RUN_KEY]
        outcome = run.result(self)
        where = f"({self.record.label}, run {self.run_index})"
        if "error" in outcome:
            self.user_properties.append(("osmosis_judge_error", outcome["error"]))
            raise RubricFailure(f"judge error: {outcome['error']} {where}")
        score, explanation = outcome["score"], outcome["explanation"]
        minimum = run.settings.min_score
        self.user_properties.append(("osmosis_score", score))
        self.user_properties.append(("osmosis_min_score", minimum))
        self.user_properties.append(("osmosis_explanation", explanation))
        if score < minimum:
            raise RubricFailure(
                f"score {score:.2f} < min_score {minimum:.2f} {where}",
                f"judge: {' '.join(explanation.split())}",
            )

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, RubricFailure):
            failure = excinfo.value
            return f"{failure.headline}\n{failure.detail}".rstrip()
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.name}"


# ---------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    configure_rubric(config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> RubricFile | None:
    return collect_rubric_file(file_path, parent)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say so when the data file was never reached (``--ignore``, ``norecursedirs``)."""
    run = session.config.stash.get(_RUN_KEY, None)
    if run is not None and not run.collected:
        raise pytest.UsageError(
            f"--osmosis-rubric {run.settings.data}: the file was not collected "
            "(excluded by --ignore or norecursedirs?); name it on the command line"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash.get(_RUN_KEY, None)
    if run is not None:
        run.close()
