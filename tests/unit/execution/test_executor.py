"""How far the executor runs ahead of the item pytest waits for (execution/executor.py).

Rows run ahead on the loop thread while pytest reports earlier ones; an instant row
finishes faster than pytest reports it, and its result waits in memory until its item
takes it. Unbounded, a 100,000-row session held tens of thousands of finished results at
once (issue 30 item 5); the window keeps what is held to a few times the concurrency.
Everything here waits on the executor's own state, never on a clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from pytest_osmosis.execution.executor import REFILL, RUN_AHEAD, Executor

CONCURRENCY = 2
ROWS = 100


@pytest.fixture
def executor() -> Iterator[Executor]:
    ex = Executor(CONCURRENCY)
    try:
        yield ex
    finally:
        ex.close()


def _settled(executor: Executor, running: int = 0) -> tuple[int, int]:
    """(started and not taken, of them finished), once only ``running`` rows run and no
    other will start.

    Read on the loop thread, between two of its callbacks: a finishing row's callback
    frees its slot and starts the next row there, and read from this thread the count
    could fall in between (twice in a row, on an unlucky switch of threads). The deadline
    is only how long a broken executor may hang this test, never what it asserts.
    """

    async def snapshot() -> tuple[int, tuple[int, int]]:
        return executor.in_flight(), executor.held()

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen: tuple[int, tuple[int, int]] = executor.call(snapshot())
        if seen[0] == running:
            return seen[1]
        time.sleep(0.005)
    raise AssertionError("the executor never settled")


def _instant(ran: list[int], index: int) -> Callable[[], Coroutine[Any, Any, int]]:
    async def row() -> int:
        ran.append(index)
        return index

    return row


def test_instant_rows_run_ahead_no_further_than_the_window(executor: Executor) -> None:
    """Before the window, every one of the 100 rows finished and waited in its future
    (memory O(rows)); now the loop stops once ``window`` results wait untaken."""
    ran: list[int] = []
    for i in range(ROWS):
        executor.submit(f"row{i}", _instant(ran, i))
    assert executor.window == CONCURRENCY * RUN_AHEAD < ROWS
    assert _settled(executor) == (executor.window, executor.window)
    assert sorted(ran) == list(range(executor.window))  # in pytest's order
    # Results taken make room for a batch, which starts with one wake-up of the loop (one
    # a row was most of a row's cost on the main thread), so the window refills...
    refill = min(REFILL, CONCURRENCY)
    assert refill > 1
    for i in range(refill - 1):
        assert executor.result(f"row{i}", _instant(ran, i)) == i
    assert _settled(executor) == (executor.window - refill + 1,) * 2
    assert len(ran) == executor.window  # not yet room for a batch
    for i in range(refill - 1, 2 * refill):
        assert executor.result(f"row{i}", _instant(ran, i)) == i
    assert _settled(executor) == (executor.window, executor.window)
    assert len(ran) == executor.window + 2 * refill
    # ...and every row still runs exactly once, in the end.
    for i in range(2 * refill, ROWS):
        assert executor.result(f"row{i}", _instant(ran, i)) == i
    assert sorted(ran) == list(range(ROWS))
    assert executor.held() == (0, 0)
    assert executor.peak_held == executor.window


def test_an_item_whose_turn_came_is_never_held_by_a_full_window(executor: Executor) -> None:
    """pytest may ask for a row beyond the window (another plugin reordered, a re-run):
    it starts at once, whatever the window and the slots hold."""
    ran: list[int] = []
    for i in range(ROWS):
        executor.submit(f"row{i}", _instant(ran, i))
    _settled(executor)
    assert executor.result("row70", _instant(ran, 70)) == 70
    assert executor.start("row80", _instant(ran, 80))
    assert executor.result("row80", _instant(ran, 80)) == 80
    assert ran.count(70) == ran.count(80) == 1
    assert _settled(executor) == (executor.window, executor.window)


def test_a_slow_head_row_lets_the_rows_behind_it_fill_the_window(executor: Executor) -> None:
    """The row pytest waits for is slow: the other slot keeps running rows behind it until
    the window is full, then waits; none is lost or run twice."""
    ran: list[int] = []
    release = threading.Event()

    async def slow() -> str:
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return "slow"

    executor.submit("head", slow)
    for i in range(ROWS):
        executor.submit(f"row{i}", _instant(ran, i))
    try:
        assert _settled(executor, running=1) == (executor.window, executor.window - 1)
        assert len(ran) == executor.window - 1
    finally:
        release.set()  # a failure must not leave the loop's thread pool waiting forever
    assert executor.result("head", slow) == "slow"
    assert [executor.result(f"row{i}", _instant(ran, i)) for i in range(ROWS)] == list(range(ROWS))
    assert sorted(ran) == list(range(ROWS))


def test_a_budget_holds_the_queue_but_not_a_row_it_admits(executor: Executor) -> None:
    """``may_start`` says no: nothing starts ahead. A row ``start`` is admitted for runs
    even with the window full; held, it stays queued and starts when the budget allows."""
    admitted = {"yes": False}
    executor.may_start = lambda: admitted["yes"]
    ran: list[int] = []
    for i in range(ROWS):
        executor.submit(f"row{i}", _instant(ran, i))
    assert _settled(executor) == (0, 0)
    assert not executor.start("row0", _instant(ran, 0))
    assert ran == []
    admitted["yes"] = True
    executor.pump()
    assert _settled(executor) == (executor.window, executor.window)
    assert executor.start("row90", _instant(ran, 90))
    assert executor.result("row90", _instant(ran, 90)) == 90
    assert ran.count(90) == 1


class _Result:
    """A row's result that can be watched (a weak reference) for when it is freed."""


def test_a_taken_result_is_freed_without_the_garbage_collector(executor: Executor) -> None:
    """The row's future and the loop's task future pointed at each other through their
    callbacks: every finished row (futures, task, coroutine, context, result) stayed in
    memory until a full collection, ~4.7 KB a row piling up over a session. With the
    collector off, a taken result must be gone once nothing holds it."""
    import gc
    import weakref

    watched: list[weakref.ref[_Result]] = []

    def row() -> Callable[[], Coroutine[Any, Any, _Result]]:
        async def run() -> _Result:
            result = _Result()
            watched.append(weakref.ref(result))
            return result

        return run

    gc.collect()
    gc.disable()
    try:
        for i in range(20):
            executor.submit(f"row{i}", row())
        for i in range(20):
            assert isinstance(executor.result(f"row{i}", row()), _Result)
        _settled(executor)  # the loop thread has finished each row's callbacks
        alive = [ref for ref in watched if ref() is not None]
        assert len(watched) == 20
        assert alive == []
    finally:
        gc.enable()


def test_rows_pytest_is_done_with_without_taking_leave_the_window_and_the_results(
    executor: Executor,
) -> None:
    """A row whose item pytest finished without waiting for it (a conftest skipped it) is
    abandoned: before, it held its slot for good, and a window full of such rows stopped
    every later row from running ahead. Its result is dropped (``finished``, which the
    session's end journals, never returns it): pytest reported the item skipped."""
    ran: list[int] = []
    for i in range(ROWS):
        executor.submit(f"row{i}", _instant(ran, i))
    assert _settled(executor) == (executor.window, executor.window)
    for i in range(executor.window):  # pytest skipped each of these items
        assert executor.abandon(f"row{i}")
    assert _settled(executor) == (executor.window, executor.window)
    assert sorted(ran) == list(range(2 * executor.window))  # the next window ran ahead
    assert set(executor.finished()) == {
        f"row{i}" for i in range(executor.window, 2 * executor.window)
    }
    assert not executor.abandon("row0")  # abandoned twice: nothing left to forget
    # A queued row pytest is done with never starts; asked for by its item (a rerun), it runs.
    assert executor.abandon(f"row{ROWS - 1}")
    for i in range(executor.window, ROWS - 1):
        assert executor.result(f"row{i}", _instant(ran, i)) == i
    assert _settled(executor) == (0, 0)
    assert ROWS - 1 not in ran
    assert executor.result(f"row{ROWS - 1}", _instant(ran, ROWS - 1)) == ROWS - 1
