"""The plan before spending: what each config is about to run, and an optional prompt.

``osmosis eval run`` prints a table before it starts (rollout, entrypoint, model,
dataset, rows, runs per row, work items, output) and asks before dispatching. We print
the same facts, plus what a pytest session decides on top (attempts, concurrency, budgets,
pass threshold, cache mode, the run name and whether it resumes), with
``--osmosis-plan`` (then stop), under ``--collect-only``, and before the prompt of
``--osmosis-confirm``. Printing the plan calls no model and creates no run directory: it
reads the TOML, the dataset and an existing run's manifest and journal, nothing more.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.core.errors import OsmosisError

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import EvalSession
    from pytest_osmosis.workspace.plan import EvalPlan


@dataclass
class ConfigPlan:
    """One config's plan, as printed."""

    config: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    pending: int = 0
    model: str = ""
    #: What the run itself would stop with (exit 4): a recorded run it cannot resume.
    refused: OsmosisError | None = None


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g} s"


def _shown(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _run_state(
    session: EvalSession, plan: EvalPlan, inputs: dict[str, Any]
) -> tuple[str, int, OsmosisError | None]:
    """Whether the run is new, resumes (and how much is recorded) or would be refused
    (with what the run would stop with); and how many work items would run."""
    from pytest_osmosis.core.outcome import is_retried
    from pytest_osmosis.plugin.controller import run_keys
    from pytest_osmosis.results import describe_changed_inputs, read_journal
    from pytest_osmosis.results.manifest import (
        MANIFEST_FILENAME,
        changed_inputs_error,
        read_manifest,
    )

    keys = run_keys(plan)
    manifest_path = plan.run_dir / MANIFEST_FILENAME
    if not manifest_path.is_file():
        return "new run", len(keys), None
    if session.options.fresh:
        return "exists: --osmosis-fresh archives it and starts a new one", len(keys), None
    try:
        manifest = read_manifest(manifest_path)
    except OsmosisError as exc:
        return f"cannot resume: {exc}", 0, exc
    refused = changed_inputs_error(plan.run_name, plan.output_root, manifest["inputs"], inputs)
    if refused is not None:
        changed = ", ".join(describe_changed_inputs(manifest["inputs"], inputs))
        return f"would be refused: made with different inputs (changed: {changed})", 0, refused
    try:
        records = read_journal(plan.run_dir)
    except OsmosisError as exc:
        return f"cannot resume: {exc}", 0, exc
    retry = session.options.retry_failed
    below = session.options.retry_below(plan)
    pending = [
        key for key in keys if key not in records or (retry and is_retried(records[key], below))
    ]
    recorded = len(keys) - len(pending) if not retry else len(records)
    if not pending:
        return f"finished earlier: all {len(keys)} recorded, nothing runs", 0, None
    retried = sum(1 for key in pending if key in records)
    again = f" ({retried} retried)" if retried else ""
    return f"resumes: {recorded} recorded, {len(pending)} to run{again}", len(pending), None


def _expected_hits(session: EvalSession, plan: EvalPlan, mode: str) -> str:
    """What the model-call cache will answer: work items it holds answers of (use, replay)."""
    if mode not in ("use", "replay"):
        return ""
    from pytest_osmosis.model.cache import answered_attempts, attempt_id, cache_path, row_id

    answered = answered_attempts(
        cache_path(plan.output_root), plan.settings.model_path, session.options.cache_max_age_s
    )
    dataset, name = plan.dataset, plan.config.experiment.dataset
    hits = sum(
        attempt_id(row_id(name, dataset.source_row_index(index)), attempt) in answered
        for index in range(len(dataset))
        for attempt in range(plan.settings.n)
    )
    return f", expected hits: answers recorded for {hits} of {plan.total_items} work items"


def plan_config(
    session: EvalSession, config: pytest.Config, path: Path, several: bool
) -> ConfigPlan:
    """The rows of one config's plan; an error becomes the plan's one line."""
    from pytest_osmosis.plugin.planning import utc_now
    from pytest_osmosis.workspace.plan import choose_run_name, other_named_run, run_inputs

    base = config.invocation_params.dir
    shown = ConfigPlan(_shown(path, base))
    opened = session.runs.get(path)
    try:
        plan = session.plans.plan_for(path)
        if opened is None:  # an opened run (--osmosis-confirm) has its name and state
            inputs = run_inputs(plan)
            if session.regrade is not None:
                session.regrade.check_inputs(inputs, path)
                inputs = session.regrade.regrade_inputs(inputs)
            plan.run_name = choose_run_name(plan, session.options.name, inputs, utc_now(), several)
            if session.regrade is not None:
                session.regrade.check_target(plan.run_dir)
        session.rollouts.load(plan)
        session.rollouts.warn_loaded(plan)
    except OsmosisError as exc:
        # Collection reports it too, as open_runs would have kept it (a rollout imported a
        # second time may not fail the same way).
        session.plans.errors[path] = exc
        shown.rows.append(("error", str(exc)))
        return shown
    settings, experiment, dataset = plan.settings, plan.config.experiment, plan.dataset
    if opened is None:
        state, pending, shown.refused = _run_state(session, plan, inputs)
    else:
        pending = opened.pending_at_start
        recorded = len(opened.rundir.records)
        state = "new run" if opened.created else f"resumes: {recorded} recorded, {pending} to run"
    shown.pending, shown.model = pending, settings.model_path
    rows = shown.rows
    rows.append(("rollout", f"{experiment.rollout} ({experiment.entrypoint})"))
    rows.append(("model", settings.model_path))
    rows.append(("dataset", f"{experiment.dataset} ({_shown(dataset.path, base)})"))
    rows.append(("rows", f"{len(dataset)} of {dataset.total_dataset_rows} ({dataset.selector})"))
    rows.append(("attempts (n)", str(settings.n)))
    items = f"{plan.total_items}"
    if plan.shard is not None:
        items = f"{len(plan.work_keys())} of {plan.total_items}, {plan.shard}"
    rows.append(("work items", f"{items} ({pending} to run)"))
    rows.append(("concurrency", str(session.total_concurrency())))
    rows.append(("execution", session.rollouts.execution_text(plan)))
    rows.append(
        (
            "budgets",
            f"workflow {_seconds(settings.agent_timeout_s)}, "
            f"grader {_seconds(settings.grader_timeout_s)}",
        )
    )
    rows.append(("pass threshold", f"{settings.pass_threshold:g}"))
    gate = session.options.gate.values
    if gate.get("max_regression") is not None:
        from pytest_osmosis.gate import power_lines

        # Before the baseline is read: its rows in common are at most this run's.
        for line in power_lines(gate, len(dataset), settings.n, 0.5):
            rows.append(("gate", line))
    cache = session.options.cache_mode  # checked: "REPLAY" or " use " as their mode
    rows.append(("cache", cache + _expected_hits(session, plan, cache)))
    note = other_named_run(plan, session.options.name, several)
    rows.append(("run", f"{plan.run_name} ({state}{'; ' + note if note else ''})"))
    rows.append(("output", _shown(plan.run_dir, base)))
    if session.regrade is not None:
        rows.append(
            ("regrades", f"run {session.regrade.name!r}: the grader only, no workflow runs")
        )
    return shown


def _write(config: pytest.Config, plans: list[ConfigPlan]) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    lines: list[str] = []
    for shown in plans:
        lines.append(f"osmosis plan: {shown.config}")
        width = max((len(label) for label, _ in shown.rows), default=0)
        lines += [
            f"  {label.ljust(width)}  " + value.replace("\n", "\n" + " " * (width + 4))
            for label, value in shown.rows  # a traceback's lines stay inside their entry
        ]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)


def show_plan(session: EvalSession, config: pytest.Config, configs: list[Path]) -> str | None:
    """Print every config's plan. Under ``--osmosis-plan`` the line the session then stops
    with, nothing run (exit 0); a config that cannot run, or a recorded run the real one
    would refuse to resume, is a usage error (exit 4; the latter with the run's own line)."""
    if not session.options.plan and config.option.verbose < -1:
        return None  # `--co -qq`: the bare list of node ids tools read, nothing else
    several = len(configs) > 1
    plans = [plan_config(session, config, path.resolve(), several) for path in configs]
    _write(config, plans)
    if not session.options.plan:
        return None
    broken = sum(1 for shown in plans if any(label == "error" for label, _ in shown.rows))
    if broken:
        raise pytest.UsageError(
            f"--osmosis-plan: {broken} of {len(plans)} config(s) cannot run "
            "(the error is in their plan); nothing ran"
        )
    refused = next((shown.refused for shown in plans if shown.refused is not None), None)
    if refused is not None:  # the one line the run would stop with (the first config's)
        raise pytest.UsageError(str(refused))
    return "osmosis: --osmosis-plan: nothing ran (no model call, no run directory)"


def confirm(session: EvalSession, config: pytest.Config) -> str | None:
    """``--osmosis-confirm``: show the plan and ask before the first model call.

    Asked only when stdin is a terminal (a CI job or a pipe goes on, as with
    ``--yes``). Declining removes the run directories this session created; the line
    returned is what the session stops with (exit 2, as an interrupt before any row).
    """
    runs = list(session.runs.values())
    pending = sum(run.pending_at_start for run in runs)
    if not runs or pending == 0:
        return None
    with _terminal(config) as interactive:
        if not interactive:
            return None
        paths = [run.plan.config_path for run in runs]
        _write(config, [plan_config(session, config, path, len(paths) > 1) for path in paths])
        models = sorted({run.plan.settings.model_path for run in runs})
        sys.stdout.write(f"osmosis: run {pending} work items with {', '.join(models)}? [y/N] ")
        sys.stdout.flush()
        try:
            with open(0, closefd=False) as stdin:  # noqa: PTH123 - fd 0, not a path
                answer = stdin.readline()
        except (OSError, KeyboardInterrupt):
            answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return None
    session.abandon_runs()
    session.close()
    return "osmosis: not started (declined at the prompt)"


@contextlib.contextmanager
def _terminal(config: pytest.Config) -> Iterator[bool]:
    """pytest's capture set aside (it puts /dev/null on fd 0); whether stdin is a terminal."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    try:
        try:
            interactive = os.isatty(0)
        except OSError:
            interactive = False
        yield interactive
    finally:
        if capture is not None:
            capture.resume_global_capture()
