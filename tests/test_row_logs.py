"""A row's own log records in its own report (execution/row_logs.py, plugin/row_output.py).

Rows run ahead on the session's loop thread, so whatever pytest's thread is doing when a
row logs (another item's phase, whose report and ``caplog`` capture records; or between
items, where nothing of pytest's captures them and an xdist worker loses them), the row's
records belong to the row: its item's report shows them as ``Captured log setup``.
"""

from __future__ import annotations

import asyncio
import logging
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from test_row_output import ROW_A, _passes, _run_as_the_session_loop
from workspaces import CALC_ROLLOUT, calc_rows, write_workspace

from pytest_osmosis.execution import blame
from pytest_osmosis.execution.row_logs import RowLogHandler, RowLogs
from pytest_osmosis.execution.streams import RowOutput

# Row 1 logs (in its workflow, a task it starts, a thread, its grader) only once pytest's
# thread is somewhere else and lets it (``between.LOG``), and that waits until it has.
LOGS_ROLLOUT = CALC_ROLLOUT.replace(
    '        if do == "workflow_raise":\n',
    '        if do == "first":  # row 0 finishes once row 1 has started\n'
    "            import between\n"
    "            assert await asyncio.to_thread(between.STARTED.wait, 300)\n"
    '        if do == "log":\n'
    "            import between\n"
    "            between.STARTED.set()\n"
    "            assert await asyncio.to_thread(between.LOG.wait, 300)\n"
    '            LOGGER.warning("row 1 %s", "workflow")\n'
    '            LOGGER.info("row 1 informs")\n'
    "            await asyncio.create_task(say('row 1 task'))\n"
    "            await asyncio.to_thread(LOGGER.warning, 'row 1 thread')\n"
    '        if do == "workflow_raise":\n',
).replace(
    '        if do == "skip":\n',
    '        if do == "log":\n'
    '            LOGGER.warning("row 1 grader")\n'
    "            import between\n"
    "            between.LOGGED.set()\n"
    '        if do == "skip":\n',
) + (
    "\n\nimport logging\n\nLOGGER = logging.getLogger('calc.rollout')\n\n\n"
    "async def say(text):\n"
    "    LOGGER.warning(text)\n"
)
assert LOGS_ROLLOUT.count("between.") == 4

BETWEEN = """
import threading

STARTED = threading.Event()  # row 1 runs (ahead of its item)
LOG = threading.Event()  # row 1 may log now
LOGGED = threading.Event()
"""

ROW_1_WARNINGS = ["row 1 workflow", "row 1 task", "row 1 thread", "row 1 grader"]
ROWS = calc_rows([("What is 2 + 2?", "4", "first"), ("What is 3 + 3?", "6", "log")])
PLAIN = ("-p", "no:cacheprovider", "-rA", "-o", "log_format=%(levelname)s %(name)s %(message)s")

# A test of the user's runs between row 0 and row 1 (rows 0 and 1 have started by then),
# with ``caplog``: row 1 logs while it runs, and none of that is the test's.
USER_TEST = """
import logging

import between


def test_user(request):
    caplog = None
    if request.config.pluginmanager.has_plugin("logging-plugin"):
        caplog = request.getfixturevalue("caplog")
    logging.getLogger("user").warning("the user's own")
    between.LOG.set()
    assert between.LOGGED.wait(300), "row 1 did not log"
    if caplog is not None:
        assert [r.getMessage() for r in caplog.records] == ["the user's own"]
        assert "row 1" not in caplog.text
"""
USER_CONFTEST = """
def pytest_collection_modifyitems(items):
    user = [item for item in items if item.name == "test_user"]
    rows = [item for item in items if item not in user]
    items[:] = rows[:1] + user + rows[1:]
"""


def test_a_row_s_records_are_its_own_and_no_one_else_s() -> None:
    """Decided in the emitting thread, once per record: a row's task and thread log for
    the row (also on our own loggers); a plain loop callback (a server) and pytest's
    thread log for whoever captures them, as before."""
    output = RowOutput()
    logs = RowLogs(output)
    ours = RowLogHandler(logs, logging.INFO)
    ours.setFormatter(logging.Formatter("%(name)s %(message)s"))
    theirs = _Kept()
    theirs.addFilter(logs.not_a_row_s)
    logger = logging.getLogger("test_row_logs.unit")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    for handler in (ours, theirs):
        logger.addHandler(handler)
    output.open(ROW_A)
    served = asyncio.Event()

    async def row_a() -> None:
        blame.enter(ROW_A)
        logger.info("A")
        logger.debug("A below the level: nobody's")
        await asyncio.to_thread(logging.getLogger("test_row_logs.unit").warning, "A's thread")

        def serve() -> None:
            logger.warning("server")
            served.set()

        asyncio.get_running_loop().call_soon(serve)
        await served.wait()

    try:
        _run_as_the_session_loop(row_a())
        logger.warning("pytest's own")
    finally:
        for handler in (ours, theirs):
            logger.removeHandler(handler)
    assert output.take(ROW_A) == {"log": "test_row_logs.unit A\ntest_row_logs.unit A's thread"}
    assert theirs.messages == ["server", "pytest's own"]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _lines(section: list[str]) -> list[str]:
    return [line.strip("- ") for line in section if not line.startswith("[gw")]  # xdist: where


def _workspace(pytester: pytest.Pytester, conftest: str) -> None:
    write_workspace(pytester.path, rows=ROWS, rollout_source=LOGS_ROLLOUT)
    (pytester.path / "between.py").write_text(BETWEEN)
    (pytester.path / "conftest.py").write_text(conftest)


def _row_1_sections(result: pytest.RunResult, warnings: list[str]) -> None:
    """Row 1's records are in its own report alone, as pytest shows a phase's records."""
    sections = _passes(result.outlines)
    out = "\n".join(result.outlines)
    assert "row_0_run_0" not in sections, out
    assert _lines(sections["row_1_run_0"]) == [
        "Captured log setup",
        *(line.replace("row 1", "WARNING calc.rollout row 1", 1) for line in warnings),
    ], out


@pytest.mark.parametrize("how", ["default", "log-level", "live"])
def test_a_row_logging_during_another_test_shows_in_its_own_report_not_that_test_s(
    pytester: pytest.Pytester, model_env: Any, how: str
) -> None:
    _workspace(pytester, USER_CONFTEST)
    (pytester.path / "test_user.py").write_text(USER_TEST)
    extra = {
        "default": (),
        "log-level": ("--log-level", "INFO"),
        "live": ("--log-cli-level", "WARNING"),
    }[how]
    result = pytester.runpytest("--osmosis-eval", *PLAIN, *extra, "configs", "test_user.py")
    result.assert_outcomes(passed=3)
    out = "\n".join(result.outlines)
    user = _lines(_passes(result.outlines)["test_user"])
    assert user == ["Captured log call", "WARNING user the user's own"], out
    if how == "log-level":  # its INFO record too, where it was logged
        sections = _passes(result.outlines)["row_1_run_0"]
        assert _lines(sections)[1:3] == [
            "WARNING calc.rollout row 1 workflow",
            "INFO calc.rollout row 1 informs",
        ], out
        return
    _row_1_sections(result, ROW_1_WARNINGS)
    if how == "live":  # printed as they happened: while the user's test ran, once
        lines = result.outlines
        start = next(i for i, line in enumerate(lines) if line.startswith("test_user.py::"))
        end = next(i for i, line in enumerate(lines) if i > start and "PASSED" in line)
        for text in ROW_1_WARNINGS:
            live = [i for i, line in enumerate(lines) if line == f"WARNING calc.rollout {text}"]
            assert len(live) == 2 and start < live[0] < end, out  # live, then its section


def test_without_the_logging_plugin_a_row_s_records_are_its_stderr(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """``-p no:logging``: records go to logging's last resort (stderr, WARNING and up), in
    the row's thread: so to the row's own ``Captured stderr setup`` (a fresh interpreter:
    in this one, this test's own logging plugin would take them)."""
    _workspace(pytester, USER_CONFTEST)
    (pytester.path / "test_user.py").write_text(USER_TEST)
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "-rA", "-p", "no:logging"
    )
    result.assert_outcomes(passed=3)
    sections = _passes(result.outlines)
    assert _lines(sections["row_1_run_0"]) == ["Captured stderr setup", *ROW_1_WARNINGS]
    assert _lines(sections["test_user"]) == ["Captured stderr call", "the user's own"]


# Between items pytest captures no records (a worker's are lost): row 1 logs only while
# the conftest's logreport hook for row 0 (which runs after row 0's setup) waits for it.
BETWEEN_ITEMS_CONFTEST = """
import between


def pytest_runtest_logreport(report):
    # Reports are logged with no item's handlers attached (between items, for a worker).
    ours = between.STARTED.is_set()  # the process running the rows, not xdist's controller
    if ours and report.when == "setup" and report.nodeid.endswith("::row_0_run_0"):
        between.LOG.set()
        assert between.LOGGED.wait(300), "row 1 did not log"
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_a_row_logging_between_items_shows_in_its_own_report(
    pytester: pytest.Pytester, model_env: Any, xdist: tuple[str, ...]
) -> None:
    _workspace(pytester, BETWEEN_ITEMS_CONFTEST)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "--osmosis-eval",
        *PLAIN,
        *xdist,
        "--osmosis-concurrency",  # under -n 2, one shard of both rows, on one worker
        "10",
        f"--junitxml={junit}",
        "-o",
        "junit_logging=log",
    )
    result.assert_outcomes(passed=2)
    _row_1_sections(result, ROW_1_WARNINGS)
    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
    logged = {name: case.findtext("system-out") or "" for name, case in cases.items()}
    assert "row 1" not in logged["row_0_run_0"], repr(logged["row_0_run_0"])
    assert "WARNING calc.rollout row 1 thread" in logged["row_1_run_0"], logged


# The user's test lowers the root logger's level with ``caplog.set_level`` while row 1 logs
# (pytest's thread is in that test): its own INFO record is its own, and row 1's INFO
# record must not join row 1's section only because of where pytest's thread was.
USER_TEST_AT_INFO = """
import logging

import between


def test_user(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("user").warning("the user's own")
    logging.getLogger("user").info("the user's info")
    between.LOG.set()
    assert between.LOGGED.wait(300), "row 1 did not log"
    assert [r.getMessage() for r in caplog.records] == ["the user's own", "the user's info"]
    assert "row 1" not in caplog.text
"""


def test_a_level_another_test_set_with_caplog_does_not_reach_a_row_s_records(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """Row 1's section held its INFO record when row 1 happened to log while a test of the
    user's had lowered the root logger's level (``caplog.set_level``, undone at that test's
    teardown), and not otherwise: what a row's report shows hung on where pytest was."""
    _workspace(pytester, USER_CONFTEST)
    (pytester.path / "test_user.py").write_text(USER_TEST_AT_INFO)
    result = pytester.runpytest("--osmosis-eval", *PLAIN, "configs", "test_user.py")
    result.assert_outcomes(passed=3)
    out = "\n".join(result.outlines)
    user = _lines(_passes(result.outlines)["test_user"])
    assert user == [
        "Captured log call",
        "WARNING user the user's own",
        "INFO user the user's info",
    ], out
    _row_1_sections(result, ROW_1_WARNINGS)  # as at the session's level: no INFO record
