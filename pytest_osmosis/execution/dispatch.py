"""The dispatch seam: how one work item of a rollout is run, in process or on its server.

The session holds one :class:`Dispatch` per config and asks it to run each item; it never
asks which kind it holds. Two implementations: :class:`InProcess` (the rollout imported
into this process, its workflow and grader on our loop: ``execution/runner.py``) and
``execution/server.py::RolloutServer`` (the rollout's own environment and server, over
the rollout protocol, as ``osmosis eval run`` runs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_osmosis.execution.runner import BridgeLike, Budgets, TrajectoryWriter, WorkItem, execute
from pytest_osmosis.workspace.loader import LoadedRollout

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_osmosis.model.cache import CachedAttempt
    from pytest_osmosis.results.source_run import RecordedSample

IN_PROCESS = "in-process"
SERVER = "server"
AUTO = "auto"
MODES = (IN_PROCESS, SERVER, AUTO)


class Dispatch(Protocol):
    """Runs the work items of one rollout; ``mode`` and ``why`` are what the plan shows."""

    mode: str
    why: str

    @property
    def capacity(self) -> int | None:
        """The in-flight cap the rollout's backend advertises (None: no cap)."""

    @property
    def judge_model(self) -> str | None:
        """A judge model the rollout's grader declares, which the bridge must allow."""

    async def start(self) -> None:
        """Make ready before the first item (a server: sync, spawn, healthy)."""

    async def run(
        self,
        work: WorkItem,
        *,
        bridge: BridgeLike,
        budgets: Budgets,
        pass_threshold: float,
        prepare_artifacts: Callable[[str], Path | None],
        write_trajectory: TrajectoryWriter,
        cache: CachedAttempt | None = None,
        recorded: RecordedSample | None = None,
    ) -> dict[str, Any]:
        """One work item's result (``core/outcome.py::RowResult.as_dict``)."""

    async def stop(self) -> None:
        """Release what :meth:`start` took."""


_DEFAULT_CAPACITY = 4  # what a LocalBackend without a workflow_config advertises on /health


@dataclass
class InProcess:
    """The rollout imported into this process (``workspace/loader.py``)."""

    rollout: LoadedRollout
    why: str = ""
    mode: str = IN_PROCESS

    @property
    def capacity(self) -> int | None:
        """What the rollout's ``LocalBackend`` would advertise on ``/health``: 4 without a
        workflow_config, else its ``concurrency.max_concurrent`` (unset: no cap)."""
        if self.rollout.workflow_config is None:
            return _DEFAULT_CAPACITY
        concurrency = getattr(self.rollout.workflow_config, "concurrency", None)
        limit = getattr(concurrency, "max_concurrent", None)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return limit
        return None

    @property
    def judge_model(self) -> str | None:
        from pytest_osmosis.rubric.grader import declared_judge_model

        return declared_judge_model(self.rollout.grader_cls, self.rollout.grader_config)

    async def start(self) -> None:
        return None

    async def run(
        self,
        work: WorkItem,
        *,
        bridge: BridgeLike,
        budgets: Budgets,
        pass_threshold: float,
        prepare_artifacts: Callable[[str], Path | None],
        write_trajectory: TrajectoryWriter,
        cache: CachedAttempt | None = None,
        recorded: RecordedSample | None = None,
    ) -> dict[str, Any]:
        return await execute(
            work,
            self.rollout,
            bridge=bridge,
            budgets=budgets,
            pass_threshold=pass_threshold,
            prepare_artifacts=prepare_artifacts,
            write_trajectory=write_trajectory,
            cache=cache,
            recorded=recorded,
        )

    async def stop(self) -> None:
        return None
