"""Per-process state of an eval session: plans, the loop, the bridges, and (on the
controller) the run directories.

Roles: without xdist one process is both runner and controller. Under xdist the
controller plans and owns the run directories but never collects or runs items; the
workers collect, run items, and send each result to the controller on the test report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pytest_osmosis.core import outcome
from pytest_osmosis.core.errors import (
    ModelPreflightError,
    OsmosisError,
    RunDirectoryError,
    SessionFaultError,
)
from pytest_osmosis.core.words import one_line
from pytest_osmosis.execution import blame
from pytest_osmosis.execution.dispatch import AUTO, IN_PROCESS, SERVER, Dispatch, InProcess
from pytest_osmosis.execution.executor import (
    FDS_PER_ROW,
    BackstopExpired,
    Executor,
    arm_backstop,
    fd_capacity,
    raise_fd_limit,
)
from pytest_osmosis.execution.runner import Budgets, TrajectoryWriter, WorkItem
from pytest_osmosis.execution.streams import keep_streams_open, let_streams_close
from pytest_osmosis.workspace.loader import (
    DEFAULT_MAIN_TIMEOUT,
    forget_loaded,
    load_rollout,
)
from pytest_osmosis.workspace.plan import (
    EvalPlan,
    Overrides,
    build_plan,
    choose_run_name,
    run_inputs,
    run_provenance,
    utc_now,
    workspace_warnings,
)

if TYPE_CHECKING:
    from pytest_osmosis.dataset.shard import Shard
    from pytest_osmosis.gate import GateOptions, Verdict
    from pytest_osmosis.model.bridge import Bridge
    from pytest_osmosis.model.cache import CallCache
    from pytest_osmosis.plugin.budget import Budget, Tickets
    from pytest_osmosis.plugin.collect import EvalItem
    from pytest_osmosis.plugin.milestones import Milestones
    from pytest_osmosis.results import RunDirectory, RunLog
    from pytest_osmosis.results.reuse import ReuseSource
    from pytest_osmosis.results.source_run import SourceRun


@dataclass
class SessionOptions:
    """The plugin's own options after command line > ini merging."""

    overrides: Overrides
    output: Path | None
    name: str | None
    fresh: bool
    retry_failed: bool
    concurrency: int | None
    workflow_override: str | None
    grader_override: str | None
    gate: GateOptions
    report: bool = False
    secrets_file: str | None = None
    main_timeout: float = DEFAULT_MAIN_TIMEOUT
    cache_mode: str = "off"
    """The model-call cache (model/cache.py): off, use, record or replay."""
    cache_max_age_s: float | None = None
    # Regrade and plan (regrade.py, preview.py)
    regrade: str | None = None
    rollout_dir: Path | None = None
    plan: bool = False
    confirm: bool = False
    # How rollouts run (execution/dispatch.py): in-process, server or auto.
    execution: str = AUTO
    server_python: str | None = None
    """Run rollout servers on this interpreter instead of a synced environment."""
    server_start_timeout: float = 90.0
    shard: Shard | None = None
    """``--osmosis-shard K/N``: run that share of every config's work items (shard.py)."""
    reuse: str | None = None
    """``--osmosis-reuse RUN``: record unchanged items from that run (results/reuse.py)."""
    upload: str | None = None
    """``--osmosis-upload``: on-pass or always, after the gate (upload.py)."""
    retry_below_threshold: bool = False
    """``--osmosis-retry-below-threshold``: low rewards run again too (implies retry_failed)."""
    remote_root: str | None = None
    """``--osmosis-remote-root``: the workspace root on xdist's ssh workers' hosts."""

    def retry_below(self, plan: EvalPlan) -> float | None:
        """The threshold below which a recorded attempt is retried; None: low rewards stay."""
        return plan.settings.pass_threshold if self.retry_below_threshold else None


@dataclass
class ControllerRun:
    """A run directory the controller writes, and what it has seen this session."""

    plan: EvalPlan
    rundir: RunDirectory
    log: RunLog
    started_at: Any
    pending_at_start: int = 0
    #: Pending work items this session selected to run (after -k, --deselect, ...), and
    #: those of them an earlier session recorded (re-run by --osmosis-retry-failed).
    to_run: int | None = None
    rerun: set[tuple[int, int]] = field(default_factory=set)
    #: (node id, key) of recorded items a finished run deselected, for --junitxml.
    recorded_items: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    executed: int = 0
    rate_limited: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    report_path: Path | None = None
    report_error: str | None = None
    index_path: Path | None = None
    created: bool = False
    """This session made the run directory (removed again if the preflight fails)."""
    cache_calls: int = 0
    """Model calls this session's rows made through the model-call cache..."""
    cache_hits: int = 0
    """...and how many of them it answered."""
    storage_fault: str | None = None
    """Why the run directory took no more results (a full disk, deleted): nothing more is
    written there, not even the final snapshots."""
    costs: dict[str, float | None] = field(default_factory=dict)
    """Rollout id -> dollars, of the attempts this session recorded (None: no price)."""
    row_metrics: dict[str, Any] = field(default_factory=dict)
    """``osmosis_metrics.json`` as written at the end (results/row_metrics.py)."""
    execution: str = ""
    """How its rows run, and why (``EvalSession.execution_text``)."""
    no_trajectory: list[str] = field(default_factory=list)
    """This session's rows recorded without a trajectory, and why ("row 1 run 0: ...")."""
    reused: int = 0
    """Work items ``--osmosis-reuse`` recorded from another run in this session..."""
    reuse_note: str = ""
    """...and what to say about it (the run, or why nothing was reused)."""
    upload_line: str = ""
    """What ``--osmosis-upload`` did with the run, in one line."""


class EvalSession:
    """Everything one pytest process knows about the evals it plans, runs or records."""

    def __init__(
        self, config: pytest.Config, options: SessionOptions, *, is_worker: bool, collect_all: bool
    ) -> None:
        self.config = config
        self.options = options
        self.is_worker = is_worker
        self.collect_all = collect_all
        forget_loaded()  # each session imports its rollouts as they are now
        self._plans: dict[Path, EvalPlan] = {}
        self._errors: dict[Path, OsmosisError] = {}
        self._run_names: dict[str, str] = {}
        self._journals: dict[Path, dict[tuple[int, int], dict[str, Any]]] = {}
        self._rollouts: dict[Path, Dispatch] = {}
        self._executor: Executor | None = None
        self._bridges: dict[str, Bridge] = {}
        self._bridge_lock: asyncio.Lock | None = None
        self._caches: dict[Path, CallCache] = {}  # output root -> its model-call cache
        self._prefetched = False
        self._worker_prefetch = False
        self._blame_slot: tuple[str, str] | None = None
        self._slot: blame.Slot | None = None
        #: A worker on another host (execution/remote.py): its attempts' files go to this
        #: scratch directory, then back to the controller on their reports.
        self._scratch: Path | None = None
        self._trial_files: dict[str, dict[str, bytes]] = {}
        self._controller_paths: dict[str, str] = {}  # this host's config path -> controller's
        #: Where a row's ``os._exit`` names the row (single process; see _record_killed_rows).
        self._exit_paths: list[str] = []
        self._restore_exit = (
            None if is_worker else blame.witness_exits(self._exit_paths, self.journal_finished)
        )
        self.runs: dict[Path, ControllerRun] = {}
        self.verdict: Verdict | None = None
        self._prefixes: dict[str, Path | None] = {}  # node id file part -> config (item_key)
        self._positions: dict[Path, dict[int, int]] = {}  # dataset row -> selection position
        self._warned: set[str] = set()  # the lines warn_once has written
        #: Why no new row may start (a spent budget), once the controller said so.
        self.stop_line: str | None = None
        #: The budgets (budget.py): the controller's accounts, or an xdist worker's tickets.
        self.budget: Budget | None = None
        self.tickets: Tickets | None = None
        self.milestones: Milestones | None = None
        """Start-up phases on the controller's terminal (set by the controller role)."""
        self.faulted = False
        """A row met a fault of the whole session (``SessionFaultError``): what finished
        after it may have run on what broke (a changed dataset), so it is not journalled."""
        #: ``--osmosis-regrade``: the run whose samples are graded again, and its config.
        self.regrade: SourceRun | None = None
        self.regrade_config: Path | None = None
        raise_fd_limit()  # before any bridge sizes its connection cap from it

    # -- planning --------------------------------------------------------------------

    def plan_for(self, path: Path) -> EvalPlan:
        """The plan for one config (built once per process); raises our own errors."""
        path = path.resolve()
        if path in self._errors:
            raise self._errors[path]
        if path not in self._plans:
            try:
                plan = self._build_plan(path)
            except OsmosisError as exc:
                self._errors[path] = exc
                raise
            from pytest_osmosis.plugin.redaction import add_named_secrets

            add_named_secrets(self.config, plan.config.secrets.required)
            plan.run_name = self._run_names.get(str(path), "")
            if not plan.run_name:
                inputs = run_inputs(plan)
                plan.run_name = choose_run_name(plan, self.options.name, inputs, utc_now(), False)
            self._plans[path] = plan
        return self._plans[path]

    def set_worker_input(self, workerinput: dict[str, Any]) -> None:
        """What the xdist controller decided: run directory names, whether shards are ours."""
        self._run_names.update(workerinput.get("osmosis_runs", {}))
        self._worker_prefetch = bool(workerinput.get("osmosis_prefetch", False))
        if workerinput.get("osmosis_budget_dir"):
            from pytest_osmosis.plugin.budget import Tickets

            self.tickets = Tickets(
                Path(workerinput["osmosis_budget_dir"]), str(workerinput["workerid"])
            )
        blame_dir = workerinput.get("osmosis_blame_dir")
        self._blame_slot = (str(blame_dir), str(workerinput["workerid"])) if blame_dir else None
        if workerinput.get("osmosis_regrade"):
            from pytest_osmosis.regrade import take_worker_input

            take_worker_input(self, workerinput["osmosis_regrade"])
        if workerinput.get("osmosis_remote"):
            self._take_remote_input(workerinput["osmosis_remote"])

    def _take_remote_input(self, remote: dict[str, Any]) -> None:
        """A worker on another host: the environment and journals it was sent (in memory),
        and a scratch directory for its attempts' files (execution/remote.py)."""
        import tempfile

        os.environ.update(remote["environ"])
        for path, records in remote["journals"].items():
            self._journals[Path(path)] = {(r["row_index"], r["run_index"]): r for r in records}
        self._controller_paths = dict(remote["config_paths"])
        self._scratch = Path(tempfile.mkdtemp(prefix="osmosis-worker-"))

    def reported_config(self, plan: EvalPlan) -> str:
        """The config path a result names: the controller's (a remote worker's differs)."""
        mine = str(plan.config_path)
        return self._controller_paths.get(mine, mine)

    def returned_files(self, rollout_id: str | None) -> dict[str, bytes] | None:
        """A remote worker: the files of this attempt, for its report (once); else None."""
        if self._scratch is None or not rollout_id:
            return None
        return self._trial_files.pop(rollout_id, {})

    def _build_plan(self, path: Path) -> EvalPlan:
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

    def open_runs(self, config_paths: list[Path]) -> dict[str, str]:
        """Controller: plan every config and open its run directory before any row runs."""
        from pytest_osmosis.plugin.redaction import add_named_secrets, log_redactor_for
        from pytest_osmosis.plugin.secrets import (
            MissingSecretsError,
            SecretsFileError,
            resolve_secrets,
        )
        from pytest_osmosis.results import RunDirectory, RunLog
        from pytest_osmosis.results.source_run import RegradeError

        now = utc_now()
        several = len(config_paths) > 1
        names: dict[str, str] = {}
        planned: list[tuple[Path, EvalPlan, dict[str, Any]]] = []
        for path in config_paths:
            path = path.resolve()
            try:
                plan = self._build_plan(path)
                inputs = run_inputs(plan)
                if self.regrade is not None:
                    self.regrade.check_inputs(inputs, path)
                    inputs = self.regrade.regrade_inputs(inputs)
                plan.run_name = choose_run_name(plan, self.options.name, inputs, now, several)
                if self.regrade is not None:
                    self.regrade.check_target(plan.run_dir)
                # Secrets first: the rollout's import code may read (or print) them.
                required = plan.config.secrets.required
                resolved = resolve_secrets(
                    required, self.options.secrets_file, config=self.config, config_path=path
                )
                add_named_secrets(self.config, required, resolved)
                # A rollout that cannot be imported must fail before its run directory exists.
                with self.phase(f"importing rollout {plan.rollout_dir.name}"):
                    self.load_rollout(plan)
                self.warn_loaded(plan)
                reuse = self._reuse_source(plan, inputs)
            except (RunDirectoryError, MissingSecretsError, SecretsFileError, RegradeError):
                raise
            except OsmosisError as exc:
                self._errors[path] = exc  # collection reports it, naming the file
                continue
            planned.append((path, plan, inputs))
        if self._errors and not self.config.option.continue_on_collection_errors:
            # Collection will stop the session on that error: nothing is opened or called.
            return names
        for path, plan, inputs in planned:
            box: list[RunLog] = []
            early: list[str] = []

            def warn(message: str, box: list[RunLog] = box, early: list[str] = early) -> None:
                if box:
                    box[0].warning("results", message)
                else:
                    early.append(message)

            created = self.options.fresh or not plan.run_dir.exists()
            rundir = RunDirectory.open(
                plan.output_root,
                plan.run_name,
                inputs,
                run_provenance(plan),
                fresh=self.options.fresh,
                retry_failed=self.options.retry_failed,
                retry_below=self.options.retry_below(plan),
                warn=warn,
                sources=plan.dataset.selected_source_rows,
            )
            log = RunLog(rundir.logs_path, log_redactor_for(self.config))
            box.append(log)
            for message in early:
                log.warning("results", message)
            reused, reuse_note = self._reuse(plan, rundir, reuse, log)
            keys = plan.work_keys()
            pending = len(rundir.pending(keys))
            log.write(
                "info", "run", f"{plan.run_name}: {pending} of {len(keys)} work items pending"
            )
            self._plans[path] = plan
            self._journals[path] = rundir.records
            self.runs[path] = ControllerRun(
                plan=plan,
                rundir=rundir,
                log=log,
                started_at=now,
                pending_at_start=pending,
                created=created,
                execution=self._shown_execution(plan),
                reused=reused,
                reuse_note=reuse_note,
            )
            names[str(path)] = plan.run_name
            if pending:
                self._start_early(plan)
        self._record_killed_rows()
        return names

    def plan_errors(self) -> list[tuple[Path, OsmosisError]]:
        """The configs that could not be planned, and why (collection reports them)."""
        return list(self._errors.items())

    def _reuse_source(self, plan: EvalPlan, inputs: dict[str, Any]) -> ReuseSource | None:
        """``--osmosis-reuse RUN``, read before the run directory is made (one line if bad)."""
        if not self.options.reuse:
            return None
        from pytest_osmosis.results.reuse import open_reuse_source
        from pytest_osmosis.results.runs import resolve_run

        path = resolve_run(self.options.reuse, plan.output_root)
        if path.resolve() == plan.run_dir.resolve():
            raise RunDirectoryError(
                f"--osmosis-reuse {self.options.reuse}: is this run ({plan.run_name}) itself"
            )
        return open_reuse_source(
            path,
            inputs,
            plan.dataset.sha256,
            plan.row_digests(),
            plan.dataset.selected_source_rows,
        )

    def _reuse(
        self, plan: EvalPlan, rundir: RunDirectory, source: ReuseSource | None, log: RunLog
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
            retry_failed=self.options.retry_failed,
            retry_below=self.options.retry_below(plan),
            recorded={record["rollout_id"] for record in rundir.records.values()},
        )
        reuse_into(source, rundir.path, records)
        rundir.extend(records, reused=True)
        log.write("info", "reuse", f"{len(records)} work items reused from run {source.name!r}")
        return len(records), f"from run {source.name!r}"

    def _record_killed_rows(self) -> None:
        """A row whose code called ``os._exit`` in the previous single-process session is
        recorded ``worker_crashed`` and not run again: resuming would die there for ever.

        The previous session's :func:`blame.witness_exits` named it, beside the run's lock
        (outside the uploaded run directory). A kill from outside names no row.
        """
        for run in self.runs.values():
            witnessed = blame.witnessed_exit(_exit_witness(run.plan))
            found = self.item_key(witnessed[1]) if witnessed else None
            if witnessed is None or found is None or found[0] != run.plan.config_path:
                continue
            if not run.rundir.pending([found[1]]):
                continue
            status, nodeid = witnessed
            result = self.crashed_result(
                nodeid,
                f"this row's code called os._exit({status}) and ended the previous session; "
                "it is not run again (--osmosis-retry-failed runs it)",
            )
            if result is None:
                continue
            run.rundir.append(result)
            run.executed += 1
            run.pending_at_start -= 1
            run.log.warning(
                "result", f"{nodeid}: {result['message']}", rollout_id=result["rollout_id"]
            )
        if not self.is_worker and self.runs:
            self._exit_paths[:] = [_exit_witness(run.plan) for run in self.runs.values()]

    def journal_finished(self, *, wait: bool = True) -> None:
        """Journal the rows that finished ahead but were not reported yet, so that the next
        session does not run them again: the session is ending before pytest reached them
        (Ctrl-C, ``-x``, an INTERNALERROR, a row's ``os._exit``). ``wait=False``: from a
        signal handler, which must not wait on a lock the code it interrupted holds."""
        if self._executor is None or self.faulted:
            return
        for nodeid, result in self._executor.finished(wait=wait).items():
            found = self.item_key(nodeid)
            if found is None or not isinstance(result, dict) or result.get("session_fault"):
                continue
            run = self.runs[found[0]]
            if run.storage_fault is not None or result.get("storage_fault"):
                continue
            if not run.rundir.pending([found[1]]):
                continue
            try:
                run.rundir.append(result)
            except (RunDirectoryError, OSError) as exc:  # the final snapshots say it, exit 4
                run.storage_fault = str(exc)
                continue
            run.executed += 1
            run.log.write(
                "info",
                "result",
                "work item finished (not reported: the session ended first)",
                rollout_id=result["rollout_id"],
            )

    def phase(self, doing: str) -> contextlib.AbstractContextManager[None]:
        """A start-up milestone around a phase that can take a while (milestones.py)."""
        if self.milestones is None:
            return contextlib.nullcontext()
        return self.milestones.phase(doing)

    def load_rollout(self, plan: EvalPlan) -> Dispatch:
        """How this config's rows run (``--osmosis-execution``), decided once per process.

        ``auto`` runs a rollout in process when that is faithful, and on its own server as
        ``osmosis eval run`` does when it is not: its ``pyproject.toml`` needs what this
        environment lacks, or it serves (or builds a non-local backend) while loading.
        """
        if plan.config_path not in self._rollouts:
            for key, value in plan.config.env.items():
                os.environ[key] = value
            self._rollouts[plan.config_path] = self._dispatch_for(plan)
        return self._rollouts[plan.config_path]

    def _dispatch_for(self, plan: EvalPlan) -> Dispatch:
        from pytest_osmosis.core.errors import ConfigError, NeedsServerError
        from pytest_osmosis.workspace.environment import unmet_requirements

        mode = self.options.execution
        if mode == SERVER:
            if self.regrade is not None:
                raise ConfigError(
                    "--osmosis-regrade grades recorded samples in process; it cannot run with "
                    "--osmosis-execution server"
                )
            return self._server(plan, "--osmosis-execution server")
        if mode == AUTO and self.regrade is None:
            unmet = unmet_requirements(plan.rollout_dir)
            if unmet:
                why = f"its pyproject.toml needs {', '.join(unmet[:3])}"
                return self._server(plan, why)
        try:
            loaded = load_rollout(
                plan.rollout_dir,
                plan.entrypoint,
                workflow_override=self.options.workflow_override,
                grader_override=self.options.grader_override,
                main_timeout=self.options.main_timeout,
            )
        except NeedsServerError as exc:
            if mode != AUTO or self.regrade is not None:
                raise
            return self._server(plan, one_line(str(exc).partition("; ")[0], 200))
        if mode == IN_PROCESS:
            return InProcess(loaded, "--osmosis-execution in-process")
        return InProcess(loaded, "a LocalBackend rollout this environment satisfies")

    def _server(self, plan: EvalPlan, why: str) -> Dispatch:
        from pytest_osmosis.execution.server import RolloutServer
        from pytest_osmosis.plugin.redaction import log_redactor_for, redactor_for

        # [env]/[secrets] cannot name _OSMOSIS_* variables (workspace/config.py refuses them),
        # so the server's own variables are always the supervisor's, as in the SDK.
        return RolloutServer(
            rollout_dir=plan.rollout_dir,
            entrypoint=plan.entrypoint,
            run_dir=plan.run_dir,
            log_redactor=log_redactor_for(self.config),
            redactor=redactor_for(self.config),
            interpreter=self.options.server_python,
            start_timeout=self.options.server_start_timeout,
            why=why,
        )

    def execution_text(self, plan: EvalPlan) -> str:
        """How a config's rows run and why, as the plan and the results table say it."""
        dispatch = self.load_rollout(plan)
        text = f"{dispatch.mode} ({dispatch.why})"
        from pytest_osmosis.plugin.xdist import worker_count

        if dispatch.mode == SERVER and worker_count(self.config) and not self.is_worker:
            text += "; each xdist worker starts its own server"
        return text

    def _shown_execution(self, plan: EvalPlan) -> str:
        """The results table's execution line: where auto did not simply run in process."""
        if self.options.execution == AUTO and self.load_rollout(plan).mode == IN_PROCESS:
            return ""
        return self.execution_text(plan)

    def _start_early(self, plan: EvalPlan) -> None:
        """A single process starts a rollout's server as soon as its run directory exists,
        so ``uv sync`` and the server's imports overlap the model check; collection waits
        for it (:meth:`ready_rollout`). An xdist controller runs no rows: each worker
        starts its own."""
        dispatch = self._rollouts.get(plan.config_path)
        if dispatch is None or dispatch.mode != SERVER:
            return
        if self.config.pluginmanager.has_plugin("dsession"):
            return
        asyncio.run_coroutine_threadsafe(dispatch.start(), self.executor.loop)

    def ready_rollout(self, plan: EvalPlan) -> None:
        """Collection, in a process that runs rows: start the rollout's server, if it has one.

        After the session's checks (the preflight passed, the run directory exists), as
        ``osmosis eval run`` starts its server; one that cannot start is the config's error.
        """
        dispatch = self.load_rollout(plan)
        if dispatch.mode == SERVER and not self.config.option.collectonly:
            with self.phase(f"starting the rollout server of {plan.rollout_dir.name}"):
                self.executor.call(dispatch.start())

    def warn_loaded(self, plan: EvalPlan) -> None:
        """What would keep ``osmosis eval run`` from running this config although we can:
        one line each, after the start-up phase whose line it would break."""
        if self.is_worker:  # the controller loads every rollout too, and says it
            return
        dispatch = self._rollouts.get(plan.config_path)
        # A rollout on its own server is started as osmosis eval run starts it: no guesses.
        loaded = dispatch.rollout.warnings if isinstance(dispatch, InProcess) else ()
        for line in (*workspace_warnings(plan.workspace), *loaded):
            self.warn_once(f"osmosis: warning: {line}")

    def warn_once(self, line: str) -> None:
        """One line on the terminal (stderr without one), once a session."""
        if line in self._warned:
            return
        self._warned.add(line)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line, yellow=True, bold=True)
        else:
            print(line, file=sys.stderr)

    def journal(self, plan: EvalPlan) -> dict[tuple[int, int], dict[str, Any]]:
        """Results already recorded for this run (read-only on workers)."""
        if plan.config_path not in self._journals:
            from pytest_osmosis.results import read_journal

            self._journals[plan.config_path] = read_journal(plan.run_dir)
        return self._journals[plan.config_path]

    def carried_forward(self, item: EvalItem) -> dict[str, Any] | None:
        """The journalled result this item reuses instead of running, if any."""
        record = self.journal(item.parent.plan).get(item.key)
        if record is None:
            return None
        retry_below = self.options.retry_below(item.parent.plan)
        if self.options.retry_failed and outcome.is_retried(record, retry_below):
            return None
        return record

    # -- running ---------------------------------------------------------------------

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            self._executor = Executor(self._concurrency(), may_start=self._may_start)
            if self._blame_slot:
                # Which row's code runs, for whoever reads it if this process dies (blame.py):
                # the xdist controller, or the next single-process session.
                self._slot = blame.install(self._executor.loop, *self._blame_slot)
        return self._executor

    def rows_in_flight(self) -> int | None:
        """Rows running in this process now (live progress); None on xdist's controller,
        whose workers run them."""
        if self.config.pluginmanager.has_plugin("dsession"):
            return None
        return 0 if self._executor is None else self._executor.in_flight()

    def _concurrency(self) -> int:
        """Items in flight in this process: the total, split evenly across xdist workers,
        and no more than the open-files limit leaves room for (said once, in one line)."""
        wanted = self.total_concurrency()
        if self.is_worker:
            from pytest_osmosis.plugin.xdist import per_worker

            workerinput: dict[str, Any] = self.config.workerinput  # type: ignore[attr-defined]
            wanted = per_worker(wanted, int(workerinput.get("workercount", 1)))
        room = fd_capacity()
        if room is None or wanted <= room[0]:
            return wanted
        cap, limit = room
        self.warn_once(
            f"osmosis: warning: {wanted} rows in flight need more file descriptors than "
            f"the open-files limit of {limit} allows (about {FDS_PER_ROW} a row): "
            f"running at most {cap} at once (raise `ulimit -Hn` for more)"
        )
        return cap

    def total_concurrency(self) -> int:
        """``--osmosis-concurrency``, else what ``osmosis eval run`` picks for the config.

        The SDK takes ``batch_size`` capped by the capacity the rollout's backend advertises,
        else that capacity, else 1 (``LocalEvalRunner._resolve_concurrency``).
        """
        if self.options.concurrency:
            return self.options.concurrency
        best = 1
        for plan in self._plans.values():
            dispatch = self._rollouts.get(plan.config_path)
            capacity = dispatch.capacity if dispatch is not None else _DEFAULT_CAPACITY
            wanted = plan.settings.concurrency
            value = (min(wanted, capacity) if capacity else wanted) if wanted else capacity
            best = max(best, value or 1)
        return best

    def start_ahead(self, item: EvalItem) -> None:
        """Setup phase: start rows ahead (the model preflight passed at session start).

        LiteLLM is imported before the first row starts, so no row's model call waits
        for it (an xdist worker imports it here; a single process did at session start).
        """
        if self.carried_forward(item) is not None:
            return
        keep_streams_open()  # pytest's capture streams, current now, as rows may run
        if not self._prefetched:
            self._prefetched = True
            from pytest_osmosis.model.litellm import import_litellm

            model = item.parent.plan.settings.model_path
            try:
                # replayed answers need no LiteLLM
                if self._rows_need_litellm(model) and self.options.cache_mode != "replay":
                    import_litellm()
            except ModelPreflightError as exc:
                pytest.exit(
                    f"model preflight failed for {model!r}: {exc}",
                    returncode=pytest.ExitCode.USAGE_ERROR,
                )
            self.executor.concurrency = self._concurrency()
            if not self.is_worker:
                self._prefetch(item.session.items)
        if self.is_worker and self._worker_prefetch:
            # xdist sends this worker whole shards; start what was queued for it since.
            from pytest_osmosis.plugin.xdist import newly_queued_indices

            items = item.session.items
            self._prefetch([items[i] for i in newly_queued_indices(self.config) if i < len(items)])

    # -- budgets ---------------------------------------------------------------------

    def _may_start(self) -> bool:
        """Whether the budgets let one more row start now (it counts as started if so)."""
        if self.tickets is not None:
            return self.tickets.take()
        return self.budget is None or self.is_worker or self.budget.admit()

    def stop_starting(self, line: str) -> None:
        """Controller: a budget is spent; no new row starts here or on any xdist worker.

        Rows in flight finish and are recorded; the rows not started stay pending.
        """
        self.stop_line = line
        if self.budget is not None:
            self.budget.publish_stop(line)
        for run in self.runs.values():
            run.log.warning("budget", line)

    def wait_to_start(self, item: EvalItem) -> str | None:
        """Under a budget: start ``item`` once the controller admits it (budget.py), or
        return the line that stops the session when it never will."""
        if self.stop_line is not None:
            return None if self.may_report(item) else self.stop_line
        if (self.budget is None and self.tickets is None) or self.carried_forward(item):
            return None
        from pytest_osmosis.plugin.budget import wait_between_looks

        factory = lambda: self._execute(item)  # noqa: E731
        while not self.executor.start(item.nodeid, factory):
            if self.tickets is None:  # one process: no row in flight can free room now
                assert self.budget is not None
                self.stop_starting(self.budget.stop_line())
                return self.stop_line
            line = self.tickets.stop_line()
            if line is not None:
                self.stop_line = line
                return line
            wait_between_looks()
        return None

    def may_report(self, item: EvalItem) -> bool:
        """Whether ``item`` can run after a budget is spent: it is in flight, or recorded."""
        if self.carried_forward(item) is not None:
            return True
        return self._executor is not None and self._executor.started(item.nodeid)

    def run_item(self, item: EvalItem) -> dict[str, Any]:
        plan = item.parent.plan
        record = self.carried_forward(item)
        if record is not None:
            return resumed_result(record, plan)
        factory = lambda: self._execute(item)  # noqa: E731
        try:
            try:
                return dict(self.executor.result(item.nodeid, factory))
            except BackstopExpired as exc:
                return self._past_backstop(item, factory, exc)
        except SessionFaultError as exc:  # nothing can be trusted now: stop, rows pending
            line = f"osmosis: {exc}"
            self.faulted = True  # rows finished after it are not kept either (journal_finished)
            if self.is_worker:
                # pytest.exit on a worker leaves xdist's controller holding rows it can place
                # nowhere (INTERNALERROR): take no more rows, and let the controller stop.
                item.session.shouldstop = line
                return self._session_fault_result(item, line)
            pytest.exit(line, returncode=pytest.ExitCode.USAGE_ERROR)

    def _past_backstop(
        self, item: EvalItem, factory: Callable[[], Any], expired: BackstopExpired
    ) -> dict[str, Any]:
        """The backstop fired while ``item`` waited: only the row whose code blocks the loop fails.

        Nothing blocks the loop: the row runs on under its own budgets. This row's code (its
        workflow, grader, or a task either started) blocks it: this row fails. Another row's
        blocks it: that row is the one that fails when its turn comes, and this one waits one
        more backstop; held by the same row then, or by code that is no row's, the loop will
        not come back in time, and the session stops with the rows in flight left pending.
        """
        waited_on: str | None = None
        while True:
            if self.executor.responsive():
                return dict(self.executor.result(item.nodeid, factory))
            found = self.executor.blocker()
            nodeid, where, seconds = found if found is not None else (None, "?", 0.0)
            if nodeid is None or nodeid == waited_on:
                who = "code that is not a row's" if nodeid is None else _row_words(nodeid)
                raise SessionFaultError(
                    f"the event loop has been blocked for {seconds:.0f} s by {who} (at {where}); "
                    "rows in flight were not recorded"
                )
            blocking = f"{_row_words(nodeid)} is blocking the event loop at {where}"
            if nodeid == item.nodeid:
                self.executor.abandon(item.nodeid)
                return self._backstop_result(item, expired, blocking)
            waited_on = nodeid
            warnings.warn(
                f"{item.nodeid} waits past its backstop: {blocking}",
                pytest.PytestWarning,
                stacklevel=1,
            )
            cancel = arm_backstop(expired.seconds)
            try:
                return dict(self.executor.result(item.nodeid, factory))
            except BackstopExpired as again:
                expired = again
            finally:
                if cancel is not None:
                    cancel()

    def item_key(self, nodeid: str) -> tuple[Path, tuple[int, int]] | None:
        """Controller: the run and (row_index, run_index) an eval item's node id names."""
        from pytest_osmosis.plugin.collect import split_item_nodeid

        parts = split_item_nodeid(nodeid)
        if parts is None:
            return None
        prefix, source, run_index = parts
        if prefix not in self._prefixes:
            self._prefixes[prefix] = next(
                (path for path in self.runs if _nodeid_names(self.config, prefix, path)), None
            )
        path = self._prefixes[prefix]
        if path is None:
            return None
        if path not in self._positions:
            sources = self.runs[path].plan.dataset.selected_source_rows
            self._positions[path] = {source: at for at, source in enumerate(sources)}
        row_index = self._positions[path].get(source)
        if row_index is None:
            return None
        return path, (row_index, run_index)

    def crashed_result(self, nodeid: str, why: str) -> dict[str, Any] | None:
        """Controller: the failed result of an item whose xdist worker died under it."""
        found = self.item_key(nodeid)
        if found is not None:
            path, (row_index, run_index) = found
            run = self.runs[path]
            return outcome.failure(
                row_index=row_index,
                run_index=run_index,
                source_row_index=run.plan.dataset.source_row_index(row_index),
                pass_threshold=run.plan.settings.pass_threshold,
                error_type="worker_crashed",
                message=one_line(why, 300),
                config=str(path),
            )
        return None

    # -- storage faults ---------------------------------------------------------------

    @contextlib.contextmanager
    def recording(self, run: ControllerRun, result: dict[str, Any]) -> Iterator[None]:
        """Journal and log one result; when the run directory cannot take it, stop (exit 4).

        A row whose trajectory could not be written (``storage_fault``, set where it ran,
        maybe an xdist worker) is not journalled either: the next session runs it again.
        """
        if result.get("storage_fault"):
            self.stop_for_storage(run, str(result["storage_fault"]))
        try:
            yield
        except RunDirectoryError as exc:
            self.stop_for_storage(run, str(exc))
        except OSError as exc:
            self.stop_for_storage(run, f"cannot record results in {run.rundir.path}: {exc}")

    def stop_for_storage(self, run: ControllerRun, message: str) -> NoReturn:
        """A session-level fault: one line, exit 4, like the other faults that stop a session.

        What the journal holds stays as it is (a failed append is cut back off), so the run
        resumes after its last recorded result once the cause is gone.
        """
        run.storage_fault = message
        pytest.exit(storage_fault_line(run, message), returncode=pytest.ExitCode.USAGE_ERROR)

    def storage_fault_at_finish(self, session: pytest.Session, run: ControllerRun) -> None:
        """The final snapshots could not be written: the same one line and exit 4."""
        line = storage_fault_line(run, run.storage_fault or "")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("!", line, red=True)
        else:
            print(line, file=sys.stderr)

    def _session_fault_result(self, item: EvalItem, line: str) -> dict[str, Any]:
        """What a worker sends for the row that met a session fault: never journalled."""
        return outcome.failure(
            row_index=item.row_index,
            run_index=item.run_index,
            source_row_index=item.source_row_index,
            pass_threshold=item.parent.plan.settings.pass_threshold,
            error_type="session_fault",
            message=line,
            session_fault=line,
        )

    def _backstop_result(
        self, item: EvalItem, expired: BackstopExpired, blocker: str
    ) -> dict[str, Any]:
        """The backstop fired while this item waited: its own code blocked the event loop."""
        return outcome.failure(
            row_index=item.row_index,
            run_index=item.run_index,
            source_row_index=item.source_row_index,
            pass_threshold=item.parent.plan.settings.pass_threshold,
            error_type="backstop_timeout",
            message=f"{expired}: {blocker}",
        )

    def _prefetch(self, items: list[pytest.Item]) -> None:
        from pytest_osmosis.plugin.collect import EvalItem

        for other in items:
            if isinstance(other, EvalItem) and self.carried_forward(other) is None:
                self.executor.submit(other.nodeid, lambda other=other: self._execute(other))  # type: ignore[misc]

    async def _execute(self, item: EvalItem) -> dict[str, Any]:
        blame.enter(item.nodeid)  # a crash in this row's code is pinned on it (xdist workers)
        if self.regrade is not None:
            from pytest_osmosis.regrade import kept_result

            kept = kept_result(self.regrade, item)
            if kept is not None:  # its workflow failed: nothing to grade again
                return kept
        from pytest_osmosis.plugin.redaction import redactor_for
        from pytest_osmosis.results import build_trajectory, prepare_trial_dir, write_trajectory
        from pytest_osmosis.results.redact import redact_trajectory

        redactor = redactor_for(self.config)

        plan = item.parent.plan
        dispatch = self._rollouts[plan.config_path]
        row = plan.dataset.row(item.row_index)
        work = WorkItem(
            row_index=item.row_index,
            run_index=item.run_index,
            source_row_index=row.source_row_index,
            prompt=row.initial_messages,
            label=row.label,
            metadata=row.metadata,
        )
        bridge = await self.bridge(plan.settings.model_path)
        bridge.allow_judge_models(self._judge_models(dispatch))
        cache = self.call_cache(plan.output_root)
        cached = (
            cache.attempt(plan.config.experiment.dataset, row.source_row_index, item.run_index)
            if cache is not None
            else None
        )
        # A remote worker writes into its scratch directory (its report carries the files).
        run_dir = plan.run_dir if self._scratch is None else self._scratch / plan.run_name
        storage_faults: list[str] = []

        def save_trajectory(
            rollout_id: str,
            sample: Any,
            work: WorkItem,
            step_usage: list[dict[str, int]] | None = None,
        ) -> bool:
            doc = build_trajectory(
                rollout_id=rollout_id,
                messages=list(sample.trajectory_messages),
                # A sample from a SampleSource carries no label; the SDK falls back to the row's.
                label=sample.label if sample.label is not None else work.label,
                reward=sample.reward,
                sample_metrics=dict(sample.metrics),
                sample_extra_fields=dict(sample.extra_fields),
                request_metadata=work.metadata,
                request_extra_fields={"row_index": work.row_index, "run_index": work.run_index},
                sdk_version=_sdk_version(),
                step_usage=step_usage,
            )
            trial_dir = run_dir / "rollout_trials" / rollout_id
            try:
                write_trajectory(trial_dir, redact_trajectory(doc, redactor))
            except OSError as exc:  # a full disk: the controller stops, this row stays pending
                storage_faults.append(f"cannot write a trajectory in {trial_dir}: {exc}")
                return False
            return True

        prepare: Callable[[str], Path | None] = lambda rid: prepare_trial_dir(run_dir, rid)  # noqa: E731
        writer: TrajectoryWriter = save_trajectory
        recorded = None
        if self.regrade is not None:  # the recorded sample, graded again (regrade.py)
            from pytest_osmosis.regrade import regrade_steps

            recorded, prepare, writer = regrade_steps(self.regrade, item, redactor, storage_faults)
        result = await dispatch.run(
            work,
            bridge=bridge,
            budgets=Budgets(plan.settings.agent_timeout_s, plan.settings.grader_timeout_s),
            pass_threshold=plan.settings.pass_threshold,
            prepare_artifacts=prepare,
            write_trajectory=writer,
            cache=cached,
            recorded=recorded,
        )
        if storage_faults:
            result = {**result, "storage_fault": storage_faults[0]}
        if self._scratch is not None and result.get("rollout_id"):
            from pytest_osmosis.execution.remote import pack_trial

            rollout_id = str(result["rollout_id"])
            self._trial_files[rollout_id] = pack_trial(run_dir / "rollout_trials" / rollout_id)
        return result

    def _judge_models(self, dispatch: Dispatch) -> list[str]:
        """Judge models a rollout's calls may name: its grader's, ini osmosis_judge_models."""
        declared = dispatch.judge_model
        listed = [str(model) for model in self.config.getini("osmosis_judge_models")]
        return listed + ([declared] if declared else [])

    async def bridge(self, model_path: str) -> Bridge:
        """The loopback bridge for ``model_path``, started on first use in this process."""
        from pytest_osmosis.model.bridge import Bridge
        from pytest_osmosis.model.routes import resolve_route

        # No surprise downloads from a test run: LiteLLM's bundled cost map and tokenizers
        # (set LITELLM_LOCAL_MODEL_COST_MAP=False to fetch the latest map).
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        started = self._bridges.get(model_path)
        if started is not None:  # every row after the first: no lock to take
            return started
        if self._bridge_lock is None:
            self._bridge_lock = asyncio.Lock()
        async with self._bridge_lock:
            if model_path not in self._bridges:
                offline = self.options.cache_mode == "replay"
                if offline:  # answers come from the cache: no key, no engine to start
                    from pytest_osmosis.model.cache import offline_route

                    route = offline_route(model_path)
                else:
                    route = await asyncio.get_running_loop().run_in_executor(
                        None, resolve_route, model_path
                    )
                bridge = Bridge(route)
                bridge.offline = offline
                await bridge.start()
                self._bridges[model_path] = bridge
            return self._bridges[model_path]

    def call_cache(self, output_root: Path) -> CallCache | None:
        """The model-call cache beside the runs under `output_root` (None when it is off).

        Opened once per process and root; ``replay`` refuses a missing file (ConfigError).
        """
        mode = self.options.cache_mode
        if mode == "off":
            return None
        cache = self._caches.get(output_root)
        if cache is None:
            from pytest_osmosis.model.cache import CallCache, cache_path

            cache = CallCache(cache_path(output_root), mode, self.options.cache_max_age_s)
            cache.open()
            self._caches[output_root] = cache
        return cache

    def models_to_check(self, run: ControllerRun) -> list[str]:
        """The models a run's rows may call, which the preflight checks before any row.

        The run's model; none under ``--osmosis-cache replay`` (no call reaches a model;
        ``use`` may call one for a request it has not seen, so its model is checked); under
        a regrade only the judge models its grader declares (the workflow does not run).
        """
        cache = self.call_cache(run.plan.output_root)
        if cache is not None and cache.replay:
            return []
        if self.regrade is None:
            return [run.plan.settings.model_path]
        rollout = self._rollouts.get(run.plan.config_path)
        return [] if rollout is None else self._judge_models(rollout)

    def preflight(self, model_paths: list[str], *, in_process: bool) -> None:
        """Check each model before any row starts (:meth:`models_to_check`); raises
        :class:`ModelPreflightError`.

        ``in_process`` (a process that runs rows) imports LiteLLM here, on a thread of its own
        while the models are checked, unless no row needs it; an xdist controller checks
        OpenAI-compatible routes directly and others in a child process (model/preflight.py).
        """
        if not model_paths:
            return
        # Imported here first, so the check never waits for LiteLLM's thread to finish
        # importing a module both need (aiohttp's client above all).
        import aiohttp  # noqa: F401

        import pytest_osmosis.model.preflight  # noqa: F401
        from pytest_osmosis.model.litellm import litellm_ready, start_import

        needing = sorted(path for path in set(model_paths) if self._rows_need_litellm(path))
        try:
            if in_process and needing:
                start_import()
            self.executor.call(self._preflight_all(model_paths, in_process))
            if in_process and needing and not litellm_ready():
                self._import_litellm(needing[0])
        except KeyboardInterrupt:
            from pytest_osmosis.model.preflight import interrupted

            interrupted()
            raise

    def _rows_need_litellm(self, model_path: str) -> bool:
        """Whether rows reach this model through LiteLLM, or need its prices (a cost budget).

        ``osmosis/embedded`` and endpoints over plain HTTP are called directly
        (model/direct.py::rows_go_direct); a call LiteLLM would rewrite still imports it then.
        """
        from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH

        if model_path == EMBEDDED_MODEL_PATH:
            return False
        from pytest_osmosis.model.direct import rows_go_direct
        from pytest_osmosis.model.preflight import unknown_provider
        from pytest_osmosis.model.routes import resolve_route

        route = resolve_route(model_path)
        if unknown_provider(route) is not None:
            return False  # no row runs: the preflight refuses it without LiteLLM
        prices = self.options.gate.values.get("max_cost") is not None
        return prices or not rows_go_direct(route)

    def _import_litellm(self, model_path: str) -> None:
        """Wait for LiteLLM (rows call the model through it): a failed import is one line."""
        from pytest_osmosis.model.litellm import import_litellm

        try:
            with self.phase("importing LiteLLM"):
                import_litellm()
        except ModelPreflightError as exc:
            raise ModelPreflightError(f"model preflight failed for {model_path!r}: {exc}") from None

    async def _preflight_all(self, model_paths: list[str], in_process: bool) -> None:
        """Check each model (needing its route only: no bridge is started for it here)."""
        from pytest_osmosis.model.preflight import check_model
        from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, resolve_route

        loop = asyncio.get_running_loop()
        for model_path in sorted(set(model_paths)):
            try:
                loading = model_path == EMBEDDED_MODEL_PATH
                with self.phase(f"loading {model_path}") if loading else contextlib.nullcontext():
                    route = await loop.run_in_executor(None, resolve_route, model_path)
                with self.phase(f"checking model {model_path}"):
                    warning = await check_model(route, in_process=in_process)
            except Exception as exc:  # noqa: BLE001 - anything here means the model is unusable
                text = str(exc)
                if not isinstance(exc, OsmosisError):
                    text = f"{type(exc).__name__}: {' '.join(text.split())}"
                if not text.startswith("model preflight failed"):
                    text = f"model preflight failed for {model_path!r}: {text}"
                raise ModelPreflightError(text) from None
            if warning:
                for run in self.runs.values():
                    if run.plan.settings.model_path == model_path:
                        run.log.warning("preflight", warning)

    def abandon_runs(self) -> None:
        """The session stops before any row: leave no trace of the runs it opened.

        A run directory this session created is removed; one it resumed is left exactly
        as it was (nothing was appended, its metrics are not rewritten).
        """
        runs, self.runs = list(self.runs.values()), {}
        self._stop_rollouts()  # before their run directories go
        for run in runs:
            run.log.close()
            run.rundir.close()
            if run.created:
                shutil.rmtree(run.rundir.path, ignore_errors=True)

    def _stop_rollouts(self) -> None:
        """Stop every rollout server of this process (their whole process groups)."""
        if self._executor is None:
            return
        for dispatch in self._rollouts.values():
            try:
                self._executor.call(dispatch.stop(), timeout=15)
            except Exception:  # noqa: BLE001 - shutting down; the lifeline ends them too
                pass

    def close(self) -> None:
        if self._executor is not None:
            executor = self._executor
            self._stop_rollouts()
            clients = sys.modules.get("pytest_osmosis.model.client")
            if clients is not None:  # some rollout used bridge_client(): close its pool
                try:
                    executor.call(clients.close_pools(), timeout=5)
                except Exception:  # noqa: BLE001 - shutting down; nothing to report to
                    pass
            for bridge in list(self._bridges.values()):
                try:
                    executor.call(bridge.close(), timeout=5)
                except Exception:  # noqa: BLE001 - shutting down; nothing to report to
                    pass
            executor.close()
            self._executor = None
        let_streams_close()
        caches, self._caches = list(self._caches.values()), {}
        for cache in caches:
            cache.close()  # what the bridges queued is written before the session ends
        if self._restore_exit is not None:
            self._restore_exit()
            self._restore_exit = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _exit_witness(plan: EvalPlan) -> str:
    """Where a row's ``os._exit`` names the row for the next session: beside the run's lock."""
    from pytest_osmosis.results.manifest import LOCKS_DIRNAME

    return str(plan.output_root / LOCKS_DIRNAME / f"{plan.run_name}.exited")


_DEFAULT_CAPACITY = 4  # a LocalBackend without a workflow_config advertises 4 on /health


def _row_words(nodeid: str) -> str:
    """``row <source row> run <n>``: how a line names an eval item (else its node id)."""
    from pytest_osmosis.plugin.collect import split_item_nodeid

    parts = split_item_nodeid(nodeid)
    return nodeid if parts is None else f"row {parts[1]} run {parts[2]}"


_FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_fault_line(run: ControllerRun, message: str) -> str:
    """The one line a storage fault stops the session with: what failed, and what now."""
    if any(os.strerror(code) in message for code in _FULL_DISK):
        count = len(run.rundir.records)
        return (
            f"{message}; the {count} results recorded so far are kept: free space, then run "
            "the same command again to resume"
        )
    return message


def _nodeid_names(config: pytest.Config, prefix: str, path: Path) -> bool:
    """Whether a node id's file part (relative to the rootdir) is ``path``."""
    return (config.rootpath / prefix).resolve() == path.resolve()


def resumed_result(record: dict[str, Any], plan: EvalPlan) -> dict[str, Any]:
    """A recorded result as the item that reuses it reports it."""
    return outcome.resumed(record, plan.settings.pass_threshold)


@functools.cache
def _sdk_version() -> str:
    """The version trajectories name; read once (metadata lookups cost ~0.5 ms a row)."""
    from pytest_osmosis.rollout import USING_OSMOSIS_SDK

    if USING_OSMOSIS_SDK:
        from importlib.metadata import version

        return version("osmosis-ai")
    from pytest_osmosis import __version__

    return __version__
