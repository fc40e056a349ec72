"""One long-lived event loop per process, on its own thread, that runs work items ahead.

pytest runs items one at a time; LLM work is I/O bound. Items are queued here in
pytest's order and up to ``concurrency`` of them run at once on the loop; an item's
``runtest()`` only waits for its own result. The loop lives for the whole session (LiteLLM
caches clients per loop), and the main thread only ever blocks in ``Future.result()``, so
pytest-timeout's SIGALRM lands there and never inside asyncio.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from pytest_osmosis.execution import blame

CoroFactory = Callable[[], Coroutine[Any, Any, Any]]

logger = logging.getLogger(__name__)


class LoopStopped(RuntimeError):
    """Raised into code that calls ``stop()`` on the session's loop: only the session may."""


FDS_PER_ROW = 4
"""File descriptors one row in flight may hold: its client's socket to the bridge, the
bridge's end of it, the bridge's connection to the provider, and one for the rollout's own."""

_FD_RESERVE = 64  # the session's own: journals, logs, LiteLLM's files, pytest's capture


def raise_fd_limit() -> None:
    """Raise the soft open-files limit to the hard limit (what ``ulimit -n`` allows anyway)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            for target in (hard, 1 << 20, 10240):  # macOS refuses "unlimited" as a soft limit
                if target != resource.RLIM_INFINITY and target <= soft:
                    continue
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                    return
                except (ValueError, OSError):
                    continue
    except (ImportError, ValueError, OSError):
        return


def fd_capacity() -> tuple[int, int] | None:
    """(rows in flight the open-files limit leaves room for, the limit); None: unbounded."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        in_use = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except OSError:
        in_use = _FD_RESERVE
    return max(1, (soft - in_use - _FD_RESERVE) // FDS_PER_ROW), soft


class BackstopExpired(Exception):
    """An item's backstop fired while the main thread waited for its result."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"backstop timeout (>{seconds}s)")
        self.seconds = seconds


def arm_backstop(seconds: float) -> Callable[[], None] | None:
    """Raise :class:`BackstopExpired` in the main thread after ``seconds``; returns the cancel.

    The timer behind pytest-timeout's ``pytest_timeout_set_timer`` hook for eval items: the
    main thread only ever waits in ``Future.result()``, so the signal lands there. None
    where there is no SIGALRM or this is not the main thread (pytest-timeout decides then).
    """
    import signal

    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        return None

    def expired(signum: int, frame: Any) -> None:
        raise BackstopExpired(seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    return cancel


_OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "osmosis_owner", default=None
)
_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatch]
_WATCHES = weakref.WeakKeyDictionary()


class LoopWatch:
    """Which code held the loop, and for how long, when one callback ran past ``STALL``.

    A heartbeat on the loop and a watchdog thread beside it: when the beat is late, the
    watchdog asks which task is running and charges the stall to that task's owner (a
    budget phase; its child tasks inherit it through a context variable read by the
    loop's task factory). A phase's budget then leaves out stalls owned by other phases,
    so one row's ``time.sleep`` is charged to that row alone. A stall by code no phase
    owns (a plain callback, a task made by a rollout's own task factory) is charged to
    every phase, as if it were not measured.
    """

    TICK = 0.05
    STALL = 0.25

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._owners: weakref.WeakKeyDictionary[asyncio.Future[Any], object]
        self._owners = weakref.WeakKeyDictionary()
        self._stalls: collections.deque[tuple[float, float, object]]
        self._stalls = collections.deque(maxlen=256)
        self._open: tuple[float, object | None] | None = None
        self._last = time.monotonic()
        self._done = threading.Event()
        _WATCHES[loop] = self
        # Set before the loop runs any task; blame.install wraps it under xdist.
        loop.set_task_factory(self._task)
        loop.call_soon_threadsafe(self._beat)
        self._thread = threading.Thread(target=self._watch, name="osmosis-loop-watch", daemon=True)
        self._thread.start()

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        blame.adopt(loop, task)
        owner = _OWNER.get()
        if owner is not None:
            self.own(task, owner)
        return task

    def own(self, task: asyncio.Future[Any], owner: object) -> None:
        with self._lock:
            self._owners[task] = owner

    def _beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._open is not None:
                start, owner = self._open
                self._open = None
                if owner is not None:
                    self._stalls.append((start, now, owner))
            self._last = now
        if not self._done.is_set():
            self.loop.call_later(self.TICK, self._beat)

    def _watch(self) -> None:
        while not self._done.wait(self.TICK):
            with self._lock:
                late = time.monotonic() - self._last > self.STALL
                if late and (self._open is None or self._open[1] is None):
                    task = asyncio.current_task(self.loop)
                    owner = None if task is None else self._owners.get(task)
                    self._open = (self._last, owner)

    def blocked_for(self) -> float:
        """Seconds since the loop last ran its heartbeat (about 0 when nothing blocks it)."""
        with self._lock:
            return max(0.0, time.monotonic() - self._last)

    def stalled_by_others(self, owner: object, since: float) -> float:
        """Seconds since ``since`` that other phases' code held the loop."""
        now = time.monotonic()
        with self._lock:
            spans = list(self._stalls)
            if self._open is not None and self._open[1] is not None:
                spans.append((self._open[0], now, self._open[1]))
        return sum(
            max(0.0, min(end, now) - max(start, since))
            for start, end, whose in spans
            if whose is not owner
        )

    def close(self) -> None:
        self._done.set()


def start_owned(owner: object, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Start ``coro`` as a task whose code, and its child tasks' code, is ``owner``'s."""
    reset = _OWNER.set(owner)
    try:
        task = asyncio.ensure_future(coro)
    finally:
        _OWNER.reset(reset)
    watch = _WATCHES.get(asyncio.get_running_loop())
    if watch is not None:
        watch.own(task, owner)
    return task


def stalled_by_others(owner: object, since: float) -> float:
    """Seconds since ``since`` that code other than ``owner``'s blocked the running loop."""
    watch = _WATCHES.get(asyncio.get_running_loop())
    return 0.0 if watch is None else watch.stalled_by_others(owner, since)


RUN_AHEAD = 8
"""Rows a slot may run ahead of the row pytest waits for: the window of rows started and
not yet taken is ``RUN_AHEAD`` times the concurrency. With instant rows the loop finishes
rows faster than pytest reports them, and each finished row waits in memory until its
item takes it; the window keeps that O(concurrency), not O(rows). Eight times: a row at
the head of the line may take eight times the others' time before the slots behind it
idle (they fill the window meanwhile), at a few KB per finished row held."""


REFILL = 8
"""Once the window has filled, rows run ahead again when it has room for this many (fewer
when the concurrency is lower): when pytest, not the loop, is the bottleneck (instant
rows), each result taken made room for one row, and starting it woke the loop once a row;
a batch starts with one wake-up. Until the window is full, and whenever a slot frees with
room in the window (the concurrency binds), a row starts at once."""


class Executor:
    """Runs coroutine factories on a background loop, at most ``concurrency`` at a time,
    and no more than ``window`` started and not yet taken."""

    def __init__(self, concurrency: int, may_start: Callable[[], bool] | None = None) -> None:
        self.concurrency = max(1, concurrency)
        #: Asked before a queued item starts ahead: False holds the queue (a spent budget).
        self.may_start = may_start or (lambda: True)
        self.loop = asyncio.new_event_loop()
        self._stopping = False
        self._stop_loop = self.loop.stop
        try:
            self.loop.stop = self._refuse_stop  # type: ignore[method-assign]
        except AttributeError:  # a loop type without instance attributes: _run_loop still holds
            pass
        self._thread = threading.Thread(target=self._run_loop, name="osmosis-loop", daemon=True)
        self._thread.start()
        self.watch = LoopWatch(self.loop)
        self._lock = threading.Lock()
        #: Queued, not started: only the factory (a future is made when it starts).
        self._queue: collections.OrderedDict[str, CoroFactory] = collections.OrderedDict()
        #: Started and not taken (running, or finished and waiting for its item).
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._running = 0
        self._pumping = False
        self._again = False
        #: The window filled up: rows run ahead again once it has room for a batch (REFILL).
        self._full = False
        self.peak_in_flight = 0
        self.peak_held = 0
        """Most items started and not taken at once (the window's high-water mark)."""
        self._closed = False

    @property
    def window(self) -> int:
        """Items started ahead and not yet taken, at most (``RUN_AHEAD``)."""
        return self.concurrency * RUN_AHEAD

    def _refuse_stop(self) -> None:
        if self._stopping:
            self._stop_loop()
            return
        raise LoopStopped("only the session may stop its event loop")

    def _run_loop(self) -> None:
        """Serve until ``close()``, whatever rollout code does to the loop.

        ``SystemExit`` and ``KeyboardInterrupt`` raised in a task escape ``run_forever``
        (asyncio re-raises them after recording them on the task, so whoever awaits the
        task still sees them); the loop resumes where it was and the session goes on.
        """
        asyncio.set_event_loop(self.loop)
        while not self._stopping:
            try:
                self.loop.run_forever()
            except (SystemExit, KeyboardInterrupt) as exc:
                logger.warning(
                    "rollout code raised %s on the session's event loop; it goes on",
                    type(exc).__name__,
                )

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run one coroutine on the loop now (not counted against the concurrency)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, key: str, factory: CoroFactory) -> None:
        """Queue ``factory`` under ``key`` unless it is already queued, or started and not
        taken; it starts when a slot and the window have room."""
        with self._lock:
            if self._closed or key in self._futures or key in self._queue:
                return
            self._queue[key] = factory
        self._pump()

    def result(self, key: str, factory: CoroFactory) -> Any:
        """Wait for ``key``'s result, starting it now if nothing started it ahead."""
        with self._lock:
            future = self._futures.get(key)
            if future is None and self._closed:
                raise RuntimeError("the session's executor is closed")
            if future is None:
                # Our turn has come: run it now even if later items fill every slot and
                # the window (what ran ahead waits for this item, not the other way round).
                self._queue.pop(key, None)
                future = self._start_locked(key)
                factory_now: CoroFactory | None = factory
            else:
                factory_now = None
        if factory_now is not None:
            self._launch(factory_now, future)
        result = future.result()  # an exception here (e.g. a backstop) keeps the future
        with self._lock:
            self._futures.pop(key, None)
        self._pump()  # the window has room for one more
        return result

    def start(self, key: str, factory: CoroFactory) -> bool:
        """Start ``key`` now unless ``may_start`` holds it (a budget): True when it runs or
        ran. Unlike ``result``, a budget is never bypassed; the window is (its turn came)."""
        with self._lock:
            if key in self._futures:
                return True
            if self._closed or not self.may_start():
                if not self._closed:
                    self._queue.setdefault(key, factory)
                return False
            queued = self._queue.pop(key, None)
            future = self._start_locked(key)
        self._launch(queued or factory, future)
        return True

    def finished(self, *, wait: bool = True) -> dict[str, Any]:
        """Results of items that completed but nobody has taken yet (key -> result).

        ``wait=False`` (from a signal handler, which may interrupt a holder of the lock)
        returns nothing rather than wait for it.
        """
        if not self._lock.acquire(blocking=wait):
            return {}
        try:
            done = [(k, f) for k, f in self._futures.items() if f.done() and not f.cancelled()]
        finally:
            self._lock.release()
        return {key: future.result() for key, future in done if future.exception() is None}

    def held(self) -> tuple[int, int]:
        """(items started and not taken, of them finished): what the window holds now."""
        with self._lock:
            futures = list(self._futures.values())
        return len(futures), sum(1 for f in futures if f.done())

    def abandon(self, key: str) -> bool:
        """Give up on ``key``: cancel it (if its code ever yields) and forget it, its result
        too; whether it was queued or started. Also for a row pytest is done with without
        taking its result (its item was skipped): it leaves the window and stops spending,
        and :meth:`finished` never returns it."""
        with self._lock:
            future = self._futures.pop(key, None)
            queued = self._queue.pop(key, None)
        if future is not None:
            future.cancel()
        self._pump()
        return future is not None or queued is not None

    def blocker(self) -> tuple[str | None, str, float] | None:
        """Who holds the loop thread right now, when a synchronous call is blocking it.

        ``(node id, where, seconds)``: the row whose task is stepping (also a task the row
        started, or its grader; None: no row's code, e.g. a plain loop callback), the
        innermost frame, and how long the loop has not run a callback. None: the loop
        thread is gone.
        """
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is None:
            return None
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        return blame.running_row(self.loop), where, self.watch.blocked_for()

    def responsive(self, within: float = 1.0) -> bool:
        """Whether the loop runs a callback within ``within`` seconds (nothing blocks it)."""
        try:
            self.call(asyncio.sleep(0), timeout=within)
        except (concurrent.futures.TimeoutError, RuntimeError):
            return False
        return True

    def started(self, key: str) -> bool:
        """Whether ``key`` was started (ahead or now) and its result not taken yet."""
        with self._lock:
            return key in self._futures

    def in_flight(self) -> int:
        with self._lock:
            return self._running

    def cancel_pending(self) -> list[str]:
        """Forget queued work and cancel running work; returns the keys that never finished."""
        with self._lock:
            self._closed = True
            keys = [k for k, f in self._futures.items() if not f.done()] + list(self._queue)
            self._queue.clear()
            running = [f for f in self._futures.values() if not f.done()]
        for future in running:
            future.cancel()
        return keys

    def close(self) -> None:
        self.cancel_pending()
        self.watch.close()

        async def _drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_drain(), self.loop).result(5.0)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
            self._stopping = True
            self.loop.call_soon_threadsafe(self._stop_loop)
            self._thread.join(5.0)

    def pump(self) -> None:
        """Start queued work while slots are free (``may_start`` may say yes now)."""
        self._pump()

    def _pump(self) -> None:
        """Start queued work while slots and the window are free; re-entrant calls just ask
        for another pass."""
        with self._lock:
            if self._pumping:
                self._again = True
                return
            self._pumping = True
        refill = min(REFILL, self.concurrency)
        while True:
            with self._lock:
                self._again = False
                starting = []
                if not self._full or len(self._futures) <= self.window - refill:
                    self._full = False
                    while (
                        self._queue
                        and self._running < self.concurrency
                        and len(self._futures) < self.window
                        and self.may_start()
                    ):
                        key, factory = self._queue.popitem(last=False)
                        starting.append((factory, self._start_locked(key)))
                    self._full = len(self._futures) >= self.window
            if starting:
                self._launch_all([(factory(), future) for factory, future in starting])
            with self._lock:
                if not self._again:
                    self._pumping = False
                    return

    def _start_locked(self, key: str) -> concurrent.futures.Future[Any]:
        """Count ``key`` as started (the lock held): its future, in the window from now."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._futures[key] = future
        self._running += 1
        self.peak_in_flight = max(self.peak_in_flight, self._running)
        self.peak_held = max(self.peak_held, len(self._futures))
        return future

    def _launch(self, factory: CoroFactory, future: concurrent.futures.Future[Any]) -> None:
        """Run ``factory()`` on the loop now (the row pytest waits for)."""
        self._launch_all([(factory(), future)])

    def _launch_all(
        self, entries: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]]
    ) -> None:
        """Start each coroutine as a task on the loop, with one wake-up of it for all (none
        from the loop's own thread: a finished row's callback starting the next)."""
        if threading.get_ident() == self._thread.ident:
            self.loop.call_soon(self._start_tasks, entries)
        else:
            self.loop.call_soon_threadsafe(self._start_tasks, entries)

    def _start_tasks(
        self, entries: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]]
    ) -> None:
        for coro, future in entries:
            self._start_task(coro, future)

    def _start_task(
        self, coro: Coroutine[Any, Any, Any], future: concurrent.futures.Future[Any]
    ) -> None:
        """On the loop: ``coro``'s task; its outcome goes to ``future``, and cancelling
        ``future`` cancels it (what ``run_coroutine_threadsafe`` did, without its second
        future and its wake-up per row).

        The future reaches the task only until the row finishes: a cycle left between
        them (with the task, its coroutine and context) outlived the row until a full
        garbage collection, ~4.7 KB a row that piled up over a session.
        """
        released = [False]

        def release() -> bool:
            """The row's slot frees once: when its task ends, or when ``future`` is
            cancelled (an abandoned row that ignores the cancel holds no slot)."""
            with self._lock:
                if released[0]:
                    return False
                released[0] = True
                self._running -= 1
                return True

        try:
            task = asyncio.ensure_future(coro, loop=self.loop)
        except BaseException as exc:
            coro.close()
            release()
            if not future.done():
                future.set_exception(exc)
            self._pump()
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            return
        link = [task]  # cancel_task's way to the task, cut once the row is done

        def done(finished: asyncio.Future[Any]) -> None:
            link.clear()
            release()
            if future.done():
                pass
            elif finished.cancelled():
                future.cancel()
            elif (exc := finished.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(finished.result())
            self._pump()

        def cancel_task(f: concurrent.futures.Future[Any]) -> None:
            if not f.cancelled():
                return
            if release():
                self._pump()
            for task in link[:1]:  # a slice: ``done`` may clear the link meanwhile
                self.loop.call_soon_threadsafe(task.cancel)

        future.add_done_callback(cancel_task)
        task.add_done_callback(done)
