"""Per-process eval session: its options, its runs, and the lifecycle that opens them, runs
their items and closes (planning, dispatch, the model pool, budgets and faults are each
their own module: planning.py, rollouts.py, models.py, budget.py, faults.py).

Roles: without xdist one process is both runner and controller. Under xdist the
controller plans and owns the run directories but never collects or runs items; the
workers collect, run items, and send each result to the controller on the test report.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.core import outcome
from pytest_osmosis.core.errors import (
    ModelPreflightError,
    OsmosisError,
    RunDirectoryError,
    SessionFaultError,
)
from pytest_osmosis.execution import blame
from pytest_osmosis.execution.dispatch import AUTO
from pytest_osmosis.execution.executor import (
    FDS_PER_ROW,
    BackstopExpired,
    Executor,
    fd_capacity,
    raise_fd_limit,
)
from pytest_osmosis.execution.runner import Budgets, TrajectoryWriter, WorkItem
from pytest_osmosis.execution.streams import keep_streams_open, let_streams_close
from pytest_osmosis.plugin.budget import Admission
from pytest_osmosis.plugin.faults import (
    ExitWitness,
    crashed_result,
    journal_finished,
    past_backstop,
    session_fault_result,
)
from pytest_osmosis.plugin.models import ModelPool
from pytest_osmosis.plugin.planning import Plans, reuse, reuse_source, utc_now
from pytest_osmosis.plugin.rollouts import Rollouts
from pytest_osmosis.plugin.row_output import RowCapture
from pytest_osmosis.workspace.loader import DEFAULT_MAIN_TIMEOUT, forget_loaded
from pytest_osmosis.workspace.plan import (
    EvalPlan,
    Overrides,
    choose_run_name,
    run_inputs,
    run_provenance,
)

if TYPE_CHECKING:
    from pytest_osmosis.dataset.shard import Shard
    from pytest_osmosis.gate import GateOptions, Verdict
    from pytest_osmosis.plugin.collect import EvalItem
    from pytest_osmosis.plugin.milestones import Milestones
    from pytest_osmosis.results import RunDirectory, RunLog
    from pytest_osmosis.results.index import WrittenTrajectory
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
    backstop_grace: float = 30.0
    """Ini ``osmosis_backstop_grace``: seconds beyond both budgets before pytest-timeout fires."""
    judge_models: tuple[str, ...] = ()
    """Ini ``osmosis_judge_models``: judge models a rollout's grader may reach (models.py)."""

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
    #: Whether pytest selected any of its items (-k, --deselect, --lf; None: not known).
    #: One it selected none of is no run of this session (EvalSession.drop_unselected).
    selected: bool | None = None
    #: Its config failed to collect (a rollout server that never became healthy): the
    #: run stays, with the logs.txt that says why, though no item of it was selected.
    collect_failed: bool = False
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

    @property
    def unselected(self) -> bool:
        """pytest selected none of its items though it had some (``-k`` of another config's
        rows): no run of this session (EvalSession.drop_unselected). Never one that
        ``--osmosis-reuse`` recorded into, nor one with no items to select (an empty
        ``--osmosis-shard`` is a finished run of none), nor one whose config failed to
        collect (its items were never there to select)."""
        if self.selected is not False or self.collect_failed or self.reused:
            return False
        return len(self.plan.work_keys()) > 0


class EvalSession:
    """One pytest process's eval session: it owns the jobs and runs the rows.

    Each job is its own object with one reason to change: ``plans`` (planning.py),
    ``rollouts`` (how rows run: the dispatch seam, rollouts.py), ``models`` (the bridges,
    caches and preflight: models.py), ``admission`` (the budgets: budget.py); faults.py
    says what happens when something other than a row's result ends a row. What is left
    here is the session's lifecycle: open the runs, run the items, close.
    """

    def __init__(
        self, config: pytest.Config, options: SessionOptions, *, is_worker: bool, collect_all: bool
    ) -> None:
        self.config = config
        self.options = options
        self.is_worker = is_worker
        self.collect_all = collect_all
        forget_loaded()  # each session imports its rollouts as they are now
        self.plans = Plans(config, options)
        self.rollouts = Rollouts(
            config,
            options,
            is_worker=is_worker,
            warn_once=self.warn_once,
            phase=self.phase,
        )
        self.models = ModelPool(config, options, self.phase)
        self.admission = Admission(is_worker=is_worker)
        self._journals: dict[Path, dict[tuple[int, int], dict[str, Any]]] = {}
        self._executor: Executor | None = None
        #: What each row's code prints, for its own report (row_output.py).
        self.row_output = RowCapture()
        self._prefetched = False
        self._worker_prefetch = False
        self._blame_slot: tuple[str, str] | None = None
        self._slot: blame.Slot | None = None
        #: A worker on another host (execution/remote.py): its attempts' files go to this
        #: scratch directory, then back to the controller on their reports.
        self._scratch: Path | None = None
        self._trial_files: dict[str, dict[str, bytes]] = {}
        self._controller_paths: dict[str, str] = {}  # this host's config path -> controller's
        #: A single process names the row whose code calls ``os._exit`` (faults.py).
        self._exits = None if is_worker else ExitWitness(self.seal)
        self.runs: dict[Path, ControllerRun] = {}
        self.verdict: Verdict | None = None
        self._prefixes: dict[str, Path | None] = {}  # node id file part -> config (item_key)
        self._positions: dict[Path, dict[int, int]] = {}  # dataset row -> selection position
        self._warned: set[str] = set()  # the lines warn_once has written
        self.milestones: Milestones | None = None
        """Start-up phases on the controller's terminal (set by the controller role)."""
        self.faulted = False
        """A row met a fault of the whole session (``SessionFaultError``): what finished
        after it may have run on what broke (a changed dataset), so it is not journalled."""
        #: ``--osmosis-regrade``: the config of the run graded again (``regrade``).
        self.regrade_config: Path | None = None
        from pytest_osmosis.plugin.collect import properties_wanted

        #: Whether rows' reports carry ``osmosis_*`` JUnit properties (collect.py).
        self.properties = properties_wanted(config)
        raise_fd_limit()  # before any bridge sizes its connection cap from it

    @property
    def regrade(self) -> SourceRun | None:
        """``--osmosis-regrade``: the run whose samples are graded again (regrade.py sets it).

        Kept by the plans (its rows, attempts and model are their overrides); the rollouts
        are told that rows are graded in process, so neither asks the session back.
        """
        return self.plans.regrade

    @regrade.setter
    def regrade(self, source: SourceRun | None) -> None:
        self.plans.regrade = source
        self.rollouts.regrading = source is not None

    def set_worker_input(self, workerinput: dict[str, Any]) -> None:
        """What the xdist controller decided: run directory names, whether shards are ours."""
        self.plans.run_names.update(workerinput.get("osmosis_runs", {}))
        self._worker_prefetch = bool(workerinput.get("osmosis_prefetch", False))
        if workerinput.get("osmosis_budget_dir"):
            from pytest_osmosis.plugin.budget import Tickets

            self.admission.tickets = Tickets(
                Path(workerinput["osmosis_budget_dir"]), str(workerinput["workerid"])
            )
        blame_dir = workerinput.get("osmosis_blame_dir")
        self._blame_slot = (str(blame_dir), str(workerinput["workerid"])) if blame_dir else None
        if workerinput.get("osmosis_regrade"):
            from pytest_osmosis.plugin.regrade import take_worker_input

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

        regrade = self.regrade
        now = utc_now()
        several = len(config_paths) > 1
        names: dict[str, str] = {}
        planned: list[tuple[Path, EvalPlan, dict[str, Any]]] = []
        for path in config_paths:
            path = path.resolve()
            try:
                plan = self.plans.build(path)
                inputs = run_inputs(plan)
                if regrade is not None:
                    regrade.check_inputs(inputs, path)
                    inputs = regrade.regrade_inputs(inputs)
                plan.run_name = choose_run_name(plan, self.options.name, inputs, now, several)
                if regrade is not None:
                    regrade.check_target(plan.run_dir)
                # Secrets first: the rollout's import code may read (or print) them.
                required = plan.config.secrets.required
                resolved = resolve_secrets(
                    required, self.options.secrets_file, config=self.config, config_path=path
                )
                add_named_secrets(self.config, required, resolved)
                # A rollout that cannot be imported must fail before its run directory exists.
                with self.phase(f"importing rollout {plan.rollout_dir.name}"):
                    self.rollouts.load(plan)
                self.rollouts.warn_loaded(plan)
                source = reuse_source(self.options, plan, inputs)
            except (RunDirectoryError, MissingSecretsError, SecretsFileError, RegradeError):
                raise
            except OsmosisError as exc:
                self.plans.errors[path] = exc  # collection reports it, naming the file
                continue
            planned.append((path, plan, inputs))
        if self.plans.errors and not self.config.option.continue_on_collection_errors:
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
            reused, reuse_note = reuse(self.options, plan, rundir, source, log)
            keys = plan.work_keys()
            pending = len(rundir.pending(keys))
            log.write(
                "info", "run", f"{plan.run_name}: {pending} of {len(keys)} work items pending"
            )
            self.plans.plans[path] = plan
            self._journals[path] = rundir.records
            self.runs[path] = ControllerRun(
                plan=plan,
                rundir=rundir,
                log=log,
                started_at=now,
                pending_at_start=pending,
                created=created,
                execution=self.rollouts.shown_execution(plan),
                reused=reused,
                reuse_note=reuse_note,
            )
            names[str(path)] = plan.run_name
            if pending:
                self.rollouts.start_early(plan, self.executor)
        if self._exits is not None:
            self._exits.record_killed_rows(self.runs, self.item_key)
        return names

    def journal_finished(self, *, wait: bool = True) -> None:
        """Journal the rows that finished ahead but were not reported yet (faults.py)."""
        if self._executor is None or self.faulted:
            return
        journal_finished(self._executor, self.runs, self.item_key, wait=wait)

    def seal(self, *, wait: bool = True) -> None:
        """The session is ending: journal the rows that finished ahead, then nothing more
        (RunDirectory.seal: a row finishing later is not kept), so what a line says was kept
        is what the journals hold when the process exits."""
        self.journal_finished(wait=wait)
        for run in self.runs.values():
            run.rundir.seal()

    def kept(self) -> int:
        """Work items the runs' journals hold for good (sealed first): every stop line's count."""
        return sum(run.rundir.kept() for run in self.runs.values())

    def phase(self, doing: str) -> contextlib.AbstractContextManager[None]:
        """A start-up milestone around a phase that can take a while (milestones.py)."""
        if self.milestones is None:
            return contextlib.nullcontext()
        return self.milestones.phase(doing)

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
            if not self.config.pluginmanager.has_plugin("dsession"):  # this process runs rows
                self.row_output.install(self.config)
            self._executor = Executor(self._concurrency(), may_start=self.admission.may_start)
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
        """``--osmosis-concurrency``, else what ``osmosis eval run`` picks for the configs."""
        if self.options.concurrency:
            return self.options.concurrency
        return self.rollouts.concurrency(list(self.plans.plans.values()))

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
                if self.models.rows_need_litellm(model) and self.options.cache_mode != "replay":
                    import_litellm()
            except ModelPreflightError as exc:
                pytest.exit(
                    f"model preflight failed for {model!r}: {exc}",
                    returncode=pytest.ExitCode.USAGE_ERROR,
                )
            self.executor.concurrency = self._concurrency()
            if not self.is_worker:
                items = item.session.items  # from this one: pytest is done with those before
                at = next((i for i, other in enumerate(items) if other is item), 0)
                self._prefetch(items[at:])
        if self.is_worker and self._worker_prefetch:
            # xdist sends this worker whole shards; start what was queued for it since.
            from pytest_osmosis.plugin.xdist import newly_queued_indices

            items = item.session.items
            self._prefetch([items[i] for i in newly_queued_indices(self.config) if i < len(items)])

    def wait_to_start(self, item: EvalItem) -> str | None:
        """Under a budget: start ``item`` once it is admitted (budget.py), or return the line
        that stops the session when it never will."""
        factory = lambda: self._execute(item)  # noqa: E731
        return self.admission.wait_to_start(
            lambda: self.executor.start(item.nodeid, factory),
            reportable=lambda: self.may_report(item),
            recorded=lambda: self.carried_forward(item) is not None,
            logs=lambda: [run.log for run in self.runs.values()],
        )

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
                return past_backstop(self.executor, item, factory, exc)
        except SessionFaultError as exc:  # nothing can be trusted now: stop, rows pending
            line = f"osmosis: {exc}"
            self.faulted = True  # rows finished after it are not kept either (journal_finished)
            if self.is_worker:
                # pytest.exit on a worker leaves xdist's controller holding rows it can place
                # nowhere (INTERNALERROR): take no more rows, and let the controller stop.
                item.session.shouldstop = line
                return session_fault_result(item, line)
            pytest.exit(line, returncode=pytest.ExitCode.USAGE_ERROR)

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
        return None if found is None else crashed_result(self.runs[found[0]], found, why)

    def _prefetch(self, items: list[pytest.Item]) -> None:
        from pytest_osmosis.plugin.collect import EvalItem

        for other in items:
            if (
                isinstance(other, EvalItem)
                and not _marked_to_skip(other)
                and self.carried_forward(other) is None
            ):
                self.executor.submit(other.nodeid, lambda other=other: self._execute(other))  # type: ignore[misc]

    async def _execute(self, item: EvalItem) -> dict[str, Any]:
        blame.enter(item.nodeid)  # a crash in this row's code is pinned on it (xdist workers)
        self.row_output.open(item.nodeid)  # and what it prints is shown in its own report
        if self.regrade is not None:
            from pytest_osmosis.plugin.regrade import kept_result

            kept = kept_result(self.regrade, item)
            if kept is not None:  # its workflow failed: nothing to grade again
                return kept
        from pytest_osmosis.plugin.redaction import redactor_for
        from pytest_osmosis.results import build_trajectory, prepare_trial_dir, write_trajectory
        from pytest_osmosis.results.redact import redact_trajectory

        redactor = redactor_for(self.config)

        plan = item.parent.plan
        dispatch = self.rollouts[plan.config_path]
        row = plan.dataset.row(item.row_index)
        work = WorkItem(
            row_index=item.row_index,
            run_index=item.run_index,
            source_row_index=row.source_row_index,
            prompt=row.initial_messages,
            label=row.label,
            metadata=row.metadata,
        )
        bridge = await self.models.bridge(plan.settings.model_path)
        bridge.allow_judge_models(self.models.judge_models(dispatch))
        cache = self.models.call_cache(plan.output_root)
        cached = (
            cache.attempt(plan.config.experiment.dataset, row.source_row_index, item.run_index)
            if cache is not None
            else None
        )
        # A remote worker writes into its scratch directory (its report carries the files).
        run_dir = plan.run_dir if self._scratch is None else self._scratch / plan.run_name
        storage_faults: list[str] = []
        written: list[WrittenTrajectory] = []  # handed to the run directory (stage, settle)

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
            trial_dir = os.path.join(run_dir, "rollout_trials", rollout_id)  # a str: per row
            try:
                wrote = write_trajectory(trial_dir, redact_trajectory(doc, redactor))
            except OSError as exc:  # a full disk: the controller stops, this row stays pending
                storage_faults.append(f"cannot write a trajectory in {trial_dir}: {exc}")
                return False
            if wrote is not None:
                written.append(wrote)
            return True

        prepare: Callable[[str], Path | None] = lambda rid: prepare_trial_dir(run_dir, rid)  # noqa: E731
        writer: TrajectoryWriter = save_trajectory
        recorded = None
        if self.regrade is not None:  # the recorded sample, graded again (regrade.py)
            from pytest_osmosis.plugin.regrade import regrade_steps

            recorded, prepare, writer = regrade_steps(self.regrade, item, redactor, storage_faults)
        try:
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
        except SessionFaultError:
            self.faulted = True  # no row finishing after it is journalled (stage)
            raise
        if storage_faults:
            result = {**result, "storage_fault": storage_faults[0]}
        if self._scratch is not None and result.get("rollout_id"):
            from pytest_osmosis.execution.remote import pack_trial

            rollout_id = str(result["rollout_id"])
            self._trial_files[rollout_id] = pack_trial(run_dir / "rollout_trials" / rollout_id)
        self.stage(plan, result, written[-1] if written else None)
        return result

    def stage(
        self, plan: EvalPlan, result: dict[str, Any], trajectory: WrittenTrajectory | None = None
    ) -> None:
        """Hand a finished row to its run's journal now (group commit, RunDirectory.stage):
        the controller's record then only waits for its fsync. Only where the run is ours
        (the row's process in one process, the controller as a worker's report arrives).
        *trajectory*: what this process wrote of the row's trajectory, so settling the row
        neither reads nor parses it again."""
        run = self.runs.get(plan.config_path)
        if run is None or self.faulted or run.storage_fault or result.get("storage_fault"):
            return
        if outcome.is_infrastructure(result):
            return  # pytest-rerunfailures may run it again: only its last report is journalled
        run.rundir.stage(result, trajectory)

    def abandon_runs(self) -> None:
        """The session stops before any row: leave no trace of the runs it opened.

        A run directory this session created is removed; one it resumed is left exactly
        as it was (nothing was appended, its metrics are not rewritten).
        """
        runs, self.runs = list(self.runs.values()), {}
        if self._executor is not None:
            self.rollouts.stop_all(self._executor)  # before their run directories go
        for run in runs:
            self.let_go(run)

    def collection_failed(self, config_path: Path) -> None:
        """The config at *config_path* failed to collect (``ControllerRun.collect_failed``)."""
        for path, run in self.runs.items():
            if path == config_path or path.resolve() == config_path.resolve():
                run.collect_failed = True

    def drop_unselected(self) -> None:
        """Let go of the runs none of whose items pytest selected (``-k nothing``): they
        are no runs of this session, as if it had stopped before any row of theirs
        (``abandon_runs``); which runs those are is ``ControllerRun.unselected``."""
        for path, run in list(self.runs.items()):
            if run.unselected:
                del self.runs[path]
                if self._executor is not None:  # before its run directory goes
                    self.rollouts.stop(path, self._executor)
                self.let_go(run, take_back_log=True)

    def let_go(self, run: ControllerRun, *, take_back_log: bool = False) -> None:
        """Close a run this session recorded nothing into; the run directory it created is
        removed. *take_back_log*: a resumed run's ``logs.txt`` loses what this session
        wrote there too (its "pending" line), so the run is byte for byte as it was."""
        if take_back_log:
            run.log.take_back()
        else:
            run.log.close()
        run.rundir.close()
        if run.created:
            shutil.rmtree(run.rundir.path, ignore_errors=True)

    def close(self) -> None:
        if self._executor is not None:
            executor = self._executor
            self.rollouts.stop_all(executor)
            self.models.close(executor)
            executor.close()
            self._executor = None
        self.plans.close()  # after the rows: none reads the dataset any more
        self.row_output.uninstall()
        let_streams_close()
        self.models.close_caches()
        if self._exits is not None:
            self._exits.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _marked_to_skip(item: pytest.Item) -> bool:
    """Whether pytest will skip ``item`` whatever happens (a ``skip`` mark, a ``skipif``
    whose condition is ``True``, as a conftest adds them): its row is not started ahead.
    Only the item's own marks, and no condition string is evaluated (that is pytest's):
    a row skipped otherwise may start, and is cancelled when pytest skips it (if it has not
    finished: then it is recorded, as every finished row is)."""
    for mark in item.own_markers:
        if mark.name == "skip":
            return True
        conditions = (*mark.args, mark.kwargs.get("condition"))
        if mark.name == "skipif" and any(condition is True for condition in conditions):
            return True
    return False


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
