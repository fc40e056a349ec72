"""The xdist controller's scheduler: shards of consecutive rows, each to one worker.

It is ``loadscope`` with our own scopes; workers run their queued shards ahead
(xdist.py). Only the controller imports this module (xdist's scheduling with it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from pytest_osmosis.execution import blame
from pytest_osmosis.plugin.collect import split_item_nodeid

#: A worker is sent its next shard while it holds no more than this many shards' items:
#: the one in flight, and one queued behind it (see ``EvalScheduling._reschedule``).
AHEAD = 2


class EvalScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """``loadscope`` whose scopes are shards of ``shard_rows`` consecutive dataset rows."""

    def __init__(
        self,
        config: pytest.Config,
        log: Any,
        shard_rows: int,
        culprit: Callable[[Any], str | None] | None = None,
    ) -> None:
        super().__init__(config, log)
        self.shard_rows = max(1, shard_rows)
        self.culprit = culprit  # the node id whose code a dead worker ran (blame.py)
        self._shard_items = 0  # items in the largest shard (all attempts of its rows)

    def _split_scope(self, nodeid: str) -> str:
        parts = split_item_nodeid(nodeid)
        if parts is None:
            return str(super()._split_scope(nodeid))
        return f"{parts[0]}::shard{parts[1] // self.shard_rows}"

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self.registered_collections:
            nodeids = next(iter(self.registered_collections.values()))
            shards = Counter(
                self._split_scope(nodeid) for nodeid in nodeids if split_item_nodeid(nodeid)
            )
            self._shard_items = max(shards.values(), default=0)
        super().schedule()

    def _reschedule(self, node: Any) -> None:
        """xdist's refill (a unit when at most 2 items are pending), then a shard ahead.

        xdist sends a worker its next unit only when that worker has nearly run dry: a
        worker with a shard in flight then waits, rows idle, for its last reports to reach
        the controller (which journals each with an fsync) and the next shard to come back.
        So a worker is kept a whole shard ahead of the rows it can have in flight (a shard
        is its share of the concurrency): it is sent the next shard while it still holds
        two shards' items, not one. At one, its in-flight rows were all it had, and each
        row that finished while the next shard was on its way (its reports reaching the
        controller, the shard coming back) left a free slot with no row to fill it.
        Near the end (fewer shards queued than workers) xdist's rule alone applies, so the
        last shards go to whoever is free.
        """
        if node not in self.registered_collections:
            return  # a replacement still collecting: schedule() gives it work later
        try:
            super()._reschedule(node)
            if (
                not node.shutting_down
                and len(self.workqueue) >= len(self.nodes)
                and self._pending_of(self.assigned_work[node]) <= AHEAD * self._shard_items
            ):
                self._assign_work_unit(node)
        except OSError:
            pass  # it died too; its remove_node() puts the unit back in the queue

    def remove_node(self, node: Any) -> str | None:
        """As ``loadscope`` does, but the item that crashed the worker is not sent again.

        A worker runs its queued rows ahead, so the row that crashed it is the one whose
        code its event loop was running (``culprit``), when that is known. When the worker's
        slot says no row's code was running, the worker was killed from outside (the OOM
        killer, ``kill -9``): no row is blamed and every unfinished one is rescheduled.
        Without a slot it is xdist's guess, the first unfinished item (the one the worker
        was reporting). The
        controller records it as ``worker_crashed``; running it on another worker would
        crash that one too, and pay for it twice. The dead worker's other unfinished items
        (possibly in flight, never recorded) are rescheduled.
        """
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        unfinished = [
            nodeid
            for unit in workload.values()
            for nodeid, completed in unit.items()
            if not completed
        ]
        blamed = self.culprit(node) if self.culprit is not None else None
        if blamed == blame.NO_ROW:
            crashitem = None  # killed from outside (OOM killer, kill -9) between rows' steps
        else:
            crashitem = blamed if blamed in unfinished else unfinished[0]
        for scope, unit in workload.items():
            if crashitem in unit:
                unit[crashitem] = True
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem


#: What of xdist's private API the scheduler and the workers' run-ahead read: the
#: controller checks it before using either, and falls back (visibly) when it changed.
_SCHEDULER_METHODS = (
    "_split_scope",
    "_reschedule",
    "_pending_of",
    "_assign_work_unit",
    "remove_node",
    "schedule",
)
_SCHEDULER_STATE = ("assigned_work", "workqueue", "registered_collections")


def internals_problem(config: pytest.Config) -> str | None:
    """Why the installed pytest-xdist cannot run our scheduler, or None when it can.

    ``loadscope``'s hooks and the worker queue's ``lock()`` are not public API: a release
    that renames them must cost us the run-ahead, never fail the rows (xdist 3.6.1's worker
    queue had no ``lock()`` and every row errored). Checked once per session.
    """
    if _PROBLEM not in config.stash:
        config.stash[_PROBLEM] = _find_problem(config)
    return config.stash[_PROBLEM]


def _find_problem(config: pytest.Config) -> str | None:
    from xdist import remote

    missing = [
        f"LoadScopeScheduling.{name}"
        for name in _SCHEDULER_METHODS
        if not callable(getattr(LoadScopeScheduling, name, None))
    ]
    if not missing:
        probe = LoadScopeScheduling(config)
        missing += [
            f"LoadScopeScheduling().{name}"
            for name in _SCHEDULER_STATE
            if not isinstance(getattr(probe, name, None), dict)
        ]
    queue = getattr(remote, "TestQueue", None)
    if not callable(getattr(queue, "lock", None)):
        missing.append("xdist.remote.TestQueue.lock")
    if not missing:
        return None
    from importlib.metadata import version

    return (
        f"pytest-xdist {version('pytest-xdist')} lacks {', '.join(missing)}: each worker runs "
        "its rows one at a time, on xdist's own scheduler"
    )


def warn_once(config: pytest.Config, problem: str) -> None:
    """One visible line in the terminal (xdist's run loop starts outside pytest's warnings)."""
    if config.stash.get(_WARNED, False):
        return
    config.stash[_WARNED] = True
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"osmosis: warning: {problem}", yellow=True, bold=True)
    else:
        import sys

        print(f"osmosis: warning: {problem}", file=sys.stderr)


_WARNED = pytest.StashKey[bool]()
_PROBLEM = pytest.StashKey["str | None"]()
