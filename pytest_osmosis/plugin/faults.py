"""What the session does when something other than a row's own result ends a row.

A full or vanished run directory (a storage fault: one line, exit 4, the journal kept as
it was); a session fault (nothing can be trusted: stop, rows pending); the backstop firing
while a row waited (only the row whose code blocks the event loop fails); a row's code
ending the process with ``os._exit`` (recorded ``worker_crashed`` next session); rows that
finished ahead of a session that ends first (journalled, not run again).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pytest_osmosis.core import outcome
from pytest_osmosis.core.errors import RunDirectoryError, SessionFaultError
from pytest_osmosis.core.words import one_line
from pytest_osmosis.execution import blame
from pytest_osmosis.execution.executor import BackstopExpired, Executor, arm_backstop

if TYPE_CHECKING:
    from pytest_osmosis.plugin.collect import EvalItem
    from pytest_osmosis.plugin.session import ControllerRun
    from pytest_osmosis.workspace.plan import EvalPlan

#: Where a node id's run and (row_index, run_index) are: the session's ``item_key``.
ItemKey = Callable[[str], "tuple[Path, tuple[int, int]] | None"]


# -- storage faults -------------------------------------------------------------------


@contextlib.contextmanager
def recording(run: ControllerRun, result: dict[str, Any]) -> Iterator[None]:
    """Journal and log one result; when the run directory cannot take it, stop (exit 4).

    A row whose trajectory could not be written (``storage_fault``, set where it ran,
    maybe an xdist worker) is not journalled either: the next session runs it again.
    """
    if result.get("storage_fault"):
        stop_for_storage(run, str(result["storage_fault"]))
    try:
        yield
    except RunDirectoryError as exc:
        stop_for_storage(run, str(exc))
    except OSError as exc:
        stop_for_storage(run, f"cannot record results in {run.rundir.path}: {exc}")


def stop_for_storage(run: ControllerRun, message: str) -> NoReturn:
    """A session-level fault: one line, exit 4, like the other faults that stop a session.

    What the journal holds stays as it is (a failed append is cut back off), so the run
    resumes after its last recorded result once the cause is gone.
    """
    run.storage_fault = message
    pytest.exit(storage_fault_line(run, message), returncode=pytest.ExitCode.USAGE_ERROR)


def storage_fault_at_finish(session: pytest.Session, run: ControllerRun) -> None:
    """The final snapshots could not be written: the same one line and exit 4."""
    line = storage_fault_line(run, run.storage_fault or "")
    session.exitstatus = pytest.ExitCode.USAGE_ERROR
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("!", line, red=True)
    else:
        print(line, file=sys.stderr)


_FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_fault_line(run: ControllerRun, message: str) -> str:
    """The one line a storage fault stops the session with: what failed, and what now."""
    if any(os.strerror(code) in message for code in _FULL_DISK):
        count = run.rundir.kept()  # nothing more is journalled there: the session stops
        return (
            f"{message}; the {count} results recorded so far are kept: free space, then run "
            "the same command again to resume"
        )
    return message


# -- session faults and the backstop ----------------------------------------------------


def session_fault_result(item: EvalItem, line: str) -> dict[str, Any]:
    """What a worker sends for the row that met a session fault: never journalled."""
    return _item_failure(item, "session_fault", line, session_fault=line)


def _item_failure(item: EvalItem, error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    """The failed result of ``item`` (``outcome.failure``) for a fault that ended it."""
    return outcome.failure(
        row_index=item.row_index,
        run_index=item.run_index,
        source_row_index=item.source_row_index,
        pass_threshold=item.parent.plan.settings.pass_threshold,
        error_type=error_type,
        message=message,
        **extra,
    )


def past_backstop(
    executor: Executor, item: EvalItem, factory: Callable[[], Any], expired: BackstopExpired
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
        if executor.responsive():
            return dict(executor.result(item.nodeid, factory))
        found = executor.blocker()
        nodeid, where, seconds = found if found is not None else (None, "?", 0.0)
        if nodeid is None or nodeid == waited_on:
            who = "code that is not a row's" if nodeid is None else _row_words(nodeid)
            raise SessionFaultError(
                f"the event loop has been blocked for {seconds:.0f} s by {who} (at {where}); "
                "rows in flight were not recorded"
            )
        blocking = f"{_row_words(nodeid)} is blocking the event loop at {where}"
        if nodeid == item.nodeid:
            executor.abandon(item.nodeid)
            return _backstop_result(item, expired, blocking)
        waited_on = nodeid
        warnings.warn(
            f"{item.nodeid} waits past its backstop: {blocking}",
            pytest.PytestWarning,
            stacklevel=1,
        )
        cancel = arm_backstop(expired.seconds)
        try:
            return dict(executor.result(item.nodeid, factory))
        except BackstopExpired as again:
            expired = again
        finally:
            if cancel is not None:
                cancel()


def _backstop_result(item: EvalItem, expired: BackstopExpired, blocker: str) -> dict[str, Any]:
    """The backstop fired while this item waited: its own code blocked the event loop."""
    return _item_failure(item, "backstop_timeout", f"{expired}: {blocker}")


def _row_words(nodeid: str) -> str:
    """``row <source row> run <n>``: how a line names an eval item (else its node id)."""
    from pytest_osmosis.plugin.collect import split_item_nodeid

    parts = split_item_nodeid(nodeid)
    return nodeid if parts is None else f"row {parts[1]} run {parts[2]}"


# -- rows that ended the process, or outlived the session ---------------------------------


def crashed_result(
    run: ControllerRun, key: tuple[Path, tuple[int, int]], why: str
) -> dict[str, Any]:
    """The failed result of an item whose process died under it (an xdist worker, ``os._exit``)."""
    path, (row_index, run_index) = key
    return outcome.failure(
        row_index=row_index,
        run_index=run_index,
        source_row_index=run.plan.dataset.source_row_index(row_index),
        pass_threshold=run.plan.settings.pass_threshold,
        error_type="worker_crashed",
        message=one_line(why, 300),
        config=str(path),
    )


class ExitWitness:
    """A row whose code calls ``os._exit`` in a single process is named beside the run's lock
    (:func:`blame.witness_exits`), so the next session records it ``worker_crashed`` instead
    of dying there for ever. A kill from outside names no row."""

    def __init__(self, on_exit: Callable[[], None]) -> None:
        self._paths: list[str] = []
        self._restore: Callable[[], None] | None = blame.witness_exits(self._paths, on_exit)

    def record_killed_rows(self, runs: dict[Path, ControllerRun], item_key: ItemKey) -> None:
        """Record the row the previous session's ``os._exit`` named; watch this session's runs."""
        witnesses = [exit_witness(run.plan) for run in runs.values()]
        for run, path in zip(runs.values(), witnesses, strict=True):
            witnessed = blame.witnessed_exit(path)
            found = item_key(witnessed[1]) if witnessed else None
            if witnessed is None or found is None or found[0] != run.plan.config_path:
                continue
            if not run.rundir.pending([found[1]]):
                continue
            status, nodeid = witnessed
            result = crashed_result(
                run,
                found,
                f"this row's code called os._exit({status}) and ended the previous session; "
                "it is not run again (--osmosis-retry-failed runs it)",
            )
            run.rundir.append(result)
            run.executed += 1
            run.pending_at_start -= 1
            run.log.warning(
                "result", f"{nodeid}: {result['message']}", rollout_id=result["rollout_id"]
            )
        if runs:
            self._paths[:] = witnesses

    def close(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None


def exit_witness(plan: EvalPlan) -> str:
    """Where a row's ``os._exit`` names the row for the next session: beside the run's lock."""
    from pytest_osmosis.results.manifest import LOCKS_DIRNAME

    return str(plan.output_root / LOCKS_DIRNAME / f"{plan.run_name}.exited")


def journal_finished(
    executor: Executor, runs: dict[Path, ControllerRun], item_key: ItemKey, *, wait: bool
) -> None:
    """Journal the rows that finished ahead but were not reported yet, so that the next
    session does not run them again: the session is ending before pytest reached them
    (Ctrl-C, ``-x``, an INTERNALERROR, a row's ``os._exit``). ``wait=False``: from a
    signal handler, which must not wait on a lock the code it interrupted holds."""
    for nodeid, result in executor.finished(wait=wait).items():
        found = item_key(nodeid)
        if found is None or not isinstance(result, dict) or result.get("session_fault"):
            continue
        run = runs[found[0]]
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
