"""Which row's code an xdist worker (or a single process, by ``os._exit``) was running when it died,
and which row's code holds the event loop.

A worker runs its queued rows ahead on one event loop, so when it dies (``os._exit``,
a segfault, the OOM killer) the item its main thread was waiting for is often not the
row that killed it. All rollout code runs on that loop's thread, one task step at a
time, so "the row whose step is running" is exact. Each worker keeps it in a tiny
file-backed shared ``mmap``: the writes cost no syscall, and the page cache keeps them
after the process is gone, for the controller to read when xdist reports the death.

The same knowledge names the row whose synchronous code holds the loop when a backstop
fires (:func:`running_row`): each task is known as the row whose task created it, so a
task a row started, and its grader, are that row's.

Slot layout: a native-endian int64 length at offset 0 (0: no row's code is running),
then that many bytes of the row's node id (UTF-8). A row is shown with one copy of its
precomputed record (length and node id), and cleared by storing 0 in the length.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import mmap
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, cast

SLOT_SIZE = 4096
_PREFIX = "osmosis-blame-"
_HEADER = 8  # int64 length
_MAX_BODY = SLOT_SIZE - _HEADER

#: The :func:`record` of the row whose code runs in this context; tasks a row creates
#: copy the context, so they carry it too.
_current: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "osmosis_blame_row", default=None
)


#: The node id of the row each task runs code for: the task that entered it, and every task
#: created in a step of a row's task (:func:`adopt`). Read from other threads by
#: :func:`running_row`, to name the row whose synchronous code holds the loop.
_TASK_ROWS: weakref.WeakKeyDictionary[asyncio.Future[Any], str] = weakref.WeakKeyDictionary()


#: Loops whose tasks are followed (:func:`adopt`, :func:`enter`): on them a row is its
#: task's, never its context's. Any other loop (``asyncio.run`` in a row's thread) is not.
_FOLLOWED: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def adopt(loop: asyncio.AbstractEventLoop, task: asyncio.Future[Any]) -> None:
    """A loop's task factory: ``task``, created in a step of a row's task, is that row's.

    A task created from a plain loop callback (a server accepting a connection, a timer)
    is no row's, even when the callback inherited a row's context.
    """
    _FOLLOWED.add(loop)
    parent = asyncio.current_task(loop)
    if parent is not None:
        row = _TASK_ROWS.get(parent)
        if row is not None:
            _TASK_ROWS[task] = row


def running_row(loop: asyncio.AbstractEventLoop) -> str | None:
    """The node id of the row whose task ``loop`` is stepping now (any thread may ask)."""
    task = asyncio.current_task(loop)
    return None if task is None else _TASK_ROWS.get(task)


#: The node id of the row whose code runs in this context (:func:`enter`), for code that
#: runs in no task of the loop: a thread a row started with its context (``to_thread``).
_row: contextvars.ContextVar[str | None] = contextvars.ContextVar("osmosis_row", default=None)


def current_row() -> str | None:
    """The node id of the row whose code is running in this thread now, or None.

    On the session's loop (one whose tasks are followed), the row whose task is stepping
    (a task a row started is that row's; a plain callback, or a task one started, such as
    a server's, is no row's). In another thread, the row whose context the thread runs in
    (``asyncio.to_thread`` copies it), also when it runs a loop of its own (a synchronous
    SDK call: ``asyncio.run`` there copies the context into its tasks). Never in the main
    thread otherwise: pytest's, which runs no row's code, whatever its context says
    (``enter`` off a loop sets it there, and it stays).
    """
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None and loop in _FOLLOWED:
        return running_row(loop)
    if threading.current_thread() is threading.main_thread():
        return None
    return _row.get()


class Slot:
    """One worker's shared page: who is running now (the loop thread is the only writer)."""

    def __init__(self, directory: str, workerid: str) -> None:
        fd = os.open(_slot_path(directory, workerid), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOT_SIZE)
            self._map = mmap.mmap(fd, SLOT_SIZE)  # MAP_SHARED: outlives this process
        finally:
            os.close(fd)  # the mapping keeps the file
        self.view = memoryview(self._map)
        self.length = self.view[:_HEADER].cast("q")

    def show(self, record: bytes | None) -> None:
        """Name a row (its :func:`record`) as running now; ``None``: no row."""
        if record is None:
            self.length[0] = 0
        else:
            self.view[: len(record)] = record

    def close(self) -> None:
        """Unmap (tests only: a driven task stepping after this would fail)."""
        self.length.release()
        self.view.release()
        self._map.close()


def record(nodeid: str) -> bytes | None:
    """What the slot holds while ``nodeid``'s code runs: length, then the UTF-8 node id."""
    body = nodeid.encode("utf-8", "backslashreplace")
    if not 0 < len(body) <= _MAX_BODY:
        return None  # cannot be named: the controller falls back to its own guess
    return len(body).to_bytes(_HEADER, sys.byteorder) + body


class _Driven:
    """A coroutine that names its task's row in the slot for the duration of each step.

    The Task drives this object exactly as it would the wrapped coroutine; results,
    exceptions (cancellation included) and ``close()`` pass through untouched. A step
    costs one context-variable read, one slice copy into the page and one int64 store.
    """

    __slots__ = ("_coro", "_view", "_length")

    def __init__(self, coro: Coroutine[Any, Any, Any], slot: Slot) -> None:
        self._coro = coro
        self._view = slot.view
        self._length = slot.length

    def send(self, value: Any) -> Any:
        row = _current.get()
        if row is not None:
            self._view[: len(row)] = row
        try:
            return self._coro.send(value)
        finally:
            self._length[0] = 0

    def __next__(self) -> Any:  # what the C Task calls on 3.11+ instead of send(None)
        row = _current.get()
        if row is not None:
            self._view[: len(row)] = row
        try:
            return self._coro.send(None)
        finally:
            self._length[0] = 0

    def throw(self, *args: Any) -> Any:
        row = _current.get()
        if row is not None:
            self._view[: len(row)] = row
        try:
            return self._coro.throw(*args)
        finally:
            self._length[0] = 0

    def close(self) -> None:
        row = _current.get()
        if row is not None:
            self._view[: len(row)] = row
        try:
            self._coro.close()
        finally:
            self._length[0] = 0

    def __await__(self) -> _Driven:
        return self

    def __iter__(self) -> _Driven:
        return self

    def __getattr__(self, name: str) -> Any:
        if name in _Driven.__slots__:
            raise AttributeError(name)
        # cr_code, cr_frame, cr_running, __qualname__...: a task's repr names the real coroutine.
        return getattr(self._coro, name)

    def __repr__(self) -> str:
        return repr(self._coro)


collections.abc.Coroutine.register(_Driven)  # what asyncio.Task accepts as a coroutine


class TaskFactory:
    """A loop task factory wrapping every task's coroutine in a :class:`_Driven`.

    A task created outside any running task (from a loop callback: a server accepting a
    connection, a timer) belongs to no row, even when the callback inherited a row's
    context (the bridge's server is started from the first row that needs it).
    """

    def __init__(self, slot: Slot, inner: Any = None) -> None:
        self.slot = slot
        self._inner = inner

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        driven = cast("Coroutine[Any, Any, Any]", _Driven(coro, self.slot))
        if asyncio.current_task(loop) is not None:
            task = self._create(loop, driven, kwargs)
            self.slot.show(_current.get())  # an eager first step (3.12+) cleared the slot
            return task
        given: contextvars.Context | None = kwargs.get("context")
        if (_current.get() if given is None else given.get(_current)) is not None:
            context = (contextvars.copy_context() if given is None else given).copy()
            context.run(_current.set, None)
            if given is not None:
                kwargs["context"] = context
            # Also for a factory or Python without ``context=``: the Task copies this one.
            return context.run(self._create, loop, driven, kwargs)
        return self._create(loop, driven, kwargs)

    def _create(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], kwargs: Any
    ) -> asyncio.Future[Any]:
        if self._inner is not None:
            return cast("asyncio.Future[Any]", self._inner(loop, coro, **kwargs))
        return asyncio.Task(coro, loop=loop, **kwargs)


def install(loop: asyncio.AbstractEventLoop, directory: str, workerid: str) -> Slot | None:
    """Give ``loop`` a blame slot ``<directory>/<workerid>``; None when it cannot be made.

    Call before the loop runs any task (tasks created earlier are not followed).
    Blame is best effort: without a slot the controller falls back to xdist's guess.
    """
    try:
        slot = Slot(directory, workerid)
    except (OSError, ValueError):
        return None
    loop.set_task_factory(TaskFactory(slot, loop.get_task_factory()))
    return slot


def enter(nodeid: str) -> None:
    """From now on this task (and the tasks it creates) run ``nodeid``'s code.

    The slot is written at once, so a crash in this very step is pinned on the row.
    Off a blamed loop this only sets the context variable.
    """
    row = record(nodeid)
    _current.set(row)
    _row.set(nodeid)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _FOLLOWED.add(loop)
    task = asyncio.current_task(loop)
    if task is not None:
        _TASK_ROWS[task] = nodeid
    factory = loop.get_task_factory()
    if isinstance(factory, TaskFactory):
        factory.slot.show(row)


#: What :func:`culprit` returns for a slot that says no row's code was running.
NO_ROW = ""


def witness_exits(
    paths: list[str], before_exit: Callable[[], None] | None = None
) -> Callable[[], None]:
    """Make ``os._exit`` called from a row's code leave ``<status>\\n<node id>`` in each path.

    Without xdist no process outlives the one a row kills, so the next session learns
    from this file which row it was. Only a row's own call is witnessed: a kill from
    outside (``kill -9``, the OOM killer) leaves nothing, and no row is blamed for it.
    ``paths`` may grow after the call; ``before_exit`` (journalling what finished) runs
    after the witness is written. Returns what puts the real ``os._exit`` back.
    """
    real = os._exit

    def exit_witnessed(status: int) -> NoReturn:
        row = _current.get()
        if row is not None:
            text = f"{status}\n{row[_HEADER:].decode('utf-8', 'replace')}"
            for path in paths:
                with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as file:
                    file.write(text)
            if before_exit is not None:
                with contextlib.suppress(BaseException):  # dying anyway: never in the way
                    before_exit()
        real(status)

    os._exit = exit_witnessed

    def restore() -> None:
        if os._exit is exit_witnessed:
            os._exit = real

    return restore


def witnessed_exit(path: str) -> tuple[str, str] | None:
    """(exit status, node id) a witnessed ``os._exit`` left at ``path``, removing it."""
    try:
        with open(path, encoding="utf-8") as file:
            status, _, nodeid = file.read().partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    with contextlib.suppress(OSError):
        os.unlink(path)
    return (status, nodeid) if nodeid else None


def culprit(directory: str, workerid: str) -> str | None:
    """Controller: the node id whose code ``workerid`` was running when it died, if any."""
    return running(directory, workerid) or None


def running(directory: str, workerid: str) -> str | None:
    """As :func:`culprit`, but :data:`NO_ROW` when the slot says no row's code was running
    (the process was killed from outside between steps); None when nothing is known."""
    try:
        with open(_slot_path(directory, workerid), "rb") as file:
            data = file.read(SLOT_SIZE)
    except (OSError, ValueError):
        return None
    if len(data) < _HEADER:
        return None
    length = int.from_bytes(data[:_HEADER], sys.byteorder)
    if length == 0:
        return NO_ROW
    if not 0 < length <= min(_MAX_BODY, len(data) - _HEADER):
        return None
    try:
        return data[_HEADER : _HEADER + length].decode("utf-8")
    except UnicodeDecodeError:
        return None


def make_directory() -> str:
    """Controller: a new directory for this session's slots (removed at its end).

    Its name carries the controller's pid, so directories left behind by a controller
    that was killed (SIGKILL leaves no time to clean up) are swept by a later session.
    """
    directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
    if os.name == "posix":  # os.kill(pid, 0) only probes on POSIX
        _sweep(os.path.dirname(directory))
    return directory


def _sweep(parent: str) -> None:
    try:
        names = [n for n in os.listdir(parent) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except (OSError, OverflowError):
            pass  # alive (perhaps another user's), or not a pid at all


def _slot_path(directory: str, workerid: str) -> str:
    if not workerid or os.sep in workerid or (os.altsep and os.altsep in workerid):
        raise ValueError(f"not a worker id: {workerid!r}")
    if workerid in (".", ".."):
        raise ValueError(f"not a worker id: {workerid!r}")
    return os.path.join(directory, workerid)
