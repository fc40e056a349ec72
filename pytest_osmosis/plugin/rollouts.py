"""How each config's rows run (``--osmosis-execution``): the dispatch seam's choice, per process.

``auto`` runs a rollout in process when that is faithful, and on its own server as
``osmosis eval run`` does when it is not. The two implementations of the seam are
``execution/dispatch.py::InProcess`` and ``execution/server.py::RolloutServer``; this module
only chooses between them, starts and stops them, and says which it chose and why.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_osmosis.core.words import one_line
from pytest_osmosis.execution.dispatch import AUTO, IN_PROCESS, SERVER, Dispatch, InProcess
from pytest_osmosis.workspace.loader import load_rollout
from pytest_osmosis.workspace.plan import EvalPlan, workspace_warnings

if TYPE_CHECKING:
    from pytest_osmosis.execution.executor import Executor
    from pytest_osmosis.plugin.models import Phase
    from pytest_osmosis.plugin.session import SessionOptions

_DEFAULT_CAPACITY = 4  # a LocalBackend without a workflow_config advertises 4 on /health


class Rollouts:
    """Each config's ``Dispatch``, decided once per process."""

    def __init__(
        self,
        config: pytest.Config,
        options: SessionOptions,
        *,
        is_worker: bool,
        warn_once: Callable[[str], None],
        phase: Phase,
    ) -> None:
        self.config = config
        self.options = options
        self.is_worker = is_worker
        self.regrading = False  # a regrade grades recorded samples in process (session sets it)
        self._warn_once = warn_once
        self._phase = phase
        self._dispatches: dict[Path, Dispatch] = {}

    def get(self, config_path: Path) -> Dispatch | None:
        """The dispatch already chosen for a config, if any."""
        return self._dispatches.get(config_path)

    def __getitem__(self, config_path: Path) -> Dispatch:
        return self._dispatches[config_path]

    def load(self, plan: EvalPlan) -> Dispatch:
        """How this config's rows run (``--osmosis-execution``), decided once per process.

        ``auto`` runs a rollout in process when that is faithful, and on its own server as
        ``osmosis eval run`` does when it is not: its ``pyproject.toml`` needs what this
        environment lacks, or it serves (or builds a non-local backend) while loading.
        """
        if plan.config_path not in self._dispatches:
            for key, value in plan.config.env.items():
                os.environ[key] = value
            self._dispatches[plan.config_path] = self._dispatch_for(plan)
        return self._dispatches[plan.config_path]

    def _dispatch_for(self, plan: EvalPlan) -> Dispatch:
        from pytest_osmosis.core.errors import ConfigError, NeedsServerError
        from pytest_osmosis.workspace.environment import unmet_requirements

        mode = self.options.execution
        regrading = self.regrading
        if mode == SERVER:
            if regrading:
                raise ConfigError(
                    "--osmosis-regrade grades recorded samples in process; it cannot run with "
                    "--osmosis-execution server"
                )
            return self._server(plan, "--osmosis-execution server")
        if mode == AUTO and not regrading:
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
            if mode != AUTO or regrading:
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
        dispatch = self.load(plan)
        text = f"{dispatch.mode} ({dispatch.why})"
        from pytest_osmosis.plugin.xdist import worker_count

        if dispatch.mode == SERVER and worker_count(self.config) and not self.is_worker:
            text += "; each xdist worker starts its own server"
        return text

    def shown_execution(self, plan: EvalPlan) -> str:
        """The results table's execution line: where auto did not simply run in process."""
        if self.options.execution == AUTO and self.load(plan).mode == IN_PROCESS:
            return ""
        return self.execution_text(plan)

    def start_early(self, plan: EvalPlan, executor: Executor) -> None:
        """A single process starts a rollout's server as soon as its run directory exists,
        so ``uv sync`` and the server's imports overlap the model check; collection waits
        for it (:meth:`ready`). An xdist controller runs no rows: each worker starts its own."""
        dispatch = self._dispatches.get(plan.config_path)
        if dispatch is None or dispatch.mode != SERVER:
            return
        if self.config.pluginmanager.has_plugin("dsession"):
            return
        asyncio.run_coroutine_threadsafe(dispatch.start(), executor.loop)

    def ready(self, plan: EvalPlan, executor: Callable[[], Executor]) -> None:
        """Collection, in a process that runs rows: start the rollout's server, if it has one.

        After the session's checks (the preflight passed, the run directory exists), as
        ``osmosis eval run`` starts its server; one that cannot start is the config's error.
        """
        dispatch = self.load(plan)
        if dispatch.mode == SERVER and not self.config.option.collectonly:
            with self._phase(f"starting the rollout server of {plan.rollout_dir.name}"):
                executor().call(dispatch.start())

    def warn_loaded(self, plan: EvalPlan) -> None:
        """What would keep ``osmosis eval run`` from running this config although we can:
        one line each, after the start-up phase whose line it would break."""
        if self.is_worker:  # the controller loads every rollout too, and says it
            return
        dispatch = self._dispatches.get(plan.config_path)
        # A rollout on its own server is started as osmosis eval run starts it: no guesses.
        loaded = dispatch.rollout.warnings if isinstance(dispatch, InProcess) else ()
        for line in (*workspace_warnings(plan.workspace), *loaded):
            self._warn_once(f"osmosis: warning: {line}")

    def concurrency(self, plans: list[EvalPlan]) -> int:
        """What ``osmosis eval run`` picks for these configs: ``batch_size`` capped by the
        capacity the rollout's backend advertises, else that capacity, else 1
        (``LocalEvalRunner._resolve_concurrency``)."""
        best = 1
        for plan in plans:
            dispatch = self._dispatches.get(plan.config_path)
            capacity = dispatch.capacity if dispatch is not None else _DEFAULT_CAPACITY
            wanted = plan.settings.concurrency
            value = (min(wanted, capacity) if capacity else wanted) if wanted else capacity
            best = max(best, value or 1)
        return best

    def stop_all(self, executor: Executor) -> None:
        """Stop every rollout server of this process (their whole process groups)."""
        for config_path in self._dispatches:
            self.stop(config_path, executor)

    def stop(self, config_path: Path, executor: Executor) -> None:
        """Stop the rollout server of one config, if it has one running."""
        dispatch = self._dispatches.get(config_path)
        if dispatch is None:
            return
        try:
            executor.call(dispatch.stop(), timeout=15)
        except Exception:  # noqa: BLE001 - shutting down; the lifeline ends them too
            pass
