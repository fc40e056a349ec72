"""A row's own output in its own report (plugin/row_output.py, execution/streams.py).

Rows run ahead on the session's loop thread, so whatever pytest's thread is doing when a
row prints (another item's phase, its capture resumed; or between items, capture
suspended), the row's lines belong to the row: they are kept under its node id and its
item's report shows them as ``Captured stdout setup`` (the row is waited for in setup).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import io
import threading
from typing import Any

import pytest
from workspaces import CALC_ROLLOUT, calc_rows, write_workspace

from pytest_osmosis.execution import blame
from pytest_osmosis.execution.streams import RoutedStream, RowOutput, unroute

ROW_A = "configs/eval/calc.toml::row_0_run_0"
ROW_B = "configs/eval/calc.toml::row_1_run_0"


class Text(io.StringIO):
    """A Python-level text stream (takes instance attributes, as pytest's capture files)."""


def test_a_row_s_writes_are_its_own_from_its_tasks_and_threads_but_no_server_s() -> None:
    output = RowOutput()
    target = Text()
    stream = output.route("stdout", target)
    assert stream is target and isinstance(stream, io.StringIO)  # pytest's checks still hold
    output.open(ROW_A)
    output.open(ROW_B)
    served = asyncio.Event()

    async def serve() -> None:  # started from a plain callback, in row A's context
        stream.write("server\n")
        served.set()

    async def child() -> None:
        stream.write("A's task\n")

    async def row_a() -> None:
        blame.enter(ROW_A)
        stream.write("A\n")
        await asyncio.get_running_loop().create_task(child())
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(serve()))
        await served.wait()

    async def row_b() -> None:
        blame.enter(ROW_B)
        await asyncio.to_thread(stream.writelines, ["B's thread", "\n"])
        print("B", file=stream)

    async def main() -> None:
        await asyncio.gather(row_a(), row_b())

    _run_as_the_session_loop(main())
    stream.write("pytest's own\n")
    assert output.take(ROW_A) == {"stdout": "A\nA's task\n"}
    assert output.take(ROW_B) == {"stdout": "B's thread\nB\n"}
    assert target.getvalue() == "server\npytest's own\n"
    assert output.take(ROW_A) == {}  # taken once; later writes are no longer its own
    assert unroute(stream) is target and "write" not in vars(target)


def test_a_row_s_thread_running_a_loop_of_its_own_writes_for_the_row() -> None:
    """A synchronous SDK call in a row's thread (``asyncio.run`` inside ``to_thread``) runs
    a private loop whose tasks no row entered: what they print is still the row's. A
    private loop in pytest's thread (an async test of the user's) is still no row's."""
    output = RowOutput()
    target = Text()
    stream = output.route("stdout", target)
    output.open(ROW_A)

    async def inner(text: str) -> None:
        stream.write(text)

    async def row_a() -> None:
        blame.enter(ROW_A)
        await asyncio.to_thread(asyncio.run, inner("A's private loop\n"))

    _run_as_the_session_loop(row_a())
    context = contextvars.copy_context()
    context.run(blame.enter, ROW_A)  # a context naming a row, in pytest's thread
    context.run(asyncio.run, inner("pytest's own loop\n"))
    assert output.take(ROW_A) == {"stdout": "A's private loop\n"}
    assert target.getvalue() == "pytest's own loop\n"
    unroute(stream)


def _run_as_the_session_loop(coro: Any) -> None:
    """Run ``coro`` on a fresh loop whose tasks are adopted as the session loop's are."""
    loop = asyncio.new_event_loop()
    loop.set_task_factory(lambda loop, coro, **kw: _adopted(loop, coro, **kw))
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


def _adopted(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """The session loop's task factory, as far as rows are concerned (executor.LoopWatch)."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    blame.adopt(loop, task)
    return task


class Slotted:
    """A stream that takes no attributes: its write cannot be replaced on it."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


def test_a_stream_without_attributes_is_stood_in_for_and_bytes_are_refused() -> None:
    output = RowOutput(which=lambda: ROW_A)
    target = Slotted()
    live: list[str] = []
    stream = output.route("stderr", target, tee=live.append)
    assert isinstance(stream, RoutedStream)
    stream.write("before the row\n")
    output.open(ROW_A)
    stream.write("the row\n")
    with pytest.raises(TypeError, match="must be str, not bytes"):
        stream.write(b"bytes")  # type: ignore[arg-type]
    assert stream.getvalue() == "before the row\n"  # everything else is the stream's
    assert output.take(ROW_A) == {"stderr": "the row\n"} and live == ["the row\n"]
    assert unroute(stream) is target


def test_pytest_s_thread_writes_to_no_row() -> None:
    """Even where its context names a row (``enter`` called off a loop, as a test may)."""
    assert threading.current_thread() is threading.main_thread()
    context = contextvars.copy_context()
    context.run(blame.enter, ROW_A)
    assert context.run(blame.current_row) is None
    assert blame.current_row() is None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # another thread, that context
        assert pool.submit(context.run, blame.current_row).result() == ROW_A


# Row 1 prints (in its workflow, a task it starts, a thread, its grader) while pytest's
# thread waits in row 0's setup, with capture on: row 0 waits for row 1 to have printed.
PRINTS_ROLLOUT = CALC_ROLLOUT.replace(
    '        if do == "workflow_raise":\n',
    '        if do == "wait":\n'
    "            await PRINTED.wait()\n"
    '        if do == "print":\n'
    '            print("row 1 workflow")\n'
    '            print("row 1 complains", file=sys.stderr)\n'
    "            await asyncio.create_task(say('row 1 task'))\n"
    "            await asyncio.to_thread(print, 'row 1 thread')\n"
    '        if do == "workflow_raise":\n',
).replace(
    '        if do == "skip":\n',
    '        if do == "print":\n'
    '            print("row 1 grader")\n'
    "            PRINTED.set()\n"
    '        if do == "skip":\n',
) + (
    "\n\nimport sys\n\nPRINTED = asyncio.Event()\n\n\n"
    "async def say(text):\n"
    "    print(text)\n"
)
assert PRINTS_ROLLOUT.count("PRINTED") == 3

ROW_1_OUT = ["row 1 workflow", "row 1 task", "row 1 thread", "row 1 grader"]


def _passes(lines: list[str]) -> dict[str, list[str]]:
    """-rA's PASSES section: each item's header (``row_1_run_0``) -> the lines under it."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    inside = False
    for line in lines:
        if line.startswith("=") and " PASSES " in line:
            inside = True
            continue
        if inside and line.startswith("=") and line.endswith("="):
            break
        if inside and line.startswith("_") and line.endswith("_"):
            current = found.setdefault(line.strip("_ "), [])
        elif inside and current is not None:
            current.append(line)
    return found


@pytest.mark.parametrize("capture", ["fd", "sys", "tee-sys", "no"])
def test_a_row_printing_during_another_item_shows_in_its_own_report(
    pytester: pytest.Pytester, model_env: Any, capture: str
) -> None:
    rows = calc_rows([("What is 2 + 2?", "4", "wait"), ("What is 3 + 3?", "6", "print")])
    write_workspace(pytester.path, rows=rows, rollout_source=PRINTS_ROLLOUT)
    result = pytester.runpytest(
        "--osmosis-eval", "-p", "no:cacheprovider", f"--capture={capture}", "-rA"
    )
    result.assert_outcomes(passed=2)
    sections = _passes(result.outlines)
    out = "\n".join(result.outlines)
    if capture == "no":  # -s: rows print as they go, as tests do
        assert sections == {}
        assert all(out.count(line) == 1 for line in ROW_1_OUT), out
        return
    assert list(sections) == ["row_1_run_0"], out  # row 0's report holds none of it
    assert [line.strip("- ") for line in sections["row_1_run_0"]] == [
        "Captured stdout setup",
        *ROW_1_OUT,
        "Captured stderr setup",
        "row 1 complains",
    ]
    shown = 2 if capture == "tee-sys" else 1  # tee-sys: also as they are printed
    assert all(out.count(line) == shown for line in ROW_1_OUT), out
