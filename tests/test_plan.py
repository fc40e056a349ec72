"""The plan before spending: ``--osmosis-plan``, ``--collect-only``, ``--osmosis-confirm``.

Printing the plan must cost nothing: the loopback model server counts every request, and
the output root must not exist afterwards. The prompt is driven through a real
pseudo-terminal; without one (a pipe, CI) it is never asked.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import calc_rows, run_session, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")


def _workspace(root: Path) -> Path:
    return write_workspace(
        root,
        rows=calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "15"), ("1 + 1?", "2")]),
        evaluation={
            "n": 2,
            "limit": 2,
            "batch_size": 3,
            "agent_workflow_timeout_s": 60,
            "grader_timeout_s": 30,
            "pass_threshold": 0.5,
        },
    )


def _plan_lines(output: str) -> dict[str, str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("osmosis plan: "))
    found: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        label, _, value = line.strip().partition("  ")
        found[label] = value.strip()
    return found


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["single", "xdist"])
def test_plan_prints_and_spends_nothing(
    pytester: pytest.Pytester, model_env: ModelServer, workers: tuple[str, ...]
) -> None:
    _workspace(pytester.path)
    result = run_session(
        pytester, "--osmosis-eval", "--osmosis-plan", "--osmosis-name", "nightly", *workers, *PLAIN
    )
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert "osmosis plan: configs/eval/calc.toml" in out
    plan = _plan_lines(out)
    assert plan == {
        "rollout": "calc (main.py)",
        "model": "openai/test-model",
        "dataset": "calc (data/calc.jsonl)",
        "rows": "2 of 3 (0-1)",
        "attempts (n)": "2",
        "work items": "4 (4 to run)",
        "concurrency": "3",
        "execution": "in-process (a LocalBackend rollout this environment satisfies)",
        "budgets": "workflow 60 s, grader 30 s",
        "pass threshold": "0.5",
        "cache": "off",
        "run": "nightly (new run)",
        "output": ".osmosis/evals/nightly",
    }
    # Said once, in our words: not again as pytest's `_pytest.outcomes.Exit` (nor on stderr).
    assert out.count("--osmosis-plan: nothing ran (no model call, no run directory)") == 1
    assert "Exit" not in out + result.stderr.str()
    assert model_env.requests_total == 0
    assert not (pytester.path / ".osmosis").exists()


def test_plan_says_a_named_run_resumes(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "nightly", "-k", "row_0_", *PLAIN)
    requests = model_env.requests_total
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-name", "nightly", *PLAIN
    )
    plan = _plan_lines(result.stdout.str())
    assert plan["run"] == "nightly (resumes: 2 recorded, 2 to run)"
    assert plan["work items"] == "4 (2 to run)"
    changed = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-name", "nightly", "--osmosis-n", "3", *PLAIN
    )
    assert _plan_lines(changed.stdout.str())["run"] == (
        "nightly (would be refused: made with different inputs (changed: n))"
    )
    # What the run itself would do: stop with its one line, exit 4.
    assert changed.ret == pytest.ExitCode.USAGE_ERROR
    run = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "nightly", "--osmosis-n", "3", *PLAIN
    )
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    assert changed.errlines == run.errlines
    assert "was created with different resolved inputs (changed: n)" in run.errlines[0]
    # A manifest it cannot read: the same.
    manifest = next((pytester.path / ".osmosis" / "evals" / "nightly").glob("manifest.json"))
    manifest.write_text("{not json")
    unreadable = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-name", "nightly", *PLAIN
    )
    assert _plan_lines(unreadable.stdout.str())["run"].startswith("nightly (cannot resume: ")
    run = pytester.runpytest("--osmosis-eval", "--osmosis-name", "nightly", *PLAIN)
    assert (unreadable.ret, run.ret) == (pytest.ExitCode.USAGE_ERROR,) * 2
    assert unreadable.errlines == run.errlines and "is unreadable" in run.errlines[0]
    assert model_env.requests_total == requests


def test_collect_only_shows_the_plan(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--co", "-q", *PLAIN)
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert _plan_lines(out)["work items"] == "4 (4 to run)"
    assert "configs/eval/calc.toml::row_1_run_1" in out
    assert model_env.requests_total == 0
    assert not (pytester.path / ".osmosis").exists()


def test_collect_only_very_quiet_lists_node_ids_alone(pytester: pytest.Pytester) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--co", "-qq", *PLAIN)
    assert "osmosis plan" not in result.stdout.str()
    assert "configs/eval/calc.toml: 4" in result.stdout.str()


def test_a_broken_config_is_one_line_of_the_plan(pytester: pytest.Pytester) -> None:
    config = _workspace(pytester.path)
    config.write_text(config.read_text().replace('dataset = "calc"', 'dataset = "missing"'))
    result = pytester.runpytest("--osmosis-eval", "--osmosis-plan", *PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    plan = _plan_lines(result.stdout.str())
    assert list(plan) == ["error"] and "missing" in plan["error"]
    assert result.stderr.lines == [
        "ERROR: --osmosis-plan: 1 of 1 config(s) cannot run (the error is in their plan); "
        "nothing ran",
        "",
    ]
    assert "Exit" not in result.stdout.str()


def test_a_rollout_traceback_in_the_plan_stays_inside_its_error_entry(
    pytester: pytest.Pytester,
) -> None:
    """A rollout that raises at import: its traceback lines went to column 0, under the
    plan's entries, where they read as lines of their own."""
    _workspace(pytester.path)
    (pytester.path / "rollouts" / "calc" / "main.py").write_text(
        'raise RuntimeError("cannot reach the tools database")\n'
    )
    result = pytester.runpytest("--osmosis-eval", "--osmosis-plan", *PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = result.stdout.lines
    start = lines.index("osmosis plan: configs/eval/calc.toml")
    entry = lines[start + 1 : start + 5]
    assert entry[0].startswith("  error  ") and entry[0].endswith(
        "main.py: importing the rollout failed: RuntimeError: cannot reach the tools database"
    )
    indent = " " * len("  error  ")
    assert entry[1:] == [
        f"{indent}Traceback (rollout frames):",
        f'{indent}  File "{pytester.path / "rollouts" / "calc" / "main.py"}", line 1, in <module>',
        f'{indent}    raise RuntimeError("cannot reach the tools database")',
    ]


def test_confirm_is_skipped_without_a_terminal(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest_subprocess("--osmosis-eval", "--osmosis-confirm", *PLAIN)
    result.assert_outcomes(passed=4)
    assert "[y/N]" not in result.stdout.str()


def _in_terminal(root: Path, answer: bytes, *args: str) -> tuple[int, str]:
    """Run pytest with a pseudo-terminal as stdin/stdout; answer the prompt when it comes."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=root,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "200"},
    )
    os.close(follower)
    output = b""
    answered = False
    while True:
        ready, _, _ = select.select([leader], [], [], 300)  # a hang guard, not a timing check
        if not ready:
            process.kill()
            raise AssertionError(f"no output for 300 s:\n{output.decode()}")
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if not answered and b"[y/N]" in output:
            os.write(leader, answer)
            answered = True
    os.close(leader)
    return process.wait(), output.decode(errors="replace")


def test_confirm_declined_makes_no_model_call_and_no_run(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    status, out = _in_terminal(
        pytester.path, b"n\n", "--osmosis-eval", "--osmosis-confirm", "--osmosis-name", "x", *PLAIN
    )
    assert "osmosis plan: configs/eval/calc.toml" in out
    assert "osmosis: run 4 work items with openai/test-model? [y/N]" in out
    assert out.count("not started (declined at the prompt)") == 1
    assert "Exit" not in out
    assert status == 2
    assert model_env.requests_total == 0
    assert not (pytester.path / ".osmosis" / "evals" / "x").exists()


def test_confirm_accepted_runs(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    status, out = _in_terminal(pytester.path, b"y\n", "--osmosis-eval", "--osmosis-confirm", *PLAIN)
    assert "[y/N]" in out
    assert status == 0, out
    assert "4 passed" in out
