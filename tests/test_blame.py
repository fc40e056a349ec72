"""The blame slot (pytest_osmosis/execution/blame.py): which row's code a worker's loop runs.

Under xdist a worker runs rows ahead, so when it dies the controller reads this slot to
know which row killed it. The slot must name the row whose task step is running (also
in tasks the row created), nothing between steps or outside rows, survive the
process's death, and never change what a coroutine returns or raises.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from workspaces import (
    HELD,
    PID_ROLLOUT,
    Background,
    gone,
    pid_rows,
    read_index,
    wait_until,
    write_workspace,
)

from pytest_osmosis.execution import blame

ROW_A = "configs/eval/calc.toml::row_0_run_0"
ROW_B = "configs/eval/calc.toml::row_1_run_0"
WORKER = "gw0"


class Blamed:
    """A fresh loop with a blame slot; ``now()`` reads the slot as the controller does."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)
        self.loop = asyncio.new_event_loop()
        slot = blame.install(self.loop, self.directory, WORKER)
        assert slot is not None
        self.slot = slot

    def now(self) -> str | None:
        return blame.culprit(self.directory, WORKER)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()
        self.slot.close()


@pytest.fixture
def blamed(tmp_path: Path) -> Iterator[Blamed]:
    loop = Blamed(tmp_path)
    yield loop
    loop.close()


# -- the driver changes nothing a coroutine does ---------------------------------------


class Boom(Exception):
    pass


async def returns() -> object:
    await asyncio.sleep(0)
    return ("value", [1, 2])


async def raises() -> None:
    await asyncio.sleep(0)
    raise Boom("on purpose")


async def swallows_cancel() -> str:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        await asyncio.sleep(0)  # cleanup that awaits still runs
        return "kept going"
    return "not cancelled"


async def cleans_up_then_cancels(log: list[str]) -> None:
    try:
        await asyncio.sleep(10)
    finally:
        await asyncio.sleep(0)
        log.append("cleaned up")


async def scenario() -> dict[str, Any]:
    """Results, exceptions and cancellations, as asyncio reports them."""
    out: dict[str, Any] = {}
    out["returns"] = await asyncio.create_task(returns())
    error = Boom("raised by a step")

    async def raise_this() -> None:
        await asyncio.sleep(0)
        raise error

    try:
        await asyncio.create_task(raise_this())
    except Boom as caught:
        out["same exception object"] = caught is error
    out["gather"] = await asyncio.gather(returns(), raises(), return_exceptions=True)
    swallow = asyncio.create_task(swallows_cancel())
    await asyncio.sleep(0)
    swallow.cancel()
    out["swallowed cancel"] = (await swallow, swallow.cancelled())
    log: list[str] = []
    cancelled = asyncio.create_task(cleans_up_then_cancels(log))
    await asyncio.sleep(0)
    cancelled.cancel()
    try:
        await cancelled
    except asyncio.CancelledError:
        out["cancel propagates"] = True
    out["cleanup"] = (log, cancelled.cancelled())
    never_started = asyncio.create_task(returns())
    never_started.cancel()
    await asyncio.sleep(0)
    out["cancelled before its first step"] = never_started.cancelled()
    try:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.01)
    except asyncio.TimeoutError:
        out["wait_for times out"] = True
    return out


def test_driven_tasks_return_raise_and_cancel_exactly_as_plain_ones(
    blamed: Blamed,
) -> None:
    plain = asyncio.new_event_loop()
    try:
        expected = plain.run_until_complete(scenario())
    finally:
        plain.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "coroutine ... was never awaited"
        got = blamed.run(scenario())
        gc.collect()
    boom = got["gather"][1]
    assert isinstance(boom, Boom) and str(boom) == "on purpose"
    got["gather"][1] = expected["gather"][1] = "Boom"
    assert got == expected
    assert got["same exception object"] is True
    assert got["swallowed cancel"] == ("kept going", False)
    assert got["cleanup"] == (["cleaned up"], True)


def test_the_driver_forwards_send_throw_and_close(blamed: Blamed) -> None:
    steps: list[str] = []

    async def inner() -> str:
        try:
            steps.append("started")
            await asyncio.sleep(0)
            steps.append("resumed")
            await asyncio.sleep(0)
        except Boom:
            steps.append("caught")
            await asyncio.sleep(0)
            return "recovered"
        finally:
            steps.append("finally")
        return "done"

    driven = blame._Driven(inner(), blamed.slot)
    assert isinstance(driven, Coroutine)
    driven.send(None)
    driven.send(None)
    driven.throw(Boom())
    with pytest.raises(StopIteration) as stop:
        driven.send(None)
    assert stop.value.value == "recovered"
    assert steps == ["started", "resumed", "caught", "finally"]

    steps.clear()
    driven = blame._Driven(inner(), blamed.slot)
    next(driven)
    driven.close()  # GeneratorExit reaches the inner coroutine's finally
    assert steps == ["started", "finally"]

    unstarted = inner()
    blame._Driven(unstarted, blamed.slot).close()
    # Closed, not merely dropped: no "coroutine ... was never awaited" warning later.
    assert inspect.getcoroutinestate(unstarted) == inspect.CORO_CLOSED


def test_a_tasks_coroutine_still_looks_like_its_own(blamed: Blamed) -> None:
    """Its repr names it, and its state is its own (anyio reads it to deliver cancels)."""

    async def main() -> tuple[str, list[str]]:
        states: list[str] = []

        async def waits(gate: asyncio.Event) -> None:
            me: Any = asyncio.current_task()
            states.append(inspect.getcoroutinestate(me.get_coro()))
            await gate.wait()

        gate = asyncio.Event()
        task = asyncio.create_task(waits(gate))
        coro: Any = task.get_coro()
        states.append(inspect.getcoroutinestate(coro))
        text = repr(task)
        await asyncio.sleep(0)
        states.append(inspect.getcoroutinestate(coro))
        gate.set()
        await task
        states.append(inspect.getcoroutinestate(coro))
        return text, states

    text, states = blamed.run(main())
    assert "waits()" in text and "test_blame.py" in text
    assert states == [
        inspect.CORO_CREATED,
        inspect.CORO_RUNNING,
        inspect.CORO_SUSPENDED,
        inspect.CORO_CLOSED,
    ]


# -- the slot names the running row ----------------------------------------------------


def test_a_row_is_named_from_its_first_step_and_in_the_tasks_it_creates(
    blamed: Blamed,
) -> None:
    seen: dict[str, set[str | None]] = {ROW_A: set(), ROW_B: set()}

    async def child(row: str) -> None:
        for _ in range(3):
            seen[row].add(blamed.now())
            await asyncio.sleep(0)

    async def row(nodeid: str) -> None:
        blame.enter(nodeid)
        seen[nodeid].add(blamed.now())  # same step as enter()
        await asyncio.sleep(0)
        await asyncio.gather(child(nodeid), child(nodeid))
        await asyncio.create_task(child(nodeid))
        await asyncio.wait_for(child(nodeid), timeout=5)
        done, _ = await asyncio.wait({asyncio.ensure_future(child(nodeid))})
        seen[nodeid].add(blamed.now())

    async def main() -> None:
        # Two rows interleaved step by step on one loop, as a worker runs them ahead.
        await asyncio.gather(row(ROW_A), row(ROW_B))

    blamed.run(main())
    assert seen == {ROW_A: {ROW_A}, ROW_B: {ROW_B}}


def test_the_slot_is_clear_outside_rows(blamed: Blamed) -> None:
    seen: dict[str, str | None] = {}
    served = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A server's connection task: made by a loop callback, so no row's, even though
        # the server was started from inside row A (as the bridge is).
        seen["server task"] = blamed.now()
        await reader.readline()
        seen["server after a read"] = blamed.now()
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()
        served.set()

    def callback() -> None:
        seen["plain callback"] = blamed.now()

    async def row_a() -> None:
        blame.enter(ROW_A)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello\n")
        await writer.drain()
        assert await reader.readline() == b"ok\n"
        seen["row after its reply"] = blamed.now()
        asyncio.get_running_loop().call_soon(callback)
        writer.close()
        await served.wait()
        server.close()
        await server.wait_closed()

    async def no_row() -> None:
        seen["task of no row"] = blamed.now()
        await asyncio.sleep(0)
        seen["task of no row, later"] = blamed.now()

    async def main() -> None:
        seen["before any row"] = blamed.now()
        await asyncio.gather(blamed.loop.create_task(row_a()), blamed.loop.create_task(no_row()))

    # Tasks made from outside the loop (as the executor makes rows) start with no row.
    blamed.run(main())
    assert blamed.now() is None  # after the last step
    assert seen == {
        "before any row": None,
        "server task": None,
        "server after a read": None,
        "row after its reply": ROW_A,
        "plain callback": None,
        "task of no row": None,
        "task of no row, later": None,
    }


def test_an_existing_task_factory_still_makes_the_tasks(tmp_path: Path) -> None:
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        made.append(type(coro).__name__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop = asyncio.new_event_loop()
    loop.set_task_factory(factory)
    slot = blame.install(loop, str(tmp_path), WORKER)
    assert slot is not None
    try:

        async def row() -> str | None:
            blame.enter(ROW_A)
            await asyncio.sleep(0)
            return blame.culprit(str(tmp_path), WORKER)

        assert loop.run_until_complete(row()) == ROW_A
    finally:
        loop.close()
        slot.close()
    assert made == ["_Driven"]


@pytest.mark.skipif(
    not hasattr(asyncio, "eager_task_factory"), reason="eager tasks are Python 3.12+"
)
def test_a_task_started_eagerly_inside_a_row_leaves_the_row_named(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    slot = blame.install(loop, str(tmp_path), WORKER)
    assert slot is not None
    seen: list[str | None] = []

    async def child() -> int:
        seen.append(blame.culprit(str(tmp_path), WORKER))  # runs inside the row's step
        await asyncio.sleep(0)
        return 5

    async def row() -> int:
        blame.enter(ROW_A)
        task = asyncio.create_task(child())
        seen.append(blame.culprit(str(tmp_path), WORKER))  # after the nested step
        return await task

    try:
        assert loop.run_until_complete(row()) == 5
    finally:
        loop.close()
        slot.close()
    assert seen == [ROW_A, ROW_A]


def test_enter_off_a_blamed_loop_changes_nothing(tmp_path: Path) -> None:
    async def row() -> None:
        blame.enter(ROW_A)
        await asyncio.sleep(0)

    asyncio.run(row())
    blame.enter(ROW_B)  # no running loop: only the context variable
    assert blame.culprit(str(tmp_path), WORKER) is None


# -- what the controller reads ---------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00" * 4096,
        (5000).to_bytes(8, sys.byteorder) + b"x" * 100,
        (4).to_bytes(8, sys.byteorder) + b"\xff\xfe\xfd\xfc",
    ],
    ids=["empty", "cleared", "length-past-the-end", "not-utf8"],
)
def test_a_slot_that_names_nothing_reads_as_none(tmp_path: Path, content: bytes) -> None:
    (tmp_path / WORKER).write_bytes(content)
    assert blame.culprit(str(tmp_path), WORKER) is None


def test_unreadable_places_read_as_none(tmp_path: Path) -> None:
    assert blame.culprit(str(tmp_path), "gw7") is None  # never written
    assert blame.culprit(str(tmp_path / "gone"), WORKER) is None
    assert blame.culprit(str(tmp_path), "../gw0") is None
    loop = asyncio.new_event_loop()
    try:
        assert blame.install(loop, str(tmp_path / "gone"), WORKER) is None
        assert loop.get_task_factory() is None
    finally:
        loop.close()


def test_a_node_id_too_long_for_the_slot_is_not_named(blamed: Blamed) -> None:
    async def row() -> str | None:
        blame.enter(ROW_A)
        blame.enter("configs/eval/x.toml::" + "r" * blame.SLOT_SIZE)
        return blamed.now()

    assert blamed.run(row()) is None


@pytest.mark.skipif(os.name != "posix", reason="dead controllers are found with os.kill(pid, 0)")
def test_a_killed_controllers_directory_is_swept_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"osmosis-blame-{gone.pid}-abcd1234"
    stale.mkdir()
    (stale / WORKER).write_bytes(b"")
    alive = tmp_path / f"osmosis-blame-{os.getpid()}-efgh5678"
    alive.mkdir()
    unrelated = tmp_path / "osmosis-blame-notapid"
    unrelated.mkdir()
    made = Path(blame.make_directory())
    assert made.parent == tmp_path and made.name.startswith(f"osmosis-blame-{os.getpid()}-")
    assert made.is_dir() and alive.is_dir() and unrelated.is_dir()
    assert not stale.exists()


CRASH = r"""
import asyncio, ctypes, os, sys
from pytest_osmosis.execution import blame

directory, how = sys.argv[1], sys.argv[2]
loop = asyncio.new_event_loop()
blame.install(loop, directory, "gw3")

async def bystander():
    blame.enter("configs/eval/calc.toml::row_0_run_0")
    while True:
        await asyncio.sleep(0)

async def crash():
    await asyncio.sleep(0.05)
    if how == "exit":
        os._exit(3)
    ctypes.string_at(0)

async def culprit():
    blame.enter("configs/eval/calc.toml::row_7_run_1")
    await asyncio.sleep(0.01)
    await asyncio.gather(asyncio.sleep(0), crash())

async def main():
    await asyncio.gather(bystander(), bystander(), culprit())

loop.run_until_complete(main())
"""


@pytest.mark.parametrize("how", ["exit", "segfault"])
def test_a_process_that_dies_mid_row_leaves_that_row_readable(tmp_path: Path, how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASH), str(tmp_path), how],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if how == "exit":
        assert done.returncode == 3, done.stderr
    else:
        assert done.returncode < 0, done.stderr  # killed by the signal
    assert blame.culprit(str(tmp_path), "gw3") == "configs/eval/calc.toml::row_7_run_1"


# -- a worker killed from outside ------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_killed_from_outside_blames_no_row(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """kill -9 (the OOM killer) while the worker's row waits on the model: no row's code
    was running, so no row is recorded ``worker_crashed``; the row runs again and passes."""
    root = pytester.path
    write_workspace(root, rows=pid_rows(root, 1), rollout_source=PID_ROLLOUT)
    model_env.hold = HELD
    session = Background(
        pytester, "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "oom", "-n", "1"
    )
    wait_until(lambda: model_env.holding == 1, "the row waits on the model")
    (worker,) = {int(p.name) for p in (root / "pids").iterdir()}
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: gone(worker), "the worker is gone")
    model_env.hold = ""  # the replacement worker's calls are answered
    result = session.join()
    out = result.stdout.str()
    assert "INTERNALERROR" not in out, out
    records = read_index(root / ".osmosis" / "evals" / "oom")
    assert [(r["row_index"], r["status"], r.get("error_type")) for r in records] == [
        (0, "success", None)
    ], out
    result.assert_outcomes(passed=1)


# -- a row blocking the loop: only that row is blamed ----------------------------------

#: Row 0 is innocent: it stays in flight (the main thread waits for it) until the blocker
#: blocks. Row 1 blocks the loop synchronously, where its metadata says, until the test
#: releases it (the cap only prevents a hang).
LOOP_BLOCKER = r"""
import asyncio
import os
import time

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend


def _block():
    open("blocking", "w").close()
    cap = time.monotonic() + 240
    while not os.path.exists("released") and time.monotonic() < cap:
        time.sleep(0.05)


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        where = ctx.metadata["block"]
        if where == "":
            while not os.path.exists("blocking"):
                await asyncio.sleep(0.05)
        elif where == "subtask":  # as agent frameworks run tools

            async def blk():
                _block()

            await asyncio.create_task(blk())
        elif where == "callback":  # no row's code: a plain loop callback
            asyncio.get_running_loop().call_soon(_block)
            await asyncio.sleep(0.5)
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class Always(Grader):
    async def grade(self, ctx):
        if ctx.metadata["block"] == "grader":
            _block()
        ctx.set_reward(1.0)


backend = LocalBackend(workflow=Workflow, grader=Always)
"""

#: Released when a row waits past its backstop naming the blocker, or when any row fails
#: (so a run that blames the wrong row ends too).
RELEASE_THE_BLOCKER = """
import warnings
from pathlib import Path

_warn = warnings.warn


def _observed(message, *args, **kwargs):
    if "waits past its backstop" in str(message):
        Path("released").touch()
    return _warn(message, *args, **kwargs)


warnings.warn = _observed


def pytest_runtest_logreport(report):
    if report.failed:
        Path("released").touch()
"""


def _blocking_workspace(
    pytester: pytest.Pytester, where: str, blocks: tuple[str, ...] = ("", "{where}")
) -> None:
    rows = [
        {"user_prompt": f"q{index}", "ground_truth": "ok", "metadata": {"block": block}}
        for index, block in enumerate(b.format(where=where) for b in blocks)
    ]
    # A backstop of 6 + 3 + 1 s; the innocent row is held in flight by the blocker itself.
    write_workspace(
        pytester.path,
        rows=rows,
        rollout_source=LOOP_BLOCKER,
        evaluation={"agent_workflow_timeout_s": 6, "grader_timeout_s": 3, "batch_size": 2},
    )
    pytester.makeini("[pytest]\nosmosis_backstop_grace = 1\n")
    pytester.makeconftest(RELEASE_THE_BLOCKER)


@pytest.mark.parametrize(
    ("where", "error", "frame"),
    [("grader", "grader_timeout", "_block"), ("subtask", "workflow_timeout", "_block")],
)
def test_a_row_blocking_the_loop_in_its_grader_or_a_task_it_started_is_the_only_one_blamed(
    pytester: pytest.Pytester, model_env: Any, where: str, error: str, frame: str
) -> None:
    _blocking_workspace(pytester, where)
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "blk"
    )
    out = result.stdout.str()
    records = read_index(pytester.path / ".osmosis" / "evals" / "blk")
    assert [(r["row_index"], r["status"], r.get("error_type")) for r in records] == [
        (0, "success", None),
        (1, "failed", error),
    ], out
    result.stdout.fnmatch_lines(
        [
            f"*row_0_run_0 waits past its backstop: row 1 run 0 is blocking the event loop at *main.py:* in {frame}*"
        ]
    )
    assert result.ret == 1


def test_a_loop_blocked_by_no_rows_code_stops_the_session_and_blames_no_row(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    _blocking_workspace(pytester, "callback")
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "blk"
    )
    (pytester.path / "released").touch()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    result.stdout.fnmatch_lines(
        [
            "*osmosis: the event loop has been blocked for * s by code that is not a row's "
            "(at *main.py:* in _block); rows in flight were not recorded*"
        ]
    )
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    run_dir = pytester.path / ".osmosis" / "evals" / "blk"
    index = run_dir / "index.jsonl"
    assert not index.exists() or read_index(run_dir) == [], out


def test_a_row_still_blocking_the_loop_after_its_own_backstop_stops_the_session(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """Row 0's grader never returns (until the test ends): row 0 fails at its backstop; row 1,
    which could not start, waits one more backstop, then the session stops in one line and
    row 1 stays pending. Nothing releases the blocker during the run."""
    _blocking_workspace(pytester, "grader", blocks=("{where}", ""))
    pytester.makeconftest("")
    try:
        result = pytester.runpytest_subprocess(
            "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "blk"
        )
    finally:
        (pytester.path / "released").touch()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    result.stdout.fnmatch_lines(
        [
            "*row_1_run_0 waits past its backstop: row 0 run 0 is blocking the event loop*",
            "*osmosis: the event loop has been blocked for * s by row 0 run 0 "
            "(at *main.py:* in _block); rows in flight were not recorded*",
        ]
    )
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    records = read_index(pytester.path / ".osmosis" / "evals" / "blk")
    assert [(r["row_index"], r["status"], r.get("error_type")) for r in records] == [
        (0, "failed", "backstop_timeout")
    ], out
