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

