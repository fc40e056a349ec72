"""Planning: each config's ``EvalPlan``, built once per process, and the configs that failed.

The controller names the runs (``choose_run_name``) and sends the names to xdist workers,
which plan the same configs under those names. ``--osmosis-reuse`` is read here too: it
is decided per plan, before the run directory exists.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.core.errors import OsmosisError, RunDirectoryError
from pytest_osmosis.workspace.plan import (
    EvalPlan,
    Overrides,
    build_plan,
    choose_run_name,
    run_inputs,
)

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import SessionOptions
    from pytest_osmosis.results import RunDirectory, RunLog
    from pytest_osmosis.results.reuse import ReuseSource
    from pytest_osmosis.results.source_run import SourceRun


def utc_now() -> datetime:
    """Now, in UTC: the time in a generated run name (``choose_run_name``)."""
    return datetime.now(timezone.utc)


class Plans:
    """The plans of one process, by resolved config path, and why a config had none."""

    def __init__(
        self,
        config: pytest.Config,
        options: SessionOptions,
    ) -> None:
        self.config = config
        self.options = options
        self.regrade: SourceRun | None = None
        """``--osmosis-regrade``: the run graded again, whose rows, attempts and model the
        plans take (``overrides``); the session sets it (``EvalSession.regrade``)."""
        self.plans: dict[Path, EvalPlan] = {}
        self.errors: dict[Path, OsmosisError] = {}
        self.run_names: dict[str, str] = {}  # config path -> run name (the controller's)

    def plan_for(self, path: Path) -> EvalPlan:
        """The plan for one config (built once per process); raises our own errors."""
        path = path.resolve()
        if path in self.errors:
            raise self.errors[path]
        if path not in self.plans:
            try:
                plan = self.build(path)
            except OsmosisError as exc:
                self.errors[path] = exc
                raise
            from pytest_osmosis.plugin.redaction import add_named_secrets

            add_named_secrets(self.config, plan.config.secrets.required)
            plan.run_name = self.run_names.get(str(path), "")
            if not plan.run_name:
                inputs = run_inputs(plan)
                plan.run_name = choose_run_name(plan, self.options.name, inputs, utc_now(), False)
            self.plans[path] = plan
        return self.plans[path]

    def build(self, path: Path) -> EvalPlan:
        plan = build_plan(
            path, self.overrides(), self.options.output, rollout_dir=self.options.rollout_dir
        )
        plan.shard = self.options.shard
        return plan

    def overrides(self) -> Overrides:
        """The plan's overrides: the options', and under a regrade the regraded run's rows,
        attempts and model."""
        if self.regrade is None:
            return self.options.overrides
        return self.regrade.overrides(self.options.overrides)

    def close(self) -> None:
        """The session ends: every plan's dataset lets go of the file it reads rows from."""
        for plan in self.plans.values():
            plan.dataset.close()

    def plan_errors(self) -> list[tuple[Path, OsmosisError]]:
        """The configs that could not be planned, and why (collection reports them)."""
        return list(self.errors.items())


def reuse_source(
    options: SessionOptions, plan: EvalPlan, inputs: dict[str, Any]
) -> ReuseSource | None:
    """``--osmosis-reuse RUN``, read before the run directory is made (one line if bad)."""
    if not options.reuse:
        return None
    from pytest_osmosis.results.reuse import open_reuse_source
    from pytest_osmosis.results.runs import resolve_run

    path = resolve_run(options.reuse, plan.output_root)
    if path.resolve() == plan.run_dir.resolve():
        raise RunDirectoryError(
            f"--osmosis-reuse {options.reuse}: is this run ({plan.run_name}) itself"
        )
    return open_reuse_source(
        path,
        inputs,
        plan.dataset.sha256,
        plan.row_digests(),
        plan.dataset.selected_source_rows,
    )


def reuse(
    options: SessionOptions,
    plan: EvalPlan,
    rundir: RunDirectory,
    source: ReuseSource | None,
    log: RunLog,
) -> tuple[int, str]:
    """Record the pending items ``source`` has unchanged; (how many, what to say)."""
    if source is None:
        return 0, ""
    from pytest_osmosis.results.reuse import reuse_into, take

    if source.differs:
        verb = "differs" if len(source.differs) == 1 else "differ"
        note = f"nothing reused from run {source.name!r}: {', '.join(source.differs)} {verb}"
        log.warning("reuse", note)
        return 0, note
    records = take(
        source,
        sorted(rundir.pending(plan.work_keys())),
        plan.row_digests(),
        plan.dataset.selected_source_rows,
        retry_failed=options.retry_failed,
        retry_below=options.retry_below(plan),
        recorded={record["rollout_id"] for record in rundir.records.values()},
    )
    reuse_into(source, rundir.path, records)
    rundir.extend(records, reused=True)
    log.write("info", "reuse", f"{len(records)} work items reused from run {source.name!r}")
    return len(records), f"from run {source.name!r}"
