"""Many rows in flight: overlap, xdist sharding without double spending, stopping early."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import calc_rollout, calc_rows, read_index, write_workspace

ROWS = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(16)])


@pytest.fixture
def slow_model(model_env: ModelServer) -> ModelServer:
    model_env.delay = 0.4
    return model_env


UNCAPPED = calc_rollout('AgentWorkflowConfig(name="calc")')  # advertises no in-flight cap


def test_items_overlap_up_to_the_batch_size(pytester: pytest.Pytester, slow_model: ModelServer) -> None:
    write_workspace(pytester.path, rows=ROWS, evaluation={"batch_size": 8}, rollout_source=UNCAPPED)
    # The first rows' calls wait until 8 are at the model at once: on a loaded machine the
    # first could be answered (0.4 s) before the eighth was sent. An event, not a race (the
    # timeout stops a hang); the later calls still take 0.4 s, so a ninth would overlap.
    slow_model.gather, slow_model.gather_on, slow_model.gather_timeout = 8, "What is", 600.0
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    # The preflight is alone; then eight rows wait on the model at once, never more.
    assert slow_model.peak_in_flight == 8
    assert slow_model.requests_total == 16 + 1


def test_command_line_concurrency_overrides_batch_size(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    write_workspace(pytester.path, rows=ROWS[:6], evaluation={"batch_size": 8})
    # Calls wait until 3 are at the model at once (an event: on a loaded machine the first
    # could be answered before the third was sent); later ones still take 0.4 s each.
    slow_model.gather, slow_model.gather_on, slow_model.gather_timeout = 3, "What is", 600.0
    result = pytester.runpytest(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-concurrency", "3"
    )
    result.assert_outcomes(passed=6)
    assert slow_model.peak_in_flight == 3


def test_xdist_shards_rows_and_never_runs_one_twice(pytester: pytest.Pytester, slow_model: ModelServer) -> None:
    write_workspace(
        pytester.path, rows=ROWS, evaluation={"batch_size": 8, "n": 2}, rollout_source=UNCAPPED
    )
    # The first rows' calls wait until 5 are at the model at once: more than one worker's
    # share (4), so only both workers' rows in flight together get there. An event, not a
    # race with how fast two workers start on a loaded machine (the timeout stops a hang).
    slow_model.gather, slow_model.gather_on, slow_model.gather_timeout = 5, "What is", 600.0
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=32)
    bodies = [b for b in slow_model.bodies if b["messages"][-1]["content"] != "hi"]
    questions = [b["messages"][-1]["content"] for b in bodies]
    # Every (row, attempt) reached the model exactly once: 16 rows x 2 attempts.
    assert len(questions) == 32 and all(questions.count(q) == 2 for q in set(questions))
    # The total concurrency is shared by the workers, and both kept rows in flight.
    assert 5 <= slow_model.peak_in_flight <= 8
    runs = list((pytester.path / ".osmosis" / "evals").iterdir())
    rows = read_index(next(p for p in runs if not p.name.startswith(".")))
    assert [(r["row_index"], r["run_index"]) for r in rows] == [
        (r, n) for r in range(16) for n in range(2)
    ]


@pytest.mark.parametrize(
    ("workflow_config", "evaluation", "args", "expected"),
    [
        ('AgentWorkflowConfig(name="calc")', None, (), 1),
        ('AgentWorkflowConfig(name="calc")', None, ("--osmosis-concurrency", "4"), 4),
        ('AgentWorkflowConfig(name="calc")', {"batch_size": 3}, (), 3),
        ('AgentWorkflowConfig(name="c", concurrency={"max_concurrent": 2})', None, (), 2),
        (
            'AgentWorkflowConfig(name="c", concurrency={"max_concurrent": 2})',
            {"batch_size": 3},
            (),
            2,
        ),
        (None, None, (), 4),
        (None, {"batch_size": 8}, (), 4),
        (None, None, ("--osmosis-concurrency", "6"), 6),
    ],
    ids=[
        "template-config-one-at-a-time",
        "option-raises-it",
        "batch-size",
        "max-concurrent",
        "max-concurrent-caps-batch-size",
        "no-workflow-config-advertises-4",
        "advertised-4-caps-batch-size",
        "option-beyond-the-advertised-cap",
    ],
)
def test_default_in_flight_is_what_osmosis_eval_run_picks(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    workflow_config: str | None,
    evaluation: dict[str, int] | None,
    args: tuple[str, ...],
    expected: int,
) -> None:
    """``batch_size``, capped by what the rollout's LocalBackend advertises, else that, else
    1; ``--osmosis-concurrency`` sets it. The model server holds each call until `expected`
    are in flight (one call waits for another that must never come, for a bound of 1)."""
    model_env.gather, model_env.gather_on = max(expected, 2), "What is"  # not the preflight
    model_env.gather_timeout = 1.0 if expected == 1 else 60.0
    rows = ROWS[: max(2 * expected, 3)]
    write_workspace(
        pytester.path,
        rows=rows,
        evaluation=evaluation,
        rollout_source=calc_rollout(workflow_config),
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=len(rows))
    assert model_env.peak_in_flight == expected


ROWS_2_3_AHEAD_4_ON_IN_FLIGHT = """
import asyncio

from pytest_osmosis.plugin.session import EvalSession

_execute = EvalSession._execute
finished = {}


def _finished(row):
    return finished.setdefault(row, asyncio.Event())


async def _execute_in_order(self, item):
    # Rows 4 and later are still in flight at the stop; rows 2 and 3 have finished ahead:
    # row 1 (the failure -x stops on) finishes only once they have. Left to the scheduler,
    # a loaded machine decided which of rows 2..7 had finished by the stop.
    if item.row_index >= 4:
        await asyncio.Event().wait()  # until the stop cancels it
    try:
        return await _execute(self, item)
    finally:
        if item.row_index in (2, 3):
            _finished(item.row_index).set()
        elif item.row_index == 1:
            await asyncio.wait_for(asyncio.gather(_finished(2).wait(), _finished(3).wait()), 300)


EvalSession._execute = _execute_in_order
"""


def test_stop_on_first_failure_leaves_in_flight_rows_pending_and_resume_finishes(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    rows = [dict(r) for r in ROWS[:10]]
    rows[1]["ground_truth"] = "wrong"
    write_workspace(pytester.path, rows=rows, evaluation={"batch_size": 4})
    pytester.makeconftest(ROWS_2_3_AHEAD_4_ON_IN_FLIGHT)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "stop")
    result = pytester.runpytest_subprocess(*args, "-x")
    result.assert_outcomes(passed=1, failed=1)
    run_dir = pytester.path / ".osmosis" / "evals" / "stop"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    index = read_index(run_dir)
    recorded = {(r["row_index"], r["run_index"]) for r in index}
    # Rows 4.. in flight were cancelled, never failed; rows 2 and 3, finished ahead, are
    # kept (they were paid for), with their real outcome.
    assert recorded == {(0, 0), (1, 0), (2, 0), (3, 0)}
    assert [r["status"] for r in index] == ["success"] * len(index)
    (pytester.path / "conftest.py").unlink()
    before = slow_model.requests_total
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=9, failed=1)
    pending = 10 - len(recorded)
    assert slow_model.requests_total - before == pending + 1  # exactly the pending rows
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert sum(1 for r in read_index(run_dir) if r.get("resumed")) == len(recorded)


def test_sigint_cancels_in_flight_rows_and_keeps_what_finished(
    pytester: pytest.Pytester, slow_model: ModelServer, tmp_path: Path
) -> None:
    slow_model.delay = 1.0
    # The last row waits on the model until the test lets it go: the Ctrl-C comes before the
    # run could end, however long the test takes to see 3 rows journalled and send it.
    slow_model.hold = "What is 15 + 1"
    write_workspace(pytester.path, rows=ROWS, evaluation={"batch_size": 2})
    env = dict(os.environ)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--osmosis-eval",
            "-p",
            "no:cacheprovider",
            "--osmosis-name",
            "sig",
        ],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    run_dir = pytester.path / ".osmosis" / "evals" / "sig"
    events = run_dir / "events.jsonl"
    # Wait for the event (3 rows journalled); the deadline only stops a hang, it is no
    # budget: a loaded machine may take a minute to import LiteLLM and pass the preflight.
    deadline = time.monotonic() + 600
    while not (events.exists() and len(events.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "no 3 rows journalled"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        slow_model.hold = ""
    assert proc.returncode == 2, out.decode()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    # What finished is what the journal holds, and the index shows every row of it: a
    # Ctrl-C is held while a result goes into both (results/atomic.py: interrupt_held).
    done = len(events.read_text().splitlines())
    assert 3 <= done < 16
    assert len(read_index(run_dir)) == done
    before = slow_model.requests_total
    slow_model.delay = 0.0
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "sig")
    result.assert_outcomes(passed=16)
    assert slow_model.requests_total - before == (16 - done) + 1
    assert len(read_index(run_dir)) == 16


TERMINATED_AT_ROW_3 = """
import os
import signal

reported = []


def pytest_runtest_logreport(report):
    # A CI runner cancels the job once row 3 has been recorded (the controller journals a
    # row in its own tryfirst hook): SIGTERM to this process, as a runner sends it.
    if report.when == "call":
        reported.append(report.nodeid)
        if len(reported) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_sigterm_stops_like_ctrl_c_with_the_kept_line_and_a_sealed_run(
    pytester: pytest.Pytester, slow_model: ModelServer, xdist: list[str]
) -> None:
    """SIGTERM (a cancelled CI job) killed the process outright: no snapshots, rc -15,
    and no line saying how many results were kept."""
    slow_model.delay = 0.0
    slow_model.hold = "What is 6 + 1"  # row 6 waits on the model: in flight at the stop
    write_workspace(pytester.path, rows=ROWS[:8], evaluation={"batch_size": 4})
    pytester.makeconftest(TERMINATED_AT_ROW_3)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "term")
    try:
        result = pytester.runpytest_subprocess(*args, *xdist)
    finally:
        slow_model.hold = ""
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    run_dir = pytester.path / ".osmosis" / "evals" / "term"
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    kept = len(lines)
    assert 3 <= kept <= 7  # rows 0-2, and rows that finished ahead of the stop; not row 6
    assert len({(json.loads(x)["row_index"], json.loads(x)["run_index"]) for x in lines}) == kept
    assert len(read_index(run_dir)) == kept  # sealed: the index shows what the journal holds
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    result.stdout.fnmatch_lines(
        [f"osmosis: stopped early: run the same command again to resume ({kept} of 8 recorded)"]
    )
    (pytester.path / "conftest.py").unlink()
    before = slow_model.requests_total
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=8)  # the kept rows are reported from their records
    assert slow_model.requests_total - before == (8 - kept) + 1  # the rest, and the preflight


def test_a_sigterm_held_by_a_journal_append_is_an_interrupt_after_it_where_sigint_is_ignored() -> None:
    """A job started in the background has SIGINT ignored: a SIGTERM held while a result
    went into the journal and the index was replayed as SIGINT, and so lost."""
    from pytest_osmosis.plugin.terminate import forward_sigterm
    from pytest_osmosis.results.atomic import interrupt_held

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    restore = forward_sigterm()
    assert restore is not None
    done = []
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with interrupt_held():
                signal.raise_signal(signal.SIGTERM)  # handled here, and held to the end
                done.append("both writes")
        assert done == ["both writes"]
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)  # outside a hold: at once
    finally:
        restore()
        signal.signal(signal.SIGINT, before)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_does_not_run_a_users_own_sigint_handler() -> None:
    """A conftest's SIGINT handler (a "really quit?" prompt, one that only sets a flag) is
    for Ctrl-C: SIGTERM ran it, and a cancelled job could wait there for SIGKILL."""
    from pytest_osmosis.plugin.terminate import forward_sigterm

    asked: list[int] = []

    def really_quit(signum: int, frame: object) -> None:
        asked.append(signum)

    before = signal.signal(signal.SIGINT, really_quit)
    restore = forward_sigterm()
    assert restore is not None
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
    finally:
        restore()
        signal.signal(signal.SIGINT, before)
    assert asked == []


BREAKS_ON_FIRST_REPORT = """
import time

import pytest

from pytest_osmosis.plugin.collect import SESSION_KEY

seen = []


def pytest_runtest_logreport(report):
    # Another plugin's hook breaks on the first row's report (INTERNALERROR), once every
    # other row has finished ahead on the loop thread (the event, polled; no sleep budget).
    if report.when != "call" or seen:
        return
    seen.append(report.nodeid)
    session = report_config[0].stash[SESSION_KEY]
    deadline = time.monotonic() + 300
    while len(session._executor.finished()) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("a plugin broke")


report_config = []


def pytest_configure(config):
    report_config.append(config)
"""


def test_rows_finished_ahead_are_journalled_when_the_session_dies_by_internalerror(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """Five rows finished on the loop thread but were never reported: they were lost (the
    journal held 1 of 6 rows) and the next session paid for them again."""
    slow_model.delay = 0.0
    write_workspace(
        pytester.path, rows=ROWS[:6], evaluation={"batch_size": 6}, rollout_source=UNCAPPED
    )
    pytester.makeconftest(BREAKS_ON_FIRST_REPORT)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "broken")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    assert any("a plugin broke" in line for line in result.outlines + result.errlines)
    run_dir = pytester.path / ".osmosis" / "evals" / "broken"
    assert len((run_dir / "events.jsonl").read_text().splitlines()) == 6
    assert len(read_index(run_dir)) == 6
    before = slow_model.requests_total
    (pytester.path / "conftest.py").unlink()
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(deselected=6)  # a finished run: nothing ran again
    assert result.ret == pytest.ExitCode.OK
    assert slow_model.requests_total == before  # not even the preflight


SLOW_TO_SHOW_AN_INTERRUPT = """
import pathlib
import time


def pytest_keyboard_interrupt(excinfo):
    # Showing the first Ctrl-C takes a while (pytest renders its traceback): the user
    # presses Ctrl-C again meanwhile. The marker tells the test this moment has come.
    pathlib.Path("first-interrupt-seen").touch()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _stop_twice(
    pytester: pytest.Pytester,
    slow_model: ModelServer,
    conftest: str,
    journalled: int,
    signals: tuple[signal.Signals, signal.Signals] = (signal.SIGINT, signal.SIGINT),
) -> int:
    """Ctrl-C while pytest waits on row 3 (held at the model), again once the first is being
    shown and the journal holds ``journalled`` lines; check the one line against the journal
    the process left, then resume: the rest run, nothing else. Returns the lines kept.
    *signals*: the first and the second "Ctrl-C" (SIGTERM: a cancelled CI job)."""
    slow_model.delay = 0.0
    slow_model.hold = "What is 3 + 1"  # row 3 waits on the model until the test lets it go
    write_workspace(pytester.path, rows=ROWS[:6], evaluation={"batch_size": 6})
    pytester.makeconftest(conftest)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "twice")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    run = pytester.path / ".osmosis" / "evals" / "twice"
    events = run / "events.jsonl"
    try:
        deadline = time.monotonic() + 600  # stops a hang only; the events decide
        while slow_model.holding < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "row 3 never asked"
            time.sleep(0.05)
        proc.send_signal(signals[0])
        marker = pytester.path / "first-interrupt-seen"
        while not marker.exists() or len(events.read_bytes().splitlines()) < journalled:
            assert proc.poll() is None and time.monotonic() < deadline, "no first interrupt"
            time.sleep(0.05)
        proc.send_signal(signals[1])
        out, _ = proc.communicate(timeout=120)
    finally:
        slow_model.hold = ""
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = out.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text.replace(
        "!!! KeyboardInterrupt !!!", ""
    ), text
    lines = events.read_text().splitlines()
    kept = len(lines)
    assert kept == len({(json.loads(x)["row_index"], json.loads(x)["run_index"]) for x in lines})
    assert 1 <= kept <= 5  # what had finished by the second Ctrl-C; row 3 never answered
    last = text.rstrip().splitlines()[-1]
    assert last == (
        f"osmosis: stopped; {kept} results kept in {run} (run the same command again to resume)"
    ), text
    (pytester.path / "conftest.py").unlink()
    before = slow_model.requests_total
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=6)
    assert slow_model.requests_total - before == (6 - kept) + 1  # the rest, and the preflight
    return kept


def test_a_second_ctrl_c_stops_at_once_in_one_line_with_exit_2(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """It ended with a raw KeyboardInterrupt traceback and rc -2."""
    # One row journalled before the second Ctrl-C: it comes as soon as the first is being
    # shown, and on a loaded machine no row might have finished by then (none kept).
    _stop_twice(pytester, slow_model, SLOW_TO_SHOW_AN_INTERRUPT, journalled=1)


@pytest.mark.parametrize(
    "signals", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGTERM)], ids=str
)
def test_a_second_sigterm_stops_at_once_in_the_same_one_line(
    pytester: pytest.Pytester,
    slow_model: ModelServer,
    signals: tuple[signal.Signals, signal.Signals],
) -> None:
    """A CI runner cancelling a job sends SIGTERM (GitHub Actions: SIGINT, then SIGTERM):
    the process died of it at once (rc -15) without saying what was kept."""
    _stop_twice(pytester, slow_model, SLOW_TO_SHOW_AN_INTERRUPT, journalled=0, signals=signals)


ROW_4_STAGED_NEVER_SETTLES = (
    SLOW_TO_SHOW_AN_INTERRUPT
    + """
import asyncio

from pytest_osmosis.plugin.session import EvalSession

_execute = EvalSession._execute


async def _execute_row_4_held(self, item):
    # Row 4 finishes and hands its record to the journal (stage), but its result never
    # reaches the executor: the moment between a row's stage and its future settling (where
    # a Ctrl-C finds it unfinished, or cancels it), held open until the process ends.
    result = await _execute(self, item)
    if item.row_index == 4:
        await asyncio.Event().wait()
    return result


EvalSession._execute = _execute_row_4_held
"""
)


def test_the_second_ctrl_c_counts_a_row_journalled_whose_result_never_settled(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """The line said "4 results kept" while events.jsonl held 5 lines: the count was the
    records the controller had taken, not what the journal held (row 4's staged record)."""
    # Rows 0-2 reported, 5 finished ahead, 4 staged: all but row 3 are in the journal.
    assert _stop_twice(pytester, slow_model, ROW_4_STAGED_NEVER_SETTLES, journalled=5) == 5


ROW_4_FINISHES_AFTER_THE_SNAPSHOTS = """
import asyncio
import threading

from pytest_osmosis.plugin.session import EvalSession
from pytest_osmosis.results.rundir import RunDirectory

go, tried = threading.Event(), threading.Event()
ahead = {2: threading.Event(), 3: threading.Event(), 5: threading.Event()}
_execute, _refresh = EvalSession._execute, RunDirectory.refresh


def _rows_ahead_finished():
    assert all(done.wait(300) for done in ahead.values()), "rows 2, 3 and 5 never finished"


async def _execute_row_4_late(self, item):
    # Row 4 runs ahead but finishes only once the session's end has written the snapshots.
    # Row 1 (the failure -x stops on) finishes only once rows 2, 3 and 5 have: on a loaded
    # machine they were still running at the stop, and a row in flight then is not kept.
    loop = asyncio.get_running_loop()
    if item.row_index == 4:
        await loop.run_in_executor(None, go.wait)
    try:
        return await _execute(self, item)  # stages its record on the way out
    finally:
        if item.row_index == 4:
            tried.set()
        elif item.row_index in ahead:
            ahead[item.row_index].set()
        elif item.row_index == 1:
            await loop.run_in_executor(None, _rows_ahead_finished)


def _refresh_then_row_4(self, **kwargs):
    metrics = _refresh(self, **kwargs)
    go.set()
    assert tried.wait(300), "row 4 never finished"
    return metrics


EvalSession._execute = _execute_row_4_late
RunDirectory.refresh = _refresh_then_row_4
"""


def test_a_row_finishing_after_the_snapshots_is_not_journalled_behind_the_count(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """-x: a row that finished after the final snapshots were written was journalled when
    the journal closed: 6 lines in events.jsonl, 5 rows in the index and "5 of 6 recorded",
    and the next session did not run the row the index did not show."""
    slow_model.delay = 0.0
    rows = [dict(r) for r in ROWS[:6]]
    rows[1]["ground_truth"] = "wrong"
    write_workspace(pytester.path, rows=rows, evaluation={"batch_size": 6}, rollout_source=UNCAPPED)
    pytester.makeconftest(ROW_4_FINISHES_AFTER_THE_SNAPSHOTS)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "late")
    result = pytester.runpytest_subprocess(*args, "-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    run_dir = pytester.path / ".osmosis" / "evals" / "late"
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    journalled = sorted(json.loads(line)["row_index"] for line in lines)
    assert journalled == [0, 1, 2, 3, 5]  # row 4 finished after the seal: not kept
    assert [r["row_index"] for r in read_index(run_dir)] == journalled
    result.stdout.fnmatch_lines(["resume *(5 of 6 recorded)"])
    (pytester.path / "conftest.py").unlink()
    before = slow_model.requests_total
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=5, failed=1)
    assert slow_model.requests_total - before == 1 + 1  # row 4, and the preflight


XDIST_WITHOUT_QUEUE_LOCK = '''
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # What pytest-xdist 3.6.1 looked like to us: its worker queue had no lock(). Changed in
    # the controller only, where the plugin checks xdist; the workers' xdist still works.
    if not hasattr(config, "workerinput"):
        from xdist import remote

        del remote.TestQueue.lock
'''


def test_changed_xdist_internals_are_warned_once_and_every_row_still_runs(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """xdist's private API changing costs the run-ahead, visibly; it never fails a row."""
    write_workspace(pytester.path, rows=ROWS[:6], evaluation={"batch_size": 4})
    pytester.makeconftest(XDIST_WITHOUT_QUEUE_LOCK)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=6)
    lines = [line for line in result.outlines if "osmosis: warning: pytest-xdist" in line]
    assert len(lines) == 1, result.outlines
    assert lines[0].endswith(
        "lacks xdist.remote.TestQueue.lock: each worker runs its rows one at a time, "
        "on xdist's own scheduler"
    ), lines
    # Each worker ran its rows one at a time: never more than the two workers in flight.
    assert slow_model.peak_in_flight <= 2


BLOCKING = '''
import os
import time

import httpx

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend, get_rollout_context


class Blocking(AgentWorkflow):
    async def run(self, ctx):
        if "block" in ctx.prompt[-1]["content"]:
            # Synchronous, so the event loop cannot cancel it; it lasts until the test's
            # conftest saw the next row wait past its backstop (the cap only prevents a hang).
            # (C calls only: the frame the backstop names is this one.)
            cap = time.monotonic() + 240
            while time.monotonic() < cap:
                try:
                    os.stat("released")
                    break
                except FileNotFoundError:
                    time.sleep(0.05)
        else:
            # A model call: it waits for the preflight, so the blocking row starts after it.
            rollout = get_rollout_context()
            async with httpx.AsyncClient(timeout=120) as client:
                await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "m", "messages": ctx.prompt},
                )
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class Always(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


backend = LocalBackend(workflow=Blocking, grader=Always)
'''


RELEASE_WHEN_WAITING_PAST_BACKSTOP = '''
import warnings
from pathlib import Path

_warn = warnings.warn


def _observed(message, *args, **kwargs):
    # The next row's backstop fired while the blocker held the loop: let the blocker return.
    if "waits past its backstop" in str(message):
        Path("released").touch()
    return _warn(message, *args, **kwargs)


warnings.warn = _observed
'''


# pytest-timeout's own failure text, changed: the backstop goes through its hooks, never its words.
OTHER_TIMEOUT_TEXT = """
import pytest_timeout

pytest_timeout.PYTEST_FAILURE_MESSAGE = "Zeit abgelaufen nach %s s"
"""


@pytest.mark.parametrize("timeout_text", ["as shipped", "reworded"])
def test_a_row_blocking_the_loop_is_caught_by_the_backstop_and_named(
    pytester: pytest.Pytester, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, timeout_text: str
) -> None:
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    rows = calc_rows([("fine", "x"), ("please block", "x"), ("fine too", "x")])
    write_workspace(
        pytester.path,
        rows=rows,
        rollout_source=BLOCKING,
        # Budgets only the blocker exceeds (one loopback model call gets 6 s, even on a
        # loaded machine); the blocker ends on an event, not after a length of time.
        evaluation={"agent_workflow_timeout_s": 6, "grader_timeout_s": 3, "batch_size": 1},
    )
    pytester.makeini("[pytest]\nosmosis_backstop_grace = 1\n")
    extra = OTHER_TIMEOUT_TEXT if timeout_text == "reworded" else ""
    pytester.makeconftest(RELEASE_WHEN_WAITING_PAST_BACKSTOP + extra)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            # The blocker's own frame: its sleep or its check of the file (load decides which).
            "*backstop_timeout: backstop timeout (>10.0s): row 1 run 0 is blocking the event loop at *main.py:* in run*",
            "*row_2_run_0 waits past its backstop: row 1 run 0 is blocking the event loop*",
        ]
    )


def test_a_429_storm_slows_the_run_but_fails_no_row(pytester: pytest.Pytester, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OPENAI_MAX_RETRIES", "0")
    write_workspace(pytester.path, rows=ROWS[:8], evaluation={"batch_size": 8})
    # The preflight ignores a 429; after it, 40 answers in a row are rate limits.
    model_server.fail_next(429, count=41, retry_after=0.05)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["rate limit * calls answered 429, retried after back-off"])
    assert model_server.requests_total >= 8 + 41


#: One model call per row through the ready client (one connection pool per process).
READY_CLIENT_ROLLOUT = """
from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowConfig, Grader, LocalBackend, bridge_client,
)


class AskWorkflow(AgentWorkflow):
    async def run(self, ctx):
        response = await bridge_client().post(
            "chat/completions", json={"model": "m", "messages": ctx.prompt}
        )
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        return [*ctx.prompt, {"role": "assistant", "content": answer}]


class ExactGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


backend = LocalBackend(
    workflow=AskWorkflow, grader=ExactGrader, workflow_config=AgentWorkflowConfig(name="ask")
)
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_a_rate_limited_provider_is_paced_not_hammered(
    pytester: pytest.Pytester, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, xdist: bool
) -> None:
    """Issue 15 target 7 in small: 429s are few, counted exactly, and fail no row."""
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    rows = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(120)])
    write_workspace(
        pytester.path, rows=rows, evaluation={"batch_size": 16}, rollout_source=READY_CLIENT_ROLLOUT
    )
    # 20 requests/s with room for 8 at once, and rows that would ask four times as fast
    # (16 in flight, 0.2 s answers): 429s from the first wave on, even on a slow machine.
    # The first wave's calls reach the rate limit together (an event: a loaded machine can
    # send fewer than 20 a second, and the limit then never refused one).
    model_server.delay = 0.2
    model_server.limit_rate(20, burst=8)
    model_server.gather, model_server.gather_on, model_server.gather_timeout = 16, "What is", 600.0
    args = ["--osmosis-eval", "-p", "no:cacheprovider"]
    if xdist:
        result = pytester.runpytest_subprocess(*args, "-n", "2")
    else:
        result = pytester.runpytest(*args)
    result.assert_outcomes(passed=120)
    refused = model_server.rate_limited
    assert refused > 0
    # Every 429 the provider sent is in the results table (none hidden in client retries).
    result.stdout.fnmatch_lines([f"rate limit {refused} calls answered 429, retried after back-off"])
    # Paced, not hammered: at most 1.2 requests per row, the preflight's included.
    assert model_server.requests_total <= 1.2 * 120, (model_server.requests_total, refused)


ONE_BLOCKS_SEVEN_AWAIT = '''
import asyncio
import time

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend

WAITING = []
RELEASED = []


class OneBlocks(AgentWorkflow):
    async def run(self, ctx):
        if "block" in ctx.prompt[-1]["content"]:
            while len(WAITING) < 7:  # every other row is in flight, awaiting the blocker
                await asyncio.sleep(0.01)
            time.sleep(5.5)  # synchronous: holds the loop past its own 4 s budget
            for event in WAITING:
                event.set()
        else:
            event = asyncio.Event()
            WAITING.append(event)
            await event.wait()  # only awaits; the loop is blocked while it waits
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class Always(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


backend = LocalBackend(workflow=OneBlocks, grader=Always)
'''


def test_only_the_row_blocking_the_loop_is_charged_for_the_block(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Eight in flight, one holds the loop 5.5 s past its 4 s budget: it alone times out.

    The seven others await an event the blocker sets after blocking, so each waited through
    the whole block; their budgets leave it out (what they used themselves is a few
    milliseconds of their 4 s, even on a loaded machine).
    """
    rows = calc_rows([("please block", "x")] + [(f"await {i}", "x") for i in range(7)])
    write_workspace(
        pytester.path,
        rows=rows,
        rollout_source=ONE_BLOCKS_SEVEN_AWAIT,
        evaluation={"agent_workflow_timeout_s": 4, "grader_timeout_s": 3},
    )
    result = pytester.runpytest(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "b",
        "--osmosis-concurrency", "8",
    )
    result.assert_outcomes(passed=7, errors=1)
    records = {r["row_index"]: r for r in read_index(pytester.path / ".osmosis" / "evals" / "b")}
    assert records[0]["error_type"] == "workflow_timeout", records[0]
    result.stdout.fnmatch_lines(
        ["workflow_timeout: workflow timeout after 4 s (it blocked the event loop) (row 0, run 0)"]
    )
    assert all(records[i]["status"] == "success" for i in range(1, 8)), records


UNDER_A_LOW_FD_LIMIT = """
import resource
import sys

import pytest

# Soft and hard limit both: raising the soft limit to the hard one cannot help here.
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_concurrency_beyond_the_fd_limit_is_capped_with_a_warning_and_fails_no_row(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    """500 in flight under ``ulimit -n 256``: one warning naming the cap, every row passes.

    The model holds each call until all 100 are in flight (or 2 s passed): uncapped, that
    many at once would need more descriptors than there are.
    """
    slow_model.gather, slow_model.gather_on, slow_model.gather_timeout = 100, "+ 1", 2.0
    rows = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(100)])
    write_workspace(pytester.path, rows=rows, rollout_source=UNCAPPED)
    result = pytester.run(
        sys.executable,
        "-c",
        UNDER_A_LOW_FD_LIMIT,
        "--osmosis-eval",
        "-p",
        "no:cacheprovider",
        "--osmosis-concurrency",
        "500",
        "--osmosis-name",
        "fd",
    )
    result.assert_outcomes(passed=100)
    warned = [line for line in result.outlines if "open-files limit of 256" in line]
    assert len(warned) == 1, result.outlines
    cap = int(warned[0].split("running at most ")[1].split()[0])
    assert 1 <= cap < 64, warned
    assert slow_model.peak_in_flight <= cap
    records = read_index(pytester.path / ".osmosis" / "evals" / "fd")
    assert len(records) == 100 and all(r["status"] == "success" for r in records)


MEETING_ROLLOUT = """
import asyncio
import pathlib

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend

ARRIVED = []
BOTH_HERE = []


class MeetingWorkflow(AgentWorkflow):
    async def run(self, ctx):
        pathlib.Path("started_" + ctx.prompt[-1]["content"]).touch()
        if (ctx.metadata or {}).get("do") == "meet":
            if not BOTH_HERE:
                BOTH_HERE.append(asyncio.Event())
            ARRIVED.append(ctx.metadata)
            if len(ARRIVED) == 2:
                BOTH_HERE[0].set()
            await asyncio.wait_for(BOTH_HERE[0].wait(), 120)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "ok"}])


class AlwaysGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


backend = LocalBackend(workflow=MeetingWorkflow, grader=AlwaysGrader)
"""


def test_rows_pytest_skips_do_not_stop_later_rows_running_ahead(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """A conftest skips rows 1-19 in its setup hook, which no mark foretells, once each has
    started: they ran ahead (row 0's item started them) and nobody takes their results. The
    last two rows can only finish together (each waits for the other), so the second must
    run ahead while pytest waits for the first. Before, the skipped rows' results held the whole run-ahead window (8 x
    concurrency 2 = 16) for good: the second row never started and the first timed out."""
    rows: list[dict[str, Any]] = [{"user_prompt": f"q{i}", "ground_truth": "ok"} for i in range(20)]
    rows += [
        {"user_prompt": f"q{i}", "ground_truth": "ok", "metadata": {"do": "meet"}} for i in (20, 21)
    ]
    write_workspace(pytester.path, rows=rows, rollout_source=MEETING_ROLLOUT)
    pytester.makeconftest(
        """
import pathlib
import re
import time

import pytest

def pytest_runtest_setup(item):
    row = int(re.search(r"row_(\\d+)_", item.nodeid).group(1))
    if 1 <= row < 20:
        started = pathlib.Path(f"started_q{row}")
        for _ in range(6000):  # the row starts: the window holds rows up to row + 15
            if started.exists():
                break
            time.sleep(0.01)
        pytest.skip("not today")
"""
    )
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-concurrency", "2", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3, skipped=19)
    started = sorted(p.name for p in pytester.path.glob("started_q*"))
    assert len(started) == 22, started



# Row 0 finishes once row 1 has started ("hang": it never finishes by itself), or has
# finished, or row 2 has started (row 1 never started, so row 2 had its slot): each before
# pytest reaches row 1's item. Row 2, when row 1 hangs, finishes once row 1 is cancelled.
SKIPPED_AHEAD_ROLLOUT = """
import asyncio
import pathlib

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend

EVENTS = {}


def event(name):
    return EVENTS.setdefault(name, asyncio.Event())


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        row, then = ctx.metadata["row"], pathlib.Path("then").read_text()
        pathlib.Path("ran_" + row).touch()
        if row == "q0":
            await event("go").wait()
        if row == "q1" and then == "hang":
            event("go").set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                event("cancelled").set()
                raise
        if row == "q2":
            event("go").set()
            if then == "hang":
                await asyncio.wait_for(event("cancelled").wait(), 120)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "ok"}])


class AlwaysGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)
        if ctx.metadata["row"] == "q1":
            event("go").set()


backend = LocalBackend(workflow=Workflow, grader=AlwaysGrader)
"""

SKIP_ROW_1 = {
    # A mark a conftest adds: its row is not even started ahead.
    "mark": """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid.endswith("::row_1_run_0"):
            item.add_marker(pytest.mark.skip(reason="not today"))
""",
    # A skip no mark foretells: the row started ahead. When it is to finish, the skip
    # waits until its result is in the journal (its grader let row 0 go a little before).
    "hook": """
import json
import pathlib
import time

import pytest

def recorded(row):
    journal = pathlib.Path(".osmosis/evals/skips/events.jsonl")
    lines = journal.read_text().splitlines() if journal.exists() else []
    try:
        return any(json.loads(line)["row_index"] == row for line in lines if line.strip())
    except ValueError:  # a line being written
        return False

def pytest_runtest_setup(item):
    if item.nodeid.endswith("::row_1_run_0"):
        if pathlib.Path("then").read_text() == "finish":
            for _ in range(12000):  # a hang guard only: the journal decides
                if recorded(1):
                    break
                time.sleep(0.01)
        pytest.skip("not today")
""",
}


@pytest.mark.parametrize(
    ("how", "then", "recorded"),
    [("mark", "finish", [0, 2]), ("hook", "hang", [0, 2]), ("hook", "finish", [0, 1, 2])],
    ids=["marked-never-starts", "running-is-cancelled", "finished-is-recorded"],
)
def test_a_row_pytest_skips_does_not_run_and_one_that_finished_ahead_is_recorded(
    pytester: pytest.Pytester, model_env: ModelServer, how: str, then: str, recorded: list[int]
) -> None:
    """pytest skips row 1. A skip its marks say (a conftest's ``skip`` mark) keeps it from
    starting ahead (before, it ran and was recorded: a result pytest reported skipped);
    a skip they do not say (a conftest's setup hook) cancels it if it is still running
    (before, it ran on, spending, until the session's end). Either way it stays pending,
    and the next session without the skip runs it. A row that had already finished is
    recorded, as every row that finished is (it ran, and was paid for)."""
    rows = [
        {"user_prompt": "q", "ground_truth": "ok", "metadata": {"row": f"q{i}"}} for i in range(3)
    ]
    write_workspace(pytester.path, rows=rows, rollout_source=SKIPPED_AHEAD_ROLLOUT)
    (pytester.path / "then").write_text(then)
    conftest = pytester.makeconftest(SKIP_ROW_1[how])
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "skips")
    result = pytester.runpytest(*args, "--osmosis-concurrency", "2")
    result.assert_outcomes(passed=2, skipped=1)
    run_dir = pytester.path / ".osmosis" / "evals" / "skips"
    assert sorted(r["row_index"] for r in read_index(run_dir)) == recorded
    assert (pytester.path / "ran_q1").exists() == (how == "hook")
    conftest.unlink()
    (pytester.path / "then").write_text("finish")
    again = pytester.runpytest(*args)
    if 1 in recorded:  # nothing is pending
        assert again.ret == pytest.ExitCode.OK
        again.stdout.fnmatch_lines(["already finished: every row is recorded, none ran again*"])
        return
    again.assert_outcomes(passed=3)
    assert sorted((r["row_index"], bool(r.get("resumed"))) for r in read_index(run_dir)) == [
        (0, True),
        (1, False),
        (2, True),
    ]
