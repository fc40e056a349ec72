"""The controller role: the process that owns the run directories and decides the exit status.

Without xdist the one process is the controller (and runs the rows too); under xdist it is
the process that starts the workers and never runs a row. Everything the controller does
is a method here: check and open runs before any row (``start``), journal each result
before anything reports it (``record``), show progress (``after_report``), and write the
final snapshots, reports, the gate and the results table (``finish``, ``summary``). The
hooks in plugin.py are one call each into this object, registered only where this role
is played (as xdist registers ``DSession`` on its controller alone).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

# Imported with the controller, not by the first result: a module first imported on the main
# thread while rows run is parsed there (pytest rewrites a plugin's asserts), which
# EvalItem._repr_failure_py keeps the main thread from doing (CPython gh-106905 on 3.11).
from pytest_osmosis.plugin.faults import recording, storage_fault_at_finish
from pytest_osmosis.results.row_metrics import cost_of

if TYPE_CHECKING:
    from pytest_osmosis.plugin.progress import Progress
    from pytest_osmosis.plugin.session import ControllerRun, EvalSession

#: (node id, config path, row_index, run_index) of a recorded item a finished run deselected.
RecordedEntry = tuple[str, str, int, int]


class Controller:
    """Journal, progress, finished-run exit status, reports and gate of one session."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        self.progress: Progress | None = None
        #: Results recorded whose item pytest has not finished reporting, by node id, with the
        #: report that carried it: under xdist two workers' reports interleave, so one slot
        #: would drop a row's progress.
        self._unshown: dict[str, tuple[dict[str, Any], pytest.TestReport]] = {}
        self._letterless: pytest.TestReport | None = None  # live progress: see letterless
        #: pytest-rerunfailures' reports of executions it runs again, by node id: they carry
        #: that execution's result until logfinish too (pytest keeps them to the end).
        self._reruns: dict[str, list[pytest.TestReport]] = {}
        from pytest_osmosis.plugin.options import progress_mode

        self.progress_option = progress_mode(session.config)
        self.started = time.monotonic()  # live progress counts elapsed time from here
        #: A result's "config" string -> its Path, made once (a Path's str and hash are
        #: computed once per object: a new one per row cost more than the lookup).
        self._config_paths: dict[str, Path] = {}
        #: The line and exit status a session ends with before any row (the plan alone, a
        #: declined prompt): nothing is collected or run, and the line is printed once.
        self.stopped: tuple[str, int] | None = None
        #: Rows of workers on other hosts: the ``osmosis_trajectory`` property of the file
        #: this controller wrote, for the item's teardown report (name_trajectory).
        self._trajectories: dict[str, list[tuple[str, Any]]] = {}
        #: xdist: the models start() left to check_models (None: nothing left to check),
        #: and the terminal's output held meanwhile.
        self._unchecked: list[str] | None = None
        self._held: HeldOutput | None = None
        #: xdist: a config cannot be planned, so this process collects (and stops there).
        self.collects_here = False

    # -- before any row -------------------------------------------------------------

    def start(self, session: pytest.Session) -> None:
        """Check our dependencies, open run directories and check the models, all before
        any row starts (a failure is one line, exit 4)."""
        from pytest_osmosis.core.errors import OsmosisError
        from pytest_osmosis.model.preflight import check_dependencies
        from pytest_osmosis.plugin.discover import is_eval_config, named_paths

        problem = check_dependencies(getattr(session.config, "cache", None))
        if problem is not None:
            raise pytest.UsageError(problem)
        options = self.session.options
        from pytest_osmosis.plugin import start_up_milestones
        from pytest_osmosis.plugin.discover import find_eval_configs

        milestones = self.session.milestones or start_up_milestones(session.config)
        self.session.milestones = milestones

        named = named_paths(session.config)
        if self.session.collect_all:
            configs = find_eval_configs(session.config, named)
        else:
            configs = [p for p in named if is_eval_config(p) and p.is_file()]
        try:
            if options.regrade:
                from pytest_osmosis.plugin.regrade import choose_regrade

                configs = choose_regrade(self.session, session.config, configs)
            if options.plan or session.config.option.collectonly:
                from pytest_osmosis.plugin.preview import show_plan

                line = show_plan(self.session, session.config, configs)
                if line is not None:  # --osmosis-plan: the plan alone
                    self.stopped = (line, pytest.ExitCode.OK)
                return
            self.session.open_runs(configs)
        except OsmosisError as exc:
            raise pytest.UsageError(str(exc)) from None
        self._stop_xdist_on_plan_errors(session)
        if options.confirm:
            from pytest_osmosis.plugin.preview import confirm

            line = confirm(self.session, session.config)
            if line is not None:  # declined: as an interrupt before any row
                self.stopped = (line, pytest.ExitCode.INTERRUPTED)
                return
        pending = self.session.models.pending  # where each model's bridge runs (models.py)
        models: list[str] = []  # one entry a run with rows pending
        for run in self.session.runs.values():
            count = len(run.rundir.pending(run_keys(run.plan)))
            if count:
                model = run.plan.settings.model_path
                pending[model] = pending.get(model, 0) + count
                models.append(model)
        self._check_gate(models)
        gate = self.session.options.gate
        if (
            gate.budgeted
            and self.session.admission.budget is None
            and not xdist_controller(session)
        ):
            from pytest_osmosis.plugin.budget import Budget, budget_values

            self.session.admission.budget = Budget(*budget_values(gate.values))
        if xdist_controller(session) and not self.collects_here:
            self._unchecked = models  # checked while xdist's workers start (check_models)
            self._held = HeldOutput(session.config)
            return
        self.check_models(session, models)

    def release_output(self) -> None:
        """Write what the terminal was sent since start() left the models to check."""
        if self._held is not None:
            self._held.release()
            self._held = None

    def check_models(self, session: pytest.Session, models: list[str] | None = None) -> None:
        """Check the models before any row (a failure is one line, exit 4), then say what
        runs. In one process within :meth:`start`; under xdist after xdist started its
        workers, so they import and collect while the models are checked (no row starts
        before xdist's run loop, after this). Nothing a worker is sent depends on it.

        Under xdist what the terminal was sent in between (pytest's header, "bringing up
        nodes...") was held: it follows this check's lines, as it did when the workers
        started after the check, and a failed check drops it (its line is all there is).
        """
        if models is None:
            models, self._unchecked = self._unchecked, None
            if models is None:  # start() stopped before its checks (the plan, a "no")
                return
        held, self._held = self._held, None
        if held is not None:
            held.stop()
        try:
            self._check_models(session, models)
        except BaseException:
            if held is not None:
                held.text = ""
            raise
        finally:
            if held is not None:
                held.release()

    def _check_models(self, session: pytest.Session, models: list[str]) -> None:
        from pytest_osmosis.core.errors import OsmosisError

        milestones = self.session.milestones
        assert milestones is not None
        if not models:
            milestones.finish()
            self._announce(session.config)
            return
        # xdist's controller runs no rows (no LiteLLM here); each worker imports LiteLLM
        # before its first row.
        try:
            # The model-call cache is opened here first: a bad one stops the session.
            checked = [
                model
                for run in self.session.runs.values()
                if run.rundir.pending(run_keys(run.plan))
                for model in self.session.models.models_to_check(
                    run,
                    regrading=self.session.regrade is not None,
                    rollout=self.session.rollouts.get(run.plan.config_path),
                )
            ]
            self.session.models.preflight(
                checked,
                lambda: self.session.executor,
                self.session.runs.values(),
                in_process=not xdist_controller(session),
            )
        except OsmosisError as exc:
            # pytest_sessionfinish does not run after a usage error: nothing is recorded.
            self.session.abandon_runs()
            self.session.close()
            raise pytest.UsageError(str(exc)) from None
        milestones.finish()
        self._announce(session.config)

    def _announce(self, config: pytest.Config) -> None:
        """What is about to run, before the first row (next_steps.py)."""
        from pytest_osmosis.plugin.next_steps import start_lines

        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:  # -p no:terminal
            return
        for line in start_lines(self.session, config):
            reporter.write_line(line)

    def _stop_xdist_on_plan_errors(self, session: pytest.Session) -> None:
        """A config that cannot be planned stops a single process at collection (exit 2,
        nothing opened: ``open_runs``); xdist does not stop on a worker's collection error,
        so its workers would run the other configs (exit 1). Under xdist this controller
        then collects as one process does, for the same error once and exit 2: xdist's
        workers are stopped as soon as xdist started them (``collects_here``, read by
        XdistControllerHooks.pytest_sessionstart), and say nothing."""
        errors = self.session.plans.plan_errors()
        config = session.config
        if not errors or config.option.continue_on_collection_errors:
            return
        if not config.pluginmanager.has_plugin("dsession"):
            return
        self.collects_here = True
        reporter = config.pluginmanager.get_plugin("terminaldistreporter")
        if reporter is not None:  # its "bringing up nodes..." would be the only trace
            config.pluginmanager.unregister(reporter)

    def _check_gate(self, models: list[str]) -> None:
        """The gate's options against the runs, before any row (one line, exit 4)."""
        from pytest_osmosis.baseline import CurrentRun
        from pytest_osmosis.gate import GateOptionError, check_runs, detection_lines

        gate = self.session.options.gate
        try:
            check_runs(
                gate,
                [
                    CurrentRun(
                        run.plan.run_name,
                        run.plan.run_dir,
                        run.rundir.manifest["inputs"],
                        run.plan.settings.pass_threshold,
                        run.plan.dataset,
                    )
                    for run in self.session.runs.values()
                ],
            )
            if gate.values.get("max_cost") is not None:
                from pytest_osmosis.model.litellm import has_price

                for model in sorted(set(models)):
                    if not has_price(model):
                        raise GateOptionError(
                            f"--osmosis-max-cost: model {model!r} has no price in LiteLLM's "
                            "local cost map, so a cost budget cannot be kept "
                            "(use --osmosis-max-tokens)"
                        )
        except GateOptionError as exc:
            self.session.abandon_runs()
            self.session.close()
            raise pytest.UsageError(str(exc)) from None
        reporter = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if gate.values.get("max_regression") is None or reporter is None:
            return
        for name, baseline in gate.baselines.items():  # what the gate can tell, before any row
            reporter.write_line(
                f"osmosis gate: {name} against baseline {baseline.run['name']}: "
                f"{baseline.match.text()}"
            )
            for line in detection_lines(gate.values, baseline):
                reporter.write_line(f"osmosis gate: {line}")

    def keep_recorded(self, entries: list[RecordedEntry]) -> None:
        """Note the recorded items a finished run deselected: --junitxml still lists them."""
        for nodeid, config_path, row_index, run_index in entries:
            run = self.session.runs.get(Path(config_path))
            if run is not None:
                run.recorded_items.append((nodeid, (row_index, run_index)))

    # -- each row -------------------------------------------------------------------

    def record(self, report: pytest.TestReport) -> None:
        """Journal the result a report carries, before anything reports it."""
        from pytest_osmosis.plugin.rerun import is_rerun
        from pytest_osmosis.results.atomic import interrupt_held

        if is_rerun(report):  # pytest-rerunfailures runs it again: the last attempt counts
            if getattr(report, "osmosis", None) is not None:  # let go at logfinish, as below
                self._reruns.setdefault(report.nodeid, []).append(report)
            return
        result = getattr(report, "osmosis", None)
        if self.progress is not None and self.progress.replaces_letters:
            self._letterless = report if result is not None else None
        if result is None and report.failed and str(report.when) == "???":
            # xdist lost the worker running this item (os._exit, a segfault, OOM kill).
            result = self.session.crashed_result(report.nodeid, str(report.longrepr))
            if result is not None:
                report.osmosis = result  # type: ignore[attr-defined]
        if result is None:
            return
        if result.get("session_fault"):  # an xdist worker met a fault of the whole session
            pytest.exit(str(result["session_fault"]), returncode=pytest.ExitCode.USAGE_ERROR)
        run = self._run_of(result)
        if run is None:
            return
        with recording(run, result):  # a full disk or a deleted run: exit 4
            files = getattr(report, "osmosis_files", None)
            if files:  # a worker on another host sent its attempt's files (execution/remote.py)
                from pytest_osmosis.execution.remote import unpack_trial
                from pytest_osmosis.plugin.collect import trajectory_property
                from pytest_osmosis.results.index import TRIALS_DIRNAME

                unpack_trial(run.rundir.path / TRIALS_DIRNAME / result["rollout_id"], files)
                if self.session.properties:
                    self._trajectories[report.nodeid] = trajectory_property(
                        run.plan.run_dir, result["rollout_id"]
                    )
            with interrupt_held():  # the run's count agrees with its journal
                record = run.rundir.append(result)
                run.executed += 1
            run.rate_limited += int(result.get("rate_limited") or 0)
            self._spend(run, result, report)
            run.cache_calls += int(result.get("cache_calls") or 0)
            run.cache_hits += int(result.get("cache_hits") or 0)
            if str(report.when) == "???":
                self._show(result)  # xdist finishes no report for a lost worker's row
            else:
                self._unshown[report.nodeid] = (result, report)
            details = {k: result[k] for k in ("rollout_id", "row_index", "run_index", "status")}
            if result.get("reward") is not None:
                details["reward"] = result["reward"]
            if result.get("error_type"):
                details["error_type"] = result["error_type"]
            run.log.write("info", "result", "work item finished", **details)
            if result.get("trajectory_problem"):
                where = f"row {result.get('source_row_index')} run {result['run_index']}"
                problem = f"{where}: {result['trajectory_problem']}"
                run.no_trajectory.append(problem)  # the results table counts them
                run.log.warning("result", problem, rollout_id=result["rollout_id"])
            self.session.config.hook.pytest_osmosis_row_result(
                config=self.session.config, result=result
            )
            if result.get("detail"):
                run.log.write(
                    "error",
                    "result",
                    result.get("message", ""),
                    rollout_id=result["rollout_id"],
                    detail=result["detail"],
                )
        run.rundir.settle((record["row_index"], record["run_index"]))

    def _run_of(self, result: dict[str, Any]) -> ControllerRun | None:
        """The run that journals ``result``: None for another session's row or a row
        resumed from the journal (it is recorded already)."""
        config_path = self._config_paths.get(result["config"])
        if config_path is None:
            config_path = self._config_paths.setdefault(result["config"], Path(result["config"]))
        run = self.session.runs.get(config_path)
        return None if run is None or result.get("resumed") else run

    def stage(self, report: pytest.TestReport) -> None:
        """xdist: hand a worker's result to its run's journal as the report arrives.

        Called in execnet's receiver thread, before the report waits its turn in xdist's
        queue: the results that arrive while the main thread records one share the next
        fsync (group commit, RunDirectory.stage), and :meth:`record` only waits for it.
        Recorded one at a time, each waited for its own fsync (~3 ms), and the main thread,
        not the rows, set the pace of 200 ms rows. What :meth:`record` would not journal
        is not staged, nor a row of a worker on another host (its trajectory's files come
        with the report, and record() writes them before the journal names the row); a
        failure here is left for record() to meet and report. A worker's session fault
        stops the staging, as it stops the journal in one process (``session.faulted``):
        record() stops the session at its report, and no result arriving after it is kept.
        """
        from pytest_osmosis.plugin.rerun import is_rerun

        result = getattr(report, "osmosis", None)
        if not isinstance(result, dict) or is_rerun(report):
            return
        if result.get("session_fault"):
            self.session.faulted = True
            return
        if getattr(report, "osmosis_files", None):
            return
        try:
            run = self._run_of(result)
            if run is not None:
                self.session.stage(run.plan, result)
        except Exception:  # noqa: BLE001 - never in xdist's receiver thread; record() meets it
            return

    def name_trajectory(self, report: pytest.TestReport) -> None:
        """A row a worker on another host ran: its teardown report, the one JUnit reads
        properties from, names the trajectory this controller wrote, as a local row's does
        (that worker had no run directory to find it in)."""
        if report.when != "teardown" or not self._trajectories:
            return
        found = self._trajectories.pop(report.nodeid, None)
        if found is not None:
            kept = [p for p in report.user_properties if p[0] != "osmosis_trajectory"]
            report.user_properties = kept + found

    def _spend(self, run: ControllerRun, result: dict[str, Any], report: Any) -> None:
        """Count what the row spent; once a budget is spent no new row starts."""
        cost = cost_of(result.get("cost_usd"))
        run.costs[str(result["rollout_id"])] = cost
        budget = self.session.admission.budget
        if budget is None:
            return
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        budget.record(int(result.get("tokens") or 0), cost, worker)
        self._budget_check()

    def _budget_check(self) -> None:
        """xdist: once a budget is spent and no row is in flight, the workers stop; in one
        process the queued rows are offered the room the row just recorded left."""
        budget = self.session.admission.budget
        if budget is None or self.session.admission.stop_line is not None:
            return
        if budget.shared is None:
            if self.session._executor is not None:
                self.session._executor.pump()
        elif budget.spent() and budget.in_flight() == 0:
            self.session.admission.stop_starting(
                budget.stop_line(), [run.log for run in self.session.runs.values()]
            )

    def worker_gone(self, node: Any) -> None:
        """xdist: a worker is down; the rows it started and never reported do not count."""
        budget = self.session.admission.budget
        if budget is not None:
            budget.worker_gone(str(node.gateway.id))
            self._budget_check()

    def after_report(self, nodeid: str) -> None:
        """Progress, after pytest has shown the row's letter; then the report lets go of
        the result.

        Every plugin has seen the item's reports by now (``pytest_runtest_logfinish``:
        JUnit, pytest-html and the terminal read them as they are logged), and the journal
        holds the result; pytest keeps every report to the end of the session, so a copy
        of each row's result there was ~0.5 KB a row for nobody.
        """
        self._letterless = None
        for rerun in self._reruns.pop(nodeid, ()):
            let_go(rerun)
        shown = self._unshown.pop(nodeid, None)
        if shown is not None:
            result, report = shown
            self._show(result)
            let_go(report)

    def _show(self, result: dict[str, Any]) -> None:
        self._progress().add(result)

    def before_row(self) -> None:
        """The first item starts: the status line goes up (the totals are known by now)."""
        self._progress()

    def letterless(self, report: pytest.TestReport) -> bool:
        """Whether pytest shows no letter for this report: its progress line stands in."""
        return report is self._letterless

    def _progress(self) -> Progress:
        """Progress on the results table's basis: what earlier sessions recorded counts."""
        if self.progress is None:
            from pytest_osmosis.core.outcome import OUTCOMES, classify
            from pytest_osmosis.plugin.progress import Progress, mode_for

            config = self.session.config
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            mode = mode_for(self.progress_option, reporter, capture=config.getoption("capture"))
            total = tokens = 0
            recorded = dict.fromkeys(OUTCOMES, 0)
            earlier = []
            for run in self.session.runs.values():
                if run.unselected:  # no run of this session (drop_unselected)
                    continue
                threshold = run.plan.settings.pass_threshold
                total += run.pending_at_start if run.to_run is None else run.to_run
                for key in run.rundir.resumed_keys - run.rerun:
                    record = run.rundir.records[key]
                    recorded[classify(record, threshold)] += 1
                    tokens += int(record.get("tokens") or 0)
                    earlier.append(record)
            total += sum(recorded.values())
            self.progress = Progress(
                reporter,
                total,
                recorded=recorded,
                recorded_tokens=tokens,
                mode=mode,
                verbosity=int(config.get_verbosity()),
                in_flight=self.session.rows_in_flight,
                started=self.started,
            )
            for record in earlier:
                self.progress.add_cost(record)
            self.progress.start()
        return self.progress

    # -- the end --------------------------------------------------------------------

    def arm_second_interrupt(self) -> None:
        """After the first Ctrl-C the session winds down (snapshots, reports); a second one
        ends it at once, in one line and exit 2, instead of a traceback from wherever it
        lands. What the journal holds is kept (each append is whole: interrupt_held)."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        self.session.journal_finished()  # the rows that finished ahead are kept, whatever comes
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return  # the second Ctrl-C is already someone's (the preflight's: contract D16)

        def stop_now(signum: int, frame: Any) -> None:
            import os
            import sys

            try:  # rows finished since the first Ctrl-C; only locks this thread may re-take
                self.session.seal(wait=False)
            except Exception:  # noqa: BLE001 - leaving anyway; what is journalled stays
                pass
            runs = list(self.session.runs.values())
            where = f" in {runs[0].plan.run_dir}" if len(runs) == 1 else ""
            try:  # what the journals hold at exit: nothing is journalled after this count
                kept = f"{self.session.kept()} results kept"
            except Exception:  # noqa: BLE001 - no number rather than a wrong one
                kept = "what was journalled is kept"
            line = f"\nosmosis: stopped; {kept}{where} (run the same command again to resume)\n"
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed or broken stream
                    pass
            try:
                os.write(2, line.encode())
            except OSError:
                pass
            os._exit(int(pytest.ExitCode.INTERRUPTED))

        signal.signal(signal.SIGINT, stop_now)

    def finish(self, session: pytest.Session) -> None:
        """Write the final snapshot, then apply the gate; the session is closed either way."""
        self._letterless = None
        for nodeid in [*self._unshown, *self._reruns]:  # items pytest never finished
            self.after_report(nodeid)
        if self.progress is not None:
            self.progress.stop()  # before anything below prints
        try:
            self.session.drop_unselected()  # no runs of this session (-k nothing of theirs)
            stopped_before = {path for path, run in self.session.runs.items() if run.storage_fault}
            # Nothing paid for is lost, however the session ends; nothing is journalled after
            # this either, so the snapshots and the lines below count what the journals hold.
            self.session.seal()
            interrupted = session.shouldstop or session.shouldfail
            for path, run in self.session.runs.items():
                stopped = path in stopped_before
                run.metrics = finalize_run(run, cancelled=bool(interrupted))
                if run.metrics:
                    run.row_metrics = self._row_metrics(run)
                if not stopped and run.storage_fault is not None:
                    storage_fault_at_finish(session, run)
            self._recorded_to_junit(session.config)
            self._finished_runs_status(session)
            if self.session.options.report:
                self._write_reports()
            self._gate(session)
            self._upload(session)
        finally:
            self.session.close()
        if self.stopped is not None:
            session.exitstatus = self.stopped[1]

    def _row_metrics(self, run: ControllerRun) -> dict[str, Any]:
        """Write ``osmosis_metrics.json`` beside ``metrics.json`` (a run that ran nothing
        keeps its files as they were: the document is computed, not written)."""
        from pytest_osmosis.results.row_metrics import (
            attempts_by_row,
            cost_of,
            read_row_metrics,
            row_metrics,
            write_row_metrics,
        )

        plan = run.plan
        earlier = read_row_metrics(plan.run_dir).get("cost_usd_by_rollout")
        earlier = earlier if isinstance(earlier, dict) else {}
        costs: dict[str, float | None] = {}
        for record in run.rundir.records.values():
            rollout_id = str(record.get("rollout_id"))
            cost = run.costs[rollout_id] if rollout_id in run.costs else earlier.get(rollout_id)
            costs[rollout_id] = cost_of(cost)
        row_pass = self.session.options.gate.values.get("row_pass")
        doc = row_metrics(
            attempts_by_row(run.rundir.records.values(), plan.settings.pass_threshold),
            n=plan.settings.n,
            row_pass=row_pass,
            costs=costs,
        )
        if run.executed or run.reused:
            try:
                write_row_metrics(plan.run_dir, doc)
            except OSError as exc:
                run.storage_fault = f"cannot write {plan.run_dir}: {exc}"
        return doc

    def summary(self, terminalreporter: Any, exitstatus: int = 0) -> None:
        from pytest_osmosis.plugin.next_steps import write_next_steps
        from pytest_osmosis.plugin.summary import write_summary

        if self.stopped is not None:
            terminalreporter.write_line(self.stopped[0])
            return
        write_summary(terminalreporter, self.session)
        write_next_steps(terminalreporter, self.session, exitstatus)

    def _recorded_to_junit(self, config: pytest.Config) -> None:
        """--junitxml lists a finished run's rows with their recorded outcome and duration.

        They were deselected, so nothing ran: their reports go to the JUnit writer alone
        (before it writes, in its own pytest_sessionfinish), not through pytest's hooks,
        so the terminal still says they were deselected and nothing else counts them.
        """
        try:
            from _pytest.junitxml import xml_key
        except ImportError:  # pragma: no cover - pytest moved it; JUnit lists what ran
            return
        xml = config.stash.get(xml_key, None)
        if xml is None:
            return
        from pytest_osmosis.plugin.collect import recorded_reports
        from pytest_osmosis.plugin.session import resumed_result

        for run in self.session.runs.values():
            for nodeid, key in run.recorded_items:
                record = run.rundir.records.get(key)
                if record is None:
                    continue
                result = resumed_result(record, run.plan)
                source = run.plan.dataset.source_row_index(key[0])
                for report in recorded_reports(nodeid, result, run.plan, source, key[1]):
                    xml.pytest_runtest_logreport(report)

    def _finished_runs_status(self, session: pytest.Session) -> None:
        """Runs finished before this session ran nothing: their recorded rows decide."""
        finished = [run for run in self.session.runs.values() if run.pending_at_start == 0]
        if not finished or session.exitstatus not in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            return
        from pytest_osmosis.core.outcome import summary_fails_session

        if any(summary_fails_session(run.metrics.get("summary", {})) for run in finished):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif len(finished) == len(self.session.runs):
            session.exitstatus = pytest.ExitCode.OK  # "no tests ran": nothing was left to run

    def _write_reports(self) -> None:
        from pytest_osmosis.core.errors import OsmosisError
        from pytest_osmosis.report import write_index, write_report_for_run

        roots: dict[Path, list[ControllerRun]] = {}
        for run in self.session.runs.values():
            try:
                run.report_path = write_report_for_run(
                    run.plan.run_dir, dataset=run.plan.dataset.path
                )
            except OsmosisError as exc:
                run.report_error = str(exc)
            roots.setdefault(run.plan.output_root, []).append(run)
        for root, runs in roots.items():
            # runs.html beside the run directories: this session's runs among the others.
            try:
                index = write_index(root)
            except OsmosisError:
                continue  # a read-only root: the run's own report is what was asked for
            for run in runs:
                run.index_path = index

    def _gate(self, session: pytest.Session) -> None:
        """Every gate rule's verdict (``pytest_osmosis_gate_verdict``) decides the exit status."""
        from pytest_osmosis.gate import BuiltinGate, GateRun, Verdict, session_verdict

        if not self.session.runs:
            return
        if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return  # interrupted, usage or internal errors keep their own exit status
        runs = self.session.runs.values()
        manager = session.config.pluginmanager
        if not manager.has_plugin("osmosis-gate"):
            manager.register(BuiltinGate(self.session.options.gate), "osmosis-gate")
        found = session.config.hook.pytest_osmosis_gate_verdict(
            config=session.config,
            runs=[
                GateRun(
                    run.plan.run_name,
                    run.metrics,
                    list(run.rundir.records.values()),
                    run.plan.settings.pass_threshold,
                    run.plan.run_dir,
                )
                for run in runs
            ],
        )
        verdict = session_verdict(found)
        if verdict is None:
            return
        override = session.config.hook.pytest_osmosis_gate(
            config=session.config, metrics=[run.metrics for run in runs], verdict=verdict.as_dict()
        )
        if override is not None:
            verdict = Verdict(
                bool(override),
                [*verdict.reasons, "decided by pytest_osmosis_gate"],
                verdict.regressions,
            )
        self.session.verdict = verdict
        session.exitstatus = pytest.ExitCode.OK if verdict.passed else pytest.ExitCode.TESTS_FAILED

    def _upload(self, session: pytest.Session) -> None:
        """``--osmosis-upload``: after the gate, the SDK's upload of each finished run.

        ``on-pass`` uploads only when the session passes; a run not finished is never
        uploaded; an upload that fails is one line and exit 1.
        """
        mode = self.session.options.upload
        if mode is None:
            return
        from pytest_osmosis.results.upload import upload_run

        status = session.exitstatus
        for run in self.session.runs.values():
            if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
                run.upload_line = "not uploaded: the session did not end normally"
            elif mode == "on-pass" and status != pytest.ExitCode.OK:
                run.upload_line = (
                    "not uploaded: the session did not pass (--osmosis-upload on-pass)"
                )
            else:
                result = upload_run(run.plan.run_dir, run.plan.workspace)
                run.upload_line = result.line
                if not result.uploaded and not result.line.startswith("not uploaded"):
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED


class HeldOutput:
    """Hold what pytest's terminal writer is sent, to write it later or drop it (best
    effort: the writer's stream is not public API; without it nothing is held)."""

    def __init__(self, config: pytest.Config) -> None:
        import io

        self.text = ""  # what was held, once stopped
        self._writer = getattr(config.pluginmanager.get_plugin("terminalreporter"), "_tw", None)
        self._stream = getattr(self._writer, "_file", None)
        self._holding = self._stream is not None
        if self._holding:
            self._writer._file = io.StringIO()  # type: ignore[union-attr]

    def stop(self) -> None:
        """Give the writer its stream back; what it was sent meanwhile is ``text``."""
        if self._holding:
            self._holding = False
            self.text += self._writer._file.getvalue()  # type: ignore[union-attr]
            self._writer._file = self._stream  # type: ignore[union-attr]

    def release(self) -> None:
        """Stop holding and write ``text`` (set it to "" first to drop it)."""
        self.stop()
        if self._stream is not None and self.text:
            self._stream.write(self.text)
            self._stream.flush()
        self.text = ""


def xdist_controller(session: pytest.Session) -> bool:
    """Whether this process is xdist's controller (its workers run the rows)."""
    return bool(session.config.pluginmanager.has_plugin("dsession"))


def run_keys(plan: Any) -> Sequence[tuple[int, int]]:
    """Every (row_index, run_index) of a plan: its selected rows times its attempts (its
    shard's share of them under ``--osmosis-shard``); not a copy (at the end of a run of
    100,000 rows, a list of them was ~7 MB while every report is still held)."""
    return plan.work_keys()  # type: ignore[no-any-return]


def finalize_run(run: ControllerRun, *, cancelled: bool) -> dict[str, Any]:
    """Write the run's snapshots; a finished run that ran nothing keeps its record as it was.

    Rewriting it would give it this session's start and duration (milliseconds for a
    run that took minutes) and mark every row resumed.
    """
    plan = run.plan
    if run.storage_fault is not None:  # the session stopped on it: write nothing more there
        run.log.close()
        run.rundir.close()
        return {}
    if run.executed == 0:
        recorded = run.rundir.recorded_metrics() or {}
        finished = recorded.get("eval_run", {}).get("status") == "finished"
        if finished and recorded.get("summary", {}).get("total_samples") == len(run.rundir.records):
            run.log.write("info", "run", "run finished earlier; nothing ran, nothing rewritten")
            run.log.close()
            run.rundir.close()
            return dict(recorded)
    from pytest_osmosis.core.errors import RunDirectoryError

    complete = all(key in run.rundir.records for key in run_keys(plan))
    status: Literal["finished", "incomplete"] = (
        "finished" if complete and not cancelled else "incomplete"
    )
    try:
        run.log.write("info", "run", f"run {status}", executed=run.executed)
        result: dict[str, Any] = run.rundir.refresh(
            status=status,
            total_dataset_rows=plan.dataset.total_dataset_rows,
            sampled_rows=len(plan.dataset),
            n=plan.settings.n,
            pass_threshold=plan.settings.pass_threshold,
            dataset_name=plan.config.experiment.dataset,
            model_path=plan.settings.model_path,
            rollout_name=plan.config.experiment.rollout,
            started_at=run.started_at,
            expected_keys=run_keys(plan) if plan.shard is not None else None,
        )
        from pytest_osmosis.core.errors import DatasetError
        from pytest_osmosis.results.row_digests import ROWS_FILENAME, write_row_digests

        # Once per run directory: what a later run finds its rows by, for --osmosis-reuse and
        # as a baseline (not from a dataset that changed under the run: its session fault is
        # reported instead).
        if not (plan.run_dir / ROWS_FILENAME).is_file():
            try:
                write_row_digests(plan.run_dir, plan.digests_by_row())
            except DatasetError:
                pass
    except (RunDirectoryError, OSError) as exc:  # a full disk, a deleted run: exit 4
        run.storage_fault = str(exc)
        result = {}
    run.log.close()
    run.rundir.close()
    return result


def let_go(report: pytest.TestReport) -> None:
    """A logged report drops the result it carried (every plugin has read it by logfinish):
    pytest keeps every report, reruns' included, to the end of the session."""
    report.__dict__.pop("osmosis", None)
    report.__dict__.pop("osmosis_files", None)
