"""``--osmosis-regrade RUN``: only the grader runs again, over what a finished run recorded.

A workflow that appends a line to a file per execution proves no workflow ran; the model
server's request count proves the judge's calls went through the bridge; the official
SDK's upload planner judges the new run directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import CALC_ROLLOUT, calc_rows, read_index, write_workspace

#: The calc rollout, plus: every workflow execution appends a line to $WORKFLOW_RUNS, and
#: GRADER_VERSION decides the grader (1: the calc rollout's exact match; 2: a judge call
#: through the bridge, then half a point for a right answer).
JUDGED = """

async def judged(ctx):
    final = list(ctx.sample.messages)[-1]["content"].strip()
    # What the workflow left in its artifacts is there for the grader again.
    assert (ctx.artifacts_dir / "answer.txt").read_text() == final
    rollout = get_rollout_context()
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers={"Authorization": f"Bearer {rollout.api_key}"},
            json={"model": "judge", "messages": [{"role": "user", "content": "1 + 1?"}]},
        )
        response.raise_for_status()
    ctx.set_reward(0.5 if final == ctx.label else 0.0)
"""
ROLLOUT = (
    "import os\nGRADER_VERSION = 1\n"
    + CALC_ROLLOUT.replace(
        '        do = (ctx.metadata or {}).get("do", "")\n        if do == "workflow_raise"',
        '        with open(os.environ["WORKFLOW_RUNS"], "a") as runs:\n'
        '            runs.write("ran\\n")\n'
        '        do = (ctx.metadata or {}).get("do", "")\n        if do == "workflow_raise"',
        1,
    ).replace(
        "    async def grade(self, ctx):\n",
        "    async def grade(self, ctx):\n"
        "        if GRADER_VERSION == 2:\n"
        "            return await judged(ctx)\n",
        1,
    )
    + JUDGED
)
assert ROLLOUT.count("WORKFLOW_RUNS") == 1 and ROLLOUT.count("judged(ctx)") == 2

ROWS = calc_rows(
    [
        ("What is 2 + 2?", "4"),
        ("What is 3 * 5?", "16"),  # the model says 15: a wrong answer
        ("What is 1 + 1?", "2", "workflow_raise"),
        ("What is 2 + 3?", "5", "grader_raise"),
    ]
)
PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")


def _workspace(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = write_workspace(
        root, rows=ROWS, rollout_source=ROLLOUT, evaluation={"pass_threshold": 0.5}
    )
    monkeypatch.setenv("WORKFLOW_RUNS", str(root / "workflow-runs.txt"))
    return config


def _workflow_runs(root: Path) -> int:
    path = root / "workflow-runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _new_grader(root: Path) -> None:
    main = root / "rollouts" / "calc" / "main.py"
    main.write_text(main.read_text().replace("GRADER_VERSION = 1", "GRADER_VERSION = 2"))


def _by_row(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {row["row_index"]: row for row in read_index(run_dir)}


def _first_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    _workspace(pytester.path, monkeypatch)
    result = pytester.runpytest("--osmosis-eval", "--osmosis-name", "first", *PLAIN)
    result.assert_outcomes(passed=1, failed=1, errors=2)
    assert _workflow_runs(pytester.path) == 4
    return pytester.path / ".osmosis" / "evals" / "first"


def _check_regraded(root: Path, first: Path, second: Path) -> None:
    old, new = _by_row(first), _by_row(second)
    assert _workflow_runs(root) == 4  # not one workflow ran again
    assert new[0]["status"] == "success" and new[0]["reward"] == 0.5
    assert new[1]["status"] == "success" and new[1]["reward"] == 0.0
    # The workflow failed: its recorded failure stays, with no trajectory.
    assert new[2]["status"] == "failed" and new[2]["error_type"] == old[2]["error_type"]
    assert "trajectory_filename" not in new[2]
    # The old grader failed on this row; the workflow had finished, so it is graded again.
    assert old[3]["status"] == "failed" and new[3]["status"] == "success"
    for index in (0, 1, 3):
        assert new[index]["rollout_id"] == old[index]["rollout_id"]
        # The workflow's recorded tokens, and the new grader's judge call on top.
        assert new[index]["tokens"] > old[index]["tokens"] > 0
        rollout_id = new[index]["rollout_id"]
        before = json.loads((first / "rollout_trials" / rollout_id / "trajectory.json").read_text())
        after = json.loads((second / "rollout_trials" / rollout_id / "trajectory.json").read_text())
        assert after["extra"]["osmosis"]["reward"] == new[index]["reward"]
        assert after["steps"] == before["steps"]
        artifact = second / "rollout_trials" / rollout_id / "artifacts" / "answer.txt"
        assert (
            artifact.read_text()
            == (first / "rollout_trials" / rollout_id / "artifacts" / "answer.txt").read_text()
        )
    manifest = json.loads((second / "manifest.json").read_text())
    first_manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["inputs"]["regraded_from"] == {
        "run_name": "first",
        "local_run_id": first_manifest["local_run_id"],
    }
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert metrics["summary"]["passed"] == 2
    verdict = sdk_judge(second)
    assert verdict["accepted"], verdict


def test_regrade_grades_recorded_samples_with_the_current_grader(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_run(pytester, monkeypatch)
    _new_grader(pytester.path)
    requests = model_env.requests_total
    result = pytester.runpytest("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
    result.assert_outcomes(passed=2, failed=1, errors=1)
    out = result.stdout.str()
    assert "workflow exploded on purpose (recorded in run 'first')" in out
    # Three judge calls (one per regraded row), through the bridge; no model check (the
    # grader declares no judge model, and the workflow does not run).
    assert model_env.requests_total - requests == 3
    judged = [
        body
        for path, body in model_env.requests
        if body.get("messages", [{}])[-1].get("content") == "1 + 1?"
    ]
    assert len(judged) == 3
    _check_regraded(pytester.path, first, pytester.path / ".osmosis" / "evals" / "second")


def test_regrade_under_xdist(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_run(pytester, monkeypatch)
    _new_grader(pytester.path)
    result = pytester.runpytest_subprocess(
        "--osmosis-regrade", "first", "--osmosis-name", "second", "-n", "2", *PLAIN
    )
    result.assert_outcomes(passed=2, failed=1, errors=1)
    _check_regraded(pytester.path, first, pytester.path / ".osmosis" / "evals" / "second")


def test_regrade_resumes_and_runs_nothing_twice(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regrade is a run like any other: named again, it resumes; -k picks rows."""
    _first_run(pytester, monkeypatch)
    _new_grader(pytester.path)
    args = ("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
    pytester.runpytest(*args, "-k", "row_0_").assert_outcomes(passed=1, deselected=3)
    second = pytester.path / ".osmosis" / "evals" / "second"
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2, failed=1, errors=1)
    assert "(row 0, run 0) [resumed]" not in result.stdout.str()  # passed: no headline
    assert "workflow exploded on purpose (recorded in run 'first')" in result.stdout.str()
    assert json.loads((second / "metrics.json").read_text())["eval_run"]["status"] == "finished"
    assert _workflow_runs(pytester.path) == 4


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "missing",
            "--osmosis-regrade: run 'nope' not found as a path or under *; runs there: first",
        ),
        (
            "incomplete",
            "--osmosis-regrade: run 'part' (*) is not a completed run (its status "
            "is 'incomplete')*",
        ),
        (
            "dataset",
            "--osmosis-regrade: the dataset of * is not the one run 'first' was made from*",
        ),
        (
            "config",
            "--osmosis-regrade: run 'first' was made from configs/eval/calc.toml, not "
            "configs/eval/other.toml; name that config, or leave the configs out",
        ),
        (
            "rows",
            "--osmosis-rows: a regrade grades the rows, attempts and model of the run it "
            "regrades; leave it out",
        ),
        (
            "into-itself",
            "--osmosis-regrade: the regrade of run 'first' is a new run; give it another "
            "--osmosis-name",
        ),
        (
            "journal-cut",
            "--osmosis-regrade: run 'first' (*) has no record of 1 of its 4 attempts in "
            "events.jsonl (first: row 3 run 0): its journal was cut or edited after it "
            "finished, so it cannot be regraded",
        ),
        (
            "plain-resume",
            "*run 'first' * was created with different resolved inputs (changed: regraded_from)*",
        ),
    ],
)
def test_regrade_refuses_bad_input_in_one_line(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expected: str,
) -> None:
    config = _workspace(pytester.path, monkeypatch)
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "first", *PLAIN)
    args: list[str] = ["--osmosis-regrade", "first"]
    if case == "missing":
        args = ["--osmosis-regrade", "nope"]
    elif case == "incomplete":
        pytester.runpytest("--osmosis-eval", "--osmosis-name", "part", "-k", "row_0_", *PLAIN)
        args = ["--osmosis-regrade", "part"]
    elif case == "dataset":
        data = pytester.path / "data" / "calc.jsonl"
        data.write_text(data.read_text().replace("2 + 2", "2 + 9"))
    elif case == "config":
        other = config.parent / "other.toml"
        other.write_text(config.read_text())
        args = [str(other), "--osmosis-regrade", "first"]
    elif case == "journal-cut":
        journal = pytester.path / ".osmosis" / "evals" / "first" / "events.jsonl"
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join(line for line in lines if b'"row_index":3,' not in line))
        assert len(journal.read_bytes().splitlines()) == len(lines) - 1
    elif case == "rows":
        args += ["--osmosis-rows", "0-1"]
    elif case == "into-itself":
        args += ["--osmosis-name", "first", "--osmosis-fresh"]
    elif case == "plain-resume":
        _new_grader(pytester.path)
        pytester.runpytest("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
        # The regrade's name, run as a plain eval, is not resumed as if it were one.
        args = ["--osmosis-eval", "--osmosis-name", "second"]
        expected = expected.replace("'first'", "'second'")
    runs = _workflow_runs(pytester.path)
    requests = model_env.requests_total
    result = pytester.runpytest(*args, *PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert errors[0].startswith("ERROR: ")
    from fnmatch import fnmatch

    assert fnmatch(errors[0][len("ERROR: ") :], expected), errors[0]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert _workflow_runs(pytester.path) == runs
    assert model_env.requests_total == requests
    assert (pytester.path / ".osmosis" / "evals" / "first" / "manifest.json").is_file()
    assert not os.path.exists(pytester.path / ".osmosis" / "evals" / "second") or case == (
        "plain-resume"
    )


def test_the_command_regrades_with_the_grader_of_another_rollout_dir(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pytest-osmosis regrade RUN --rollout-dir DIR``: the workspace's grader is left as it
    was; the one in DIR grades."""
    first = _first_run(pytester, monkeypatch)
    checkout = pytester.path / "checkout"
    source = (pytester.path / "rollouts" / "calc" / "main.py").read_text()
    (checkout / "calc").mkdir(parents=True)
    (checkout / "calc" / "main.py").write_text(
        source.replace("GRADER_VERSION = 1", "GRADER_VERSION = 2")
    )
    elsewhere = pytester.mkdir("elsewhere")
    result = pytester.run(
        sys.executable, "-m", "pytest_osmosis", "regrade", str(first),
        "--rollout-dir", str(checkout / "calc"),
        "--", "--osmosis-name", "second", *PLAIN,
        timeout=300,
    )  # fmt: skip
    assert elsewhere.is_dir()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=2, failed=1, errors=1)
    _check_regraded(pytester.path, first, pytester.path / ".osmosis" / "evals" / "second")


def test_the_command_names_a_missing_run_in_one_line(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    result = pytester.run(sys.executable, "-m", "pytest_osmosis", "regrade", "nope", timeout=120)
    assert result.ret == 2
    assert result.errlines == [
        f"pytest-osmosis: error: --osmosis-regrade: run 'nope' not found as a path or under "
        f"{pytester.path / '.osmosis' / 'evals'}"
    ]


def test_trajectory_messages_give_back_what_the_trajectory_was_built_from() -> None:
    """The sample a regrade grades: the chat messages, rebuilt from the ATIF steps."""
    from pytest_osmosis.results import build_trajectory
    from pytest_osmosis.results.trajectory import trajectory_messages

    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "?"}},
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "assistant", "content": "Sunny at noon.", "reasoning_content": "easy"},
        {"role": "critic", "content": "fine"},
    ]
    document = build_trajectory(
        rollout_id="r1",
        messages=messages,
        label="sunny",
        reward=1.0,
        sample_metrics=None,
        sample_extra_fields=None,
        request_metadata=None,
        request_extra_fields={"row_index": 0, "run_index": 0},
        sdk_version="test",
    )
    rebuilt = trajectory_messages(json.loads(json.dumps(document)))
    # Text parts were joined into one text; everything else comes back as it was.
    assert rebuilt == [
        messages[0],
        {"role": "user", "content": "Weather in Paris?"},
        *messages[2:],
    ]


def _model_down(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.setenv(name, "http://127.0.0.1:9/v1")  # nothing listens there


def test_a_regrade_whose_grader_calls_no_model_needs_none(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model is down: nothing checks it, and the exact-match grader grades again, with
    --osmosis-regrade and with the command (pytest's arguments right after ``--``)."""
    first = _first_run(pytester, monkeypatch)
    _model_down(monkeypatch)
    result = pytester.runpytest("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
    result.assert_outcomes(passed=1, failed=1, errors=2)
    command = pytester.run(
        sys.executable, "-m", "pytest_osmosis", "regrade", str(first),
        "--", "--osmosis-name", "third", *PLAIN,
        timeout=300,
    )  # fmt: skip
    assert command.ret == pytest.ExitCode.TESTS_FAILED, command.stdout.str() + command.stderr.str()
    command.assert_outcomes(passed=1, failed=1, errors=2)
    for name in ("second", "third"):
        new = _by_row(pytester.path / ".osmosis" / "evals" / name)
        assert [new[i]["status"] for i in range(4)] == ["success", "success", "failed", "failed"]
    assert _workflow_runs(pytester.path) == 4


def test_a_regrade_checks_the_judge_model_its_grader_declares(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run(pytester, monkeypatch)
    main = pytester.path / "rollouts" / "calc" / "main.py"
    source = main.read_text()
    main.write_text(
        "from pytest_osmosis.rubric.grader import RubricGrader\n"
        + source.replace(
            "grader=ExactGrader",
            'grader=RubricGrader.configured(rubric="right?", judge_model="openai/judge")',
        )
    )
    _model_down(monkeypatch)
    result = pytester.runpytest("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: model preflight failed for 'openai/judge': *"])
    assert not (pytester.path / ".osmosis" / "evals" / "second").exists()


def test_trajectories_swapped_between_rows_are_named(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _first_run(pytester, monkeypatch)
    old = _by_row(first)
    trials = first / "rollout_trials"
    a, b = (trials / old[i]["rollout_id"] / "trajectory.json" for i in (0, 1))
    a_text, b_text = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_text)
    b.write_bytes(a_text)
    result = pytester.runpytest("--osmosis-regrade", "first", "--osmosis-name", "second", *PLAIN)
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(
        [
            f"*rollout_failed: the trajectory of row 1 run 0 was found under row 0 run 0 ({a}), "
            "so there is no sample to regrade*",
            f"*rollout_failed: the trajectory of row 0 run 0 was found under row 1 run 0 ({b}), "
            "so there is no sample to regrade*",
        ]
    )


def test_the_command_passes_what_follows_double_dash_to_pytest(pytester: pytest.Pytester) -> None:
    """``regrade RUN -- -q``, the form --help shows: argparse drops a ``--`` right after a
    positional, so ``-q`` was taken for the command's own option (unrecognized)."""
    write_workspace(pytester.path)
    result = pytester.run(
        sys.executable, "-m", "pytest_osmosis", "regrade", "nope", "--", "-q", timeout=120
    )
    assert result.ret == 2
    assert result.errlines == [
        f"pytest-osmosis: error: --osmosis-regrade: run 'nope' not found as a path or under "
        f"{pytester.path / '.osmosis' / 'evals'}"
    ]
    usage = pytester.run(sys.executable, "-m", "pytest_osmosis", "regrade", "--help", timeout=120)
    assert "[-- PYTEST ARGS]" in usage.stdout.str()
