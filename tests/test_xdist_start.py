"""``-n 2`` pays no more than it must before and between its rows (issue 30, item 2).

The workers start while the controller checks the models, and the controller journals a
worker's result as its report arrives, so results arriving together share one fsync
(plugin/controller.py: ``check_models``, ``stage``).
"""

from __future__ import annotations

import json
import threading

import pytest
from model_server import ModelServer
from test_preflight import STAMPING_ROLLOUT, _rows, _stamps
from workspaces import wait_until, write_workspace

from pytest_osmosis.results import read_journal

pytest_plugins = ["pytester"]

#: A worker says it started (its pytest_configure), before it collects or runs a row.
WORKER_STARTED = """
from pathlib import Path


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        (Path(str(config.rootpath)) / f"started-{config.workerinput['workerid']}").touch()
"""


def test_workers_start_while_the_model_is_checked(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """The preflight's request is held until both workers said they started: were they
    started after the check (as before), it would never be answered, and the wait fails."""
    write_workspace(pytester.path, rows=_rows(4, ask=False), rollout_source=STAMPING_ROLLOUT)
    pytester.makeconftest(WORKER_STARTED)
    model_env.hold = "hi"  # the preflight's message; these rows call no model
    results: list[pytest.RunResult] = []
    session = threading.Thread(
        target=lambda: results.append(
            pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
        )
    )
    session.start()
    try:
        wait_until(lambda: model_env.holding == 1, "the preflight's request arrives")
        wait_until(
            lambda: len(list(pytester.path.glob("started-gw*"))) == 2,
            "both workers start while the preflight waits for its answer",
        )
        assert not _stamps(pytester.path)  # no row starts before the check passed
    finally:
        model_env.hold = ""
        session.join()
    result = results[0]
    result.assert_outcomes(passed=4)
    assert model_env.requests_total == 1  # the preflight's, once


#: On the controller, the first result's report waits (before anything records it)
#: until the journal holds every row: only results journalled as they arrive get there.
FIRST_REPORT_WAITS = """
import time
from pathlib import Path

import pytest

ROWS = {rows}
controller = []
waited = []


def pytest_configure(config):
    controller.append(not hasattr(config, "workerinput"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_logreport(report):
    if controller[0] and getattr(report, "osmosis", None) and not waited:
        journal = Path("{journal}")
        deadline = time.monotonic() + 120  # only stops a hang: the answer is an event
        while time.monotonic() < deadline:
            if journal.exists() and len(journal.read_text().splitlines()) == ROWS:
                break
            time.sleep(0.02)
        lines = len(journal.read_text().splitlines()) if journal.exists() else 0
        waited.append(lines)
        Path("{marker}").write_text(str(lines))
    return (yield)
"""


def test_a_workers_result_is_journalled_as_its_report_arrives(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Every row's report reaches the controller while its main thread holds the first one:
    they are all journalled by then (each written once), though none was recorded yet."""
    rows = 8
    write_workspace(
        pytester.path,
        rows=_rows(rows, ask=False),
        rollout_source=STAMPING_ROLLOUT,
        evaluation={"batch_size": rows},
    )
    journal = pytester.path / ".osmosis" / "evals" / "x" / "events.jsonl"
    marker = pytester.path / "journalled-before-the-first-was-recorded"
    pytester.makeconftest(FIRST_REPORT_WAITS.format(rows=rows, journal=journal, marker=marker))
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "-n", "2", "--osmosis-name", "x"
    )
    result.assert_outcomes(passed=rows)
    assert marker.read_text() == str(rows)
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sorted(r["row_index"] for r in records) == list(range(rows))  # each once


#: gw1's first row reads its dataset row, then waits until the controller has seen a
#: session fault; gw0's first row changes the dataset once gw1's row runs, so gw0's next
#: row meets the fault (DatasetChangedError: the session stops, rows left pending).
FAULT_THEN_FINISH = """
import asyncio
import os
import pathlib

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend


async def until(name):
    for _ in range(12000):  # only stops a hang: the answer is an event
        if pathlib.Path(name).exists():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(name)


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        worker = os.environ["PYTEST_XDIST_WORKER"]
        mine = pathlib.Path("rows-" + worker)
        with mine.open("a") as fh:
            fh.write("x")
        if mine.stat().st_size == 1 and worker == "gw1":
            pathlib.Path("gw1-started").write_text(str(ctx.metadata["row"]))
            await until("fault-seen")
        elif mine.stat().st_size == 1:
            await until("gw1-started")
            data = pathlib.Path("data/calc.jsonl")
            data.write_text(data.read_text() + data.read_text().splitlines()[0] + "\\n")
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class AlwaysRight(Grader):
    async def grade(self, ctx):
        ctx.sample.reward = 1.0


backend = LocalBackend(workflow=Workflow, grader=AlwaysRight)
"""

#: The controller: a report, once it has taken it (this wrapper is outermost), says the
#: fault was seen, or that gw1's row arrived; the session ends only once it has.
FAULT_SEEN = """
import pathlib
import time

import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_report_from_serializable(config, data):
    report = yield
    result = getattr(report, "osmosis", None)
    if isinstance(result, dict) and result.get("session_fault"):
        pathlib.Path("fault-seen").touch()
    elif isinstance(result, dict) and getattr(report, "worker_id", None) == "gw1":
        pathlib.Path("gw1-arrived").touch()
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        for _ in range(12000):  # only stops a hang; the test asserts it arrived
            if pathlib.Path("gw1-arrived").exists():
                break
            time.sleep(0.01)
    return (yield)
"""


def test_a_worker_result_arriving_after_a_session_fault_is_not_journalled(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """A session fault (the dataset changed under the run) stops the session, and no row
    finishing after it is journalled: it may have run on what broke. One process has
    always kept to that; under xdist the controller journalled a worker's result as its
    report arrived, after the fault's too, where it had stopped at the fault before."""
    rows = _rows(8, ask=False)
    for i, row in enumerate(rows):
        row["metadata"] = {"row": i}
    write_workspace(pytester.path, rows=rows, rollout_source=FAULT_THEN_FINISH)
    pytester.makeconftest(FAULT_SEEN)
    args = ("-p", "no:cacheprovider", "-n", "2", "--osmosis-concurrency", "2")
    result = pytester.runpytest_subprocess("--osmosis-eval", *args, "--osmosis-name", "x")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert "changed after it was opened" in output, output
    assert (pytester.path / "gw1-arrived").exists(), output  # after the fault, as it must
    late = int((pytester.path / "gw1-started").read_text())
    journal = read_journal(pytester.path / ".osmosis" / "evals" / "x")
    assert journal, output  # gw0's first row, before the fault
    assert late not in {row for row, _ in journal}, journal
