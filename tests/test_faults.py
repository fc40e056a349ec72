"""Runtime faults (issue 6, point 2): rollouts that raise, return garbage, break the reward
contract, block the event loop, exit or crash the interpreter.

Each fault is a row of one workspace whose rollout misbehaves on purpose. Ordinary faults
become failed rows with their own ``error_type``; a row that blocks the loop is stopped by
the pytest-timeout backstop and named; under ``-n 2`` a worker killed by ``os._exit`` or a
segfault leaves its row recorded as ``worker_crashed`` while the other rows finish, the run
directory stays uploadable (the SDK's own planner is the judge), and
``--osmosis-retry-failed`` re-runs exactly the failed rows. Crashes fire only while a
marker file exists, so the retry can succeed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import Background, only_run_dir, read_index, wait_until, write_workspace

pytest_plugins = ["pytester"]


FAULT_ROLLOUT = r'''
import asyncio
import ctypes
import math
import os
import time
from pathlib import Path

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


def _armed(meta):
    return Path(meta["marker"]).exists()


async def _after_replacement(meta):
    """Crash only once a worker replacing a crashed one has imported this rollout.

    (Controller + two workers + one replacement.) Two crashes close together hit a race
    in xdist's loadscope scheduler; that race has its own tests.
    """
    path = Path(os.environ["FAULT_IMPORTS"])
    for _ in range(600):
        if path.exists() and len(set(path.read_text().split())) >= 4:
            await asyncio.sleep(1.0)
            return
        await asyncio.sleep(0.1)


def _note(meta, what):
    # One O_APPEND write per line: several processes append without interleaving.
    fd = os.open(meta["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (what + "\n").encode())
    finally:
        os.close(fd)


_RUNNING = set()  # questions whose workflow is running in this process


async def _alone(question):
    """Wait until no other row runs in this process, and a little longer.

    A worker runs rows ahead; a crash while another row is in flight sends that row to
    another worker (it runs twice), so these rows crash only when alone.
    """
    while _RUNNING - {question}:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)


if os.environ.get("FAULT_IMPORTS"):
    _note({"log": os.environ["FAULT_IMPORTS"]}, str(os.getpid()))


class FaultWorkflow(AgentWorkflow):
    async def run(self, ctx):
        meta = ctx.metadata
        do = meta["do"]
        question = ctx.prompt[-1]["content"]
        _note(meta, question)
        _RUNNING.add(question)
        try:
            return await self._run(ctx, meta, do, question)
        finally:
            _RUNNING.discard(question)

    async def _run(self, ctx, meta, do, question):
        if do == "workflow_raise":
            raise RuntimeError("workflow exploded on purpose")
        if do == "workflow_garbage":
            return 42
        if do == "bad_messages":
            return AgentWorkflowOutput(messages=[1, "two"])
        rollout = get_rollout_context()
        # A generous client timeout: on a loaded machine the first calls wait at the bridge
        # for the preflight (tested on its own in test_preflight).
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "anything", "messages": ctx.prompt},
            )
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
        if do == "block" and _armed(meta):
            # After its model call, so the session is past the preflight (a row blocking the
            # loop during the preflight wait is not what this tests). Blocks the event loop,
            # not just this row, until the test says the backstop has stopped it: an event,
            # not a length of time (the cap only prevents a hang).
            cap = time.monotonic() + float(meta["seconds"])
            while not Path(meta["release"]).exists() and time.monotonic() < cap:
                time.sleep(0.05)
        if do == "exit" and _armed(meta):
            await _alone(question)
            os._exit(7)
        if do == "exit_now" and _armed(meta):
            os._exit(7)  # while other rows of this worker are in flight
        if do == "segv_now" and _armed(meta):
            ctypes.string_at(0)  # likewise, a segfault
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class FaultGrader(Grader):
    async def grade(self, ctx):
        meta = ctx.metadata
        do = meta["do"]
        if do == "grader_raise":
            raise RuntimeError("grader exploded on purpose")
        if do == "nan":
            ctx.set_reward(math.nan)
            return
        if do == "inf":
            ctx.set_reward(math.inf)
            return
        if do == "neg_inf":
            ctx.set_reward(-math.inf)
            return
        if do == "reward_garbage":
            ctx.set_reward("high")
            return
        if do == "no_reward":
            return
        if do == "segv" and _armed(meta):
            await _after_replacement(meta)
            await _alone("")
            ctypes.string_at(0)  # SIGSEGV in the interpreter
        final = list(ctx.sample.messages)[-1]["content"].strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.0)
'''

#: (behaviour, error_type when it fails); "ok" rows pass.
ORDINARY_FAULTS: list[tuple[str, str | None]] = [
    ("ok", None),
    ("workflow_raise", "agent_error"),
    ("grader_raise", "agent_error"),
    ("workflow_garbage", "validation_error"),
    ("bad_messages", "validation_error"),
    ("nan", "validation_error"),
    ("inf", "validation_error"),
    ("neg_inf", "validation_error"),
    ("reward_garbage", "validation_error"),
    ("no_reward", "validation_error"),
    ("ok", None),
]


def fault_rows(behaviours: list[str], root: Path, **extra: Any) -> list[dict[str, Any]]:
    """One row per behaviour; each question is unique, so the model log tells rows apart."""
    rows = []
    for index, do in enumerate(behaviours):
        rows.append(
            {
                "user_prompt": f"What is {index} + 100?",
                "ground_truth": str(index + 100),
                "metadata": {
                    "do": do,
                    "marker": str(root / "armed"),
                    "log": str(root / "executions.log"),
                    **extra,
                },
            }
        )
    return rows


def executions(root: Path) -> Counter[int]:
    """How many times each row's workflow started (by row index), across all processes."""
    path = root / "executions.log"
    if not path.exists():
        return Counter()
    return Counter(int(line.split()[2]) for line in path.read_text().splitlines() if line.strip())


def outcomes(run_dir: Path) -> dict[int, tuple[str, str | None]]:
    return {r["row_index"]: (r["status"], r.get("error_type")) for r in read_index(run_dir)}


def test_ordinary_faults_are_failed_rows_with_their_own_types(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    behaviours = [do for do, _ in ORDINARY_FAULTS]
    write_workspace(
        pytester.path,
        rows=fault_rows(behaviours, pytester.path),
        rollout_source=FAULT_ROLLOUT,
        evaluation={"batch_size": 4},
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=len(behaviours) - 2)
    run_dir = only_run_dir(pytester.path)
    assert outcomes(run_dir) == {
        index: ("success" if error is None else "failed", error)
        for index, (_, error) in enumerate(ORDINARY_FAULTS)
    }
    out = result.stdout.str()
    for index, (_, error) in enumerate(ORDINARY_FAULTS):
        if error is not None:
            result.stdout.fnmatch_lines([f"*{error}: *(row {index}, run 0)*"])
    assert "INTERNALERROR" not in out
    assert executions(pytester.path) == Counter(range(len(behaviours)))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict


RELEASE_ON_REPORT = """
from pathlib import Path


def pytest_runtest_logreport(report):
    # The blocking row's failure is reported: let its workflow return.
    if report.nodeid.endswith("{nodeid}") and report.failed:
        Path({release!r}).touch()
"""


def test_a_row_blocking_the_event_loop_is_stopped_by_the_backstop_and_named(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Only the blocker can exceed the budgets: it blocks until its backstop has fired.

    The other rows' budgets (6 s for one loopback model call, 3 s for a comparison) hold on
    a loaded machine; the blocking row is released by its own failure report, not by a clock.
    """
    behaviours = ["ok", "block", "ok", "ok"]
    (pytester.path / "armed").touch()
    release = pytester.path / "released"
    write_workspace(
        pytester.path,
        rows=fault_rows(behaviours, pytester.path, seconds=240, release=str(release)),
        rollout_source=FAULT_ROLLOUT,
        evaluation={"batch_size": 1, "agent_workflow_timeout_s": 6, "grader_timeout_s": 3},
    )
    pytester.makeini("[pytest]\nosmosis_backstop_grace = 1\n")
    pytester.makeconftest(RELEASE_ON_REPORT.format(release=str(release), nodeid="row_1_run_0"))
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "block"
    )
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*backstop_timeout: *row 1 run 0 is blocking the event loop*"])
    run_dir = pytester.path / ".osmosis" / "evals" / "block"
    assert outcomes(run_dir) == {
        0: ("success", None),
        1: ("failed", "backstop_timeout"),
        2: ("success", None),
        3: ("success", None),
    }
    assert sdk_judge(run_dir)["accepted"]
    # Disarmed, a retry runs the blocked row again and only that row.
    (pytester.path / "armed").unlink()
    before = executions(pytester.path)
    result = pytester.runpytest_subprocess(
        "--osmosis-eval",
        "-p",
        "no:cacheprovider",
        "--osmosis-name",
        "block",
        "--osmosis-retry-failed",
    )
    result.assert_outcomes(passed=4)
    assert executions(pytester.path) - before == Counter([1])


CRASH_BEHAVIOURS = [
    "ok",
    "ok",
    "exit",
    "ok",
    "workflow_raise",
    "ok",
    "segv",
    "ok",
    "nan",
    "ok",
]
CRASH_TYPES = {2: "worker_crashed", 4: "agent_error", 6: "worker_crashed", 8: "validation_error"}


def test_crashed_workers_rows_are_recorded_uploadable_and_retried_exactly(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    (root / "armed").touch()
    monkeypatch.setenv("FAULT_IMPORTS", str(root / "imports.log"))
    write_workspace(
        root,
        rows=fault_rows(CRASH_BEHAVIOURS, root),
        rollout_source=FAULT_ROLLOUT,
        evaluation={"batch_size": 2},  # one row in flight per worker
    )
    # Each crash row dies alone in its worker, the segfault after the first crash's
    # replacement worker is up (the rollout above waits for both).
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "crash", "-n", "2")
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str()
    assert "INTERNALERROR" not in out, out
    run_dir = root / ".osmosis" / "evals" / "crash"
    expected = {
        index: ("failed", CRASH_TYPES[index]) if index in CRASH_TYPES else ("success", None)
        for index in range(len(CRASH_BEHAVIOURS))
    }
    assert outcomes(run_dir) == expected, out
    result.assert_outcomes(passed=6, errors=4)
    # Each row ran once: the crashed items were not sent to another worker.
    assert executions(root) == Counter(range(len(CRASH_BEHAVIOURS))), out
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert metrics["summary"]["failed"] == 4
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict
    logs = (run_dir / "logs.txt").read_text()
    assert logs.count('"error_type":"worker_crashed"') == 2

    (root / "armed").unlink()
    before = executions(root)
    result = pytester.runpytest_subprocess(*args, "--osmosis-retry-failed")
    assert executions(root) - before == Counter(CRASH_TYPES.keys()), result.stdout.str()
    result.assert_outcomes(passed=8, errors=2)
    after = outcomes(run_dir)
    assert after[2] == after[6] == ("success", None)
    assert after[4] == ("failed", "agent_error") and after[8] == ("failed", "validation_error")
    assert verdict["accepted"] and sdk_judge(run_dir)["accepted"]


@pytest.mark.parametrize("crash", ["exit_now", "segv_now"])
def test_a_prefetched_row_that_crashes_is_the_one_recorded(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    """The worker's main thread waits for row 0 while row 2, run ahead, kills the worker.

    Row 2 is recorded ``worker_crashed`` and never sent again; rows 0, 1 and 3, in flight
    on the dead worker, run again elsewhere and pass.
    """
    root = pytester.path
    (root / "armed").touch()
    behaviours = ["ok", "ok", crash, "ok", "ok", "ok"]
    write_workspace(
        root,
        rows=fault_rows(behaviours, root),
        rollout_source=FAULT_ROLLOUT,
        evaluation={"batch_size": 8},  # a worker runs its queued rows ahead
    )
    # Row 0 waits on the model until it runs again elsewhere, which it does only once row
    # 2 has killed their worker: the worker's main thread still waits for it then. (A 3 s
    # answer left that to the scheduler; and at the rollout's advertised 4 in flight, rows
    # 0 and 2 went to different workers, where row 2 was its worker's first item.)
    row_0 = "What is 0 + 100?"
    model_env.hold = row_0
    tmp = root / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # where the controller makes its blame directory
    session = Background(
        pytester,
        *("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "pin", "-n", "2"),
        *("--osmosis-concurrency", "8"),  # 4 a worker: rows 0-3 are one worker's shard
    )
    try:
        wait_until(
            lambda: [b["messages"][-1]["content"] for b in model_env.bodies].count(row_0) == 2,
            "row 0 runs again after its worker died",
        )
    finally:
        model_env.hold = ""
    result = session.join()
    out = result.stdout.str()
    assert "INTERNALERROR" not in out, out
    run_dir = root / ".osmosis" / "evals" / "pin"
    expected = {index: ("success", None) for index in range(len(behaviours))}
    expected[2] = ("failed", "worker_crashed")
    assert outcomes(run_dir) == expected, out
    assert executions(root)[2] == 1, out
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["*worker 'gw*' crashed while running*row_2_run_0*"])
    assert not list(tmp.glob("osmosis-blame-*")), "the controller removes it at the end"


class _Node:
    """Stands in for xdist's WorkerController in scheduler tests."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.closed = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        if self.closed:
            raise OSError("cannot send (already closed?)")
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return f"<_Node {self.gateway.id}>"


def _scheduler(
    pytester: pytest.Pytester, shard_rows: int = 1, culprit: Any = None
) -> tuple[Any, list[str], _Node, _Node]:
    from pytest_osmosis.plugin.xdist_scheduler import EvalScheduling

    config = pytester.parseconfig("--tx", "2*popen", "-p", "xdist")
    sched = EvalScheduling(config, None, shard_rows=shard_rows, culprit=culprit)
    nodeids = [f"configs/eval/calc.toml::row_{i}_run_0" for i in range(12)]
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    for node in (gw0, gw1):
        sched.add_node(node)
        sched.add_node_collection(node, nodeids)
    sched.schedule()
    return sched, nodeids, gw0, gw1


def test_a_second_crash_while_the_replacement_collects_is_survived(
    pytester: pytest.Pytester,
) -> None:
    sched, nodeids, gw0, gw1 = _scheduler(pytester)
    assert sched.remove_node(gw0) is not None  # gw0 died running its first row
    gw2 = _Node("gw2")
    sched.add_node(gw2)  # its replacement is up but has not collected yet
    assert sched.remove_node(gw1) is not None  # gw1 dies too
    sched.add_node_collection(gw2, nodeids)
    sched.schedule()
    sent = {nodeids[i] for batch in gw2.sent for i in batch}
    assert sent and sched.has_pending


def test_rescheduling_onto_a_worker_that_just_died_is_survived(
    pytester: pytest.Pytester,
) -> None:
    sched, nodeids, gw0, gw1 = _scheduler(pytester)
    gw1.closed = True  # gw1 died too; xdist has not told the scheduler yet
    sched.remove_node(gw0)
    sched.remove_node(gw1)
    gw2 = _Node("gw2")
    sched.add_node(gw2)
    sched.add_node_collection(gw2, nodeids)
    sched.schedule()
    rerun = {nodeids[i] for batch in gw2.sent for i in batch}
    assert rerun, "the dead workers' unfinished rows go to the replacement"


def _unfinished(sched: Any, node: _Node) -> list[str]:
    return [
        i for unit in sched.assigned_work[node].values() for i, done in unit.items() if not done
    ]


@pytest.mark.parametrize(
    "blamed, pinned",
    [
        (2, 2),  # the row whose code ran: it is the crash item
        (None, 0),  # the worker said nothing: xdist's guess, the first unfinished row
        (1, 0),  # a row already finished cannot have crashed it
        (9, 0),  # another worker's row
    ],
)
def test_a_dead_workers_crash_is_pinned_on_the_row_its_loop_ran(
    pytester: pytest.Pytester, blamed: int | None, pinned: int
) -> None:
    asked: list[str] = []
    holder: dict[str, list[str]] = {}

    def culprit(node: _Node) -> str | None:
        asked.append(node.gateway.id)
        return None if blamed is None else holder["nodeids"][blamed]

    sched, nodeids, gw0, gw1 = _scheduler(pytester, shard_rows=4, culprit=culprit)
    holder["nodeids"] = nodeids
    assert _unfinished(sched, gw0) == nodeids[0:4]  # one shard of four rows, run ahead
    sched.mark_test_complete(gw0, 1)
    crashed = sched.remove_node(gw0)
    assert asked == ["gw0"]
    assert crashed == nodeids[pinned]
    gw2 = _Node("gw2")
    sched.add_node(gw2)
    sched.add_node_collection(gw2, nodeids)
    sched.schedule()
    queued = [i for unit in sched.workqueue.values() for i, done in unit.items() if not done]
    pending = set(queued + _unfinished(sched, gw1) + _unfinished(sched, gw2))
    assert pending == set(nodeids[4:]) | {nodeids[i] for i in (0, 2, 3) if i != pinned}


def test_a_worker_that_finished_its_work_is_not_asked_for_a_culprit(
    pytester: pytest.Pytester,
) -> None:
    asked: list[Any] = []
    sched, nodeids, gw0, _ = _scheduler(pytester, shard_rows=4, culprit=asked.append)
    for index in range(4):
        sched.mark_test_complete(gw0, index)
    for unit in sched.assigned_work[gw0].values():  # it may have been given more rows
        for nodeid in unit:
            sched.mark_test_complete(gw0, nodeids.index(nodeid))
    assert sched.remove_node(gw0) is None
    assert asked == []


OUT_OF_DESCRIPTORS_AT_THE_BRIDGE = """
import errno

from pytest_osmosis.model.direct import DirectClient

_complete = DirectClient.complete


async def _complete_emfile(self, body):
    # What the bridge's client raises when it cannot open its connection to the provider
    # (the stub is an OpenAI-compatible endpoint over plain HTTP: rows' calls skip LiteLLM).
    if "3 * 5" in str(body.get("messages")):
        raise ConnectionError("cannot connect") from OSError(errno.EMFILE, "Too many open files")
    return await _complete(self, body)


DirectClient.complete = _complete_emfile
"""


@pytest.mark.parametrize("workers", [None, "2"], ids=["single", "xdist"])
def test_the_bridge_out_of_descriptors_leaves_the_row_pending_and_stops_in_one_line(
    pytester: pytest.Pytester, model_env: ModelServer, workers: str | None
) -> None:
    """Our own exhaustion is no rollout's failure: exit 4, one line, the row left pending.

    Under xdist the worker that meets it must not end the session from inside a row
    (xdist's controller would be left with rows it cannot place: INTERNALERROR).
    """
    from workspaces import calc_rows

    rows = calc_rows(
        [("What is 2 + 2?", "4"), ("What is 1 + 1?", "2"), ("What is 3 * 5?", "15"), ("What is 2 * 3?", "6")]
    )
    write_workspace(pytester.path, rows=rows, evaluation={"batch_size": 1})
    pytester.makeconftest(OUT_OF_DESCRIPTORS_AT_THE_BRIDGE)
    args: tuple[str, ...] = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "fd")
    if workers:
        args += ("-n", workers)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 4, result.outlines
    output = result.stdout.str() + result.stderr.str()
    lines = [line for line in result.outlines if "ran out of file descriptors" in line]
    assert len(lines) == 1, result.outlines
    assert "row 2 run 0 was left pending" in lines[0], lines
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    run_dir = pytester.path / ".osmosis" / "evals" / "fd"
    recorded = outcomes(run_dir)
    if workers:  # the other worker's rows may or may not have finished first
        assert 2 not in recorded and set(recorded.values()) <= {("success", None)}, recorded
    else:
        assert recorded == {0: ("success", None), 1: ("success", None)}
    # With descriptors to spare, a resume runs the pending rows and finishes the run.
    (pytester.path / "conftest.py").unlink()
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=4)
    assert outcomes(run_dir) == {i: ("success", None) for i in range(4)}
