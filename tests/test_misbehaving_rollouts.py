"""Rollouts that misbehave (issue 14, section 5): a recorded row or one line, never a hang.

A workflow or grader that calls ``sys.exit``, raises ``KeyboardInterrupt`` or its own
``asyncio.CancelledError``, or stops the session's event loop is one failed row with a
headline saying what it did; the other rows run on. Every session runs in a subprocess
with a timeout, so a regression is a failed test, not a hung suite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import read_index, write_workspace

pytest_plugins = ["pytester"]

#: Generous: a healthy session of these workspaces takes a few seconds.
SESSION_TIMEOUT = 120

MISBEHAVING_ROLLOUT = r'''
import asyncio
import sys

import httpx

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from pytest_osmosis.rollout import get_rollout_context


async def misbehave(do):
    if do == "exit":
        sys.exit(3)  # what an argparse/click error in a helper does
    if do == "kbint":
        raise KeyboardInterrupt
    if do == "stop":
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)
    if do == "cancel":
        raise asyncio.CancelledError()
    if do == "extra_object":
        return {"handle": object()}
    if do == "extra_deep":
        deep = []
        for _ in range(5000):
            deep = [deep]
        return {"deep": deep}
    if do == "close_stdout":
        sys.stdout.close()  # a helper that thought it owned the stream
    if do == "child_exit":
        async def helper():
            sys.exit(4)
        await asyncio.create_task(helper())


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        do = ctx.metadata["do"]
        if not do.startswith("grader_"):
            await misbehave(do)
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "anything", "messages": ctx.prompt},
            )
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Judge(Grader):
    async def grade(self, ctx):
        do = ctx.metadata["do"]
        if do.startswith("grader_"):
            extra = await misbehave(do[len("grader_"):])
            if extra:
                ctx.sample.extra_fields.update(extra)
        final = list(ctx.sample.messages)[-1]["content"].strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.0)


backend = LocalBackend(workflow=Workflow, grader=Judge)
'''


def rows(behaviours: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "user_prompt": f"What is {index} + 100?",
            "ground_truth": str(index + 100),
            "metadata": {"do": do},
        }
        for index, do in enumerate(behaviours)
    ]


def run_session(pytester: pytest.Pytester, name: str, *extra: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--osmosis-eval",
        "-p",
        "no:cacheprovider",
        "--osmosis-name",
        name,
        *extra,
        timeout=SESSION_TIMEOUT,
    )


def journal(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


#: (behaviour, the headline's words); "ok" rows pass.
ESCAPES = [
    ("ok", None),
    ("exit", "workflow called sys.exit(3)"),
    ("kbint", "workflow raised KeyboardInterrupt"),
    ("stop", "workflow stopped the session's event loop"),
    ("cancel", "workflow raised CancelledError"),
    ("child_exit", "workflow called sys.exit(4)"),
    ("ok", None),
    ("grader_exit", "grader called sys.exit(3)"),
    ("grader_kbint", "grader raised KeyboardInterrupt"),
    ("grader_stop", "grader stopped the session's event loop"),
    ("grader_cancel", "grader raised CancelledError"),
    ("ok", None),
]


def test_exits_interrupts_stops_and_own_cancels_are_one_failed_row_each(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    behaviours = [do for do, _ in ESCAPES]
    write_workspace(
        pytester.path,
        rows=rows(behaviours),
        rollout_source=MISBEHAVING_ROLLOUT,
        evaluation={"batch_size": 4},
    )
    result = run_session(pytester, "escapes")
    out = result.stdout.str()
    assert result.ret == 1, out
    result.assert_outcomes(passed=3, errors=len(behaviours) - 3)
    assert "INTERNALERROR" not in out
    assert len(out.splitlines()) < 400, "a deep traceback was printed"
    run_dir = pytester.path / ".osmosis" / "evals" / "escapes"
    recorded = {r["row_index"]: r for r in read_index(run_dir)}
    assert sorted(recorded) == list(range(len(behaviours)))
    for index, (_, headline) in enumerate(ESCAPES):
        row = recorded[index]
        if headline is None:
            assert row["status"] == "success", row
            continue
        assert (row["status"], row["error_type"]) == ("failed", "agent_error"), row
        result.stdout.fnmatch_lines([f"*agent_error: {headline}*(row {index}, run 0)*"])
    assert sdk_judge(run_dir)["accepted"]
    # Recorded, so a resume runs nothing again.
    again = run_session(pytester, "escapes")
    assert again.ret == 1, again.stdout.str()  # the recorded failures still count
    again.assert_outcomes(deselected=len(behaviours))
    again.stdout.fnmatch_lines(["*already finished*", "*3 passed, 0 below threshold, 9 errored*"])


def test_a_rollouts_own_cancelled_error_is_one_recorded_failure(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(
        pytester.path,
        rows=rows(["ok", "cancel", "ok"]),
        rollout_source=MISBEHAVING_ROLLOUT,
        evaluation={"batch_size": 1},
    )
    result = run_session(pytester, "cancel")
    out = result.stdout.str()
    result.assert_outcomes(passed=2, errors=1)
    assert len(out.splitlines()) < 120, "a deep traceback was printed"
    result.stdout.fnmatch_lines(["*agent_error: workflow raised CancelledError*(row 1, run 0)*"])
    run_dir = pytester.path / ".osmosis" / "evals" / "cancel"
    assert [(r["row_index"], r["status"]) for r in journal(run_dir) if "status" in r] == [
        (0, "success"),
        (1, "failed"),
        (2, "success"),
    ]


def test_an_unserialisable_extra_field_costs_only_that_rows_trajectory(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(
        pytester.path,
        rows=rows(["ok", "grader_extra_object", "ok", "grader_extra_deep", "ok"]),
        rollout_source=MISBEHAVING_ROLLOUT,
        evaluation={"batch_size": 2},
    )
    result = run_session(pytester, "extra")
    out = result.stdout.str()
    result.assert_outcomes(passed=5)
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    run_dir = pytester.path / ".osmosis" / "evals" / "extra"
    recorded = {r["row_index"]: r for r in read_index(run_dir)}
    for index in (0, 2, 4):
        assert recorded[index].get("trajectory_filename"), recorded[index]
        trial = run_dir / "rollout_trials" / recorded[index]["rollout_id"]
        assert (trial / "trajectory.json").is_file()
    logs = (run_dir / "logs.txt").read_text()
    for index in (1, 3):
        assert "trajectory_filename" not in recorded[index], recorded[index]
        trial = run_dir / "rollout_trials" / recorded[index]["rollout_id"]
        assert not (trial / "trajectory.json").exists()
        lines = [line for line in logs.splitlines() if recorded[index]["rollout_id"] in line]
        assert any("no trajectory written" in line for line in lines), logs
    # Said where the user looks (it was in logs.txt alone, exit 0): the rows' own lines,
    # and the results table with the count and the first reason.
    outlines = result.outlines
    for row in (1, 3):
        (line,) = [x for x in outlines if x.startswith(f"osmosis: row {row} run 0 passed")]
        assert "; no trajectory written: " in line, line
    (table,) = [x for x in outlines if x.startswith("trajectory ")]
    assert table.startswith(
        "trajectory 2 rows recorded without trajectory.json (first: row 1 run 0: "
        "no trajectory written: "
    ), table
    assert sdk_judge(run_dir)["accepted"]


@pytest.mark.parametrize("args", [(), ("-s",), ("-n", "2")], ids=["captured", "s", "xdist"])
def test_a_rollout_closing_sys_stdout_costs_no_row_and_no_flood(
    pytester: pytest.Pytester, model_env: ModelServer, args: tuple[str, ...]
) -> None:
    """It made 2,730 lines of errors (pytest's capture stream closed under it)."""
    write_workspace(
        pytester.path,
        rows=rows(["ok", "close_stdout", "ok"]),
        rollout_source=MISBEHAVING_ROLLOUT,
        evaluation={"batch_size": 1},
    )
    result = run_session(pytester, "stdout", *args)
    out = result.stdout.str() + result.stderr.str()
    run_dir = pytester.path / ".osmosis" / "evals" / "stdout"
    assert [r["status"] for r in journal(run_dir)] == ["success"] * 3
    result.assert_outcomes(passed=3)
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    assert len(out.splitlines()) < 60, out


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"row_index": 10}, "row_index 10 is not a row of this run (it has 10 rows: 0-9)"),
        ({"run_index": 1}, "run_index 1 is not an attempt of this run (n = 1: 0-0)"),
        ({"row_index": -1}, "row_index must be a non-negative integer, got -1"),
        ({"source_row_index": 7}, "source_row_index 7 is not row_index 9's source row (9)"),
        (
            {"status": "failed", "error_type": "agent_error", "reward": 0.9},
            "a failed record carries reward 0.9, but only a success has a reward",
        ),
    ],
    ids=["row", "attempt", "negative", "source", "failed-reward"],
)
def test_a_journal_line_for_a_work_item_that_does_not_exist_is_refused_at_resume(
    pytester: pytest.Pytester, model_env: ModelServer, edit: dict[str, Any], words: str
) -> None:
    write_workspace(
        pytester.path,
        rows=rows(["ok"] * 10),
        rollout_source=MISBEHAVING_ROLLOUT,
        evaluation={"batch_size": 5},
    )
    run_session(pytester, "edited").assert_outcomes(passed=10)
    run_dir = pytester.path / ".osmosis" / "evals" / "edited"
    events = run_dir / "events.jsonl"
    last = journal(run_dir)[-1]
    assert last["row_index"] == 9
    forged = {**last, "rollout_id": "f" * 32, **edit}
    events.write_text(events.read_text() + json.dumps(forged) + "\n")
    result = run_session(pytester, "edited")
    out = "\n".join([*result.outlines, *result.errlines])
    assert result.ret not in (0, 1), out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert any(f"{events}:11: " in line and words in line for line in out.splitlines()), out
