"""Issue 17's gates, on both sides of their thresholds, in one process and under ``-n 2``:
per-row verdicts from n attempts (``--osmosis-row-pass``, pass^k, flaky rows), a regression
gate against a baseline run, and budgets that stop a session early."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from sdk_planner import sdk_judge
from workspaces import CALC_ROLLOUT, HELD, calc_rows, read_index, wait_until, write_workspace

from pytest_osmosis.results.row_metrics import ROW_METRICS_FILENAME

# A grader whose "flaky" rows pass every other attempt (a row's attempts run in one process,
# under xdist too: the scheduler sends a row's attempts to one worker), and whose "breakable"
# rows fail while CALC_BREAK is set (the same dataset, a worse rollout).
ROLLOUT = CALC_ROLLOUT.replace(
    "import math\n",
    "import math\nimport os\nSEEN = {}\n",
).replace(
    '        if do == "no_reward":',
    '        if do == "breakable" and os.environ.get("CALC_BREAK"):\n'
    "            ctx.set_reward(0.0)\n"
    "            return\n"
    '        if do == "flaky":\n'
    "            SEEN[ctx.label] = SEEN.get(ctx.label, 0) + 1\n"
    "            ctx.set_reward(1.0 if SEEN[ctx.label] % 2 else 0.0)\n"
    "            return\n"
    '        if do == "no_reward":',
)
assert "CALC_BREAK" in ROLLOUT and "SEEN[ctx.label]" in ROLLOUT

# n = 2: rows 0 and 1 pass both attempts, row 2 one of two (flaky), row 3 none.
FLAKY_ROWS = calc_rows(
    [
        ("What is 2 + 2?", "4"),
        ("What is 3 + 3?", "6"),
        ("What is 4 + 4?", "8", "flaky"),
        ("What is 3 * 5?", "16"),
    ]
)

BASE = ["--osmosis-eval", "-p", "no:cacheprovider"]


def _run(pytester: pytest.Pytester, xdist: bool, *args: str) -> pytest.RunResult:
    if xdist:
        return pytester.runpytest_subprocess(*BASE, "-n", "2", *args)
    return pytester.runpytest(*BASE, *args)


def _run_dir(pytester: pytest.Pytester, name: str) -> Path:
    return pytester.path / ".osmosis" / "evals" / name


@pytest.fixture
def served(pytester: pytest.Pytester, model_server, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CALC_BREAK", raising=False)
    return pytester


# -- per-row verdicts from n attempts --------------------------------------------------


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
@pytest.mark.parametrize(
    ("row_pass", "code", "line"),
    [
        ("1/2", 0, "*rows passing 1/2: 3 of 3*"),
        ("2/2", 1, "*rows passing 2/2: 2 of 3; rows that do not: 2*"),
    ],
)
def test_row_pass_gate(
    served: pytest.Pytester, xdist: bool, row_pass: str, code: int, line: str
) -> None:
    write_workspace(served.path, rows=FLAKY_ROWS, rollout_source=ROLLOUT, evaluation={"n": 2})
    result = _run(
        served, xdist, "--osmosis-rows", "0-2", "--osmosis-row-pass", row_pass, "--osmosis-name", "r"
    )
    assert result.ret == code, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "pass@k     pass@1 83.3%  pass@2 100.0%",
            "pass^k     pass^1 83.3%  pass^2 66.7%",
            "rows       2 passed every attempt, 1 flaky (rows 2), 0 passed none",
            f"row pass   {row_pass}: *",
            "tokens     * cost unknown *",
            f"*osmosis gate {'PASSED' if code == 0 else 'FAILED'}*",
            line,
        ]
    )
    result.assert_outcomes(passed=5, failed=1)  # attempts stay visible either way
    run_dir = _run_dir(served, "r")
    doc = json.loads((run_dir / ROW_METRICS_FILENAME).read_text())
    assert doc["rows"] == {"passed": 2, "flaky": 1, "failed": 0}
    assert doc["flaky_rows"] == [2]
    assert [p["k"] for p in doc["pass_hat_k"]] == [1, 2]
    assert doc["row_pass"]["passed"] == (3 if code == 0 else 2)
    assert doc["cost_usd"] is None  # openai/test-model has no price
    # metrics.json keeps the SDK's shape: none of our keys, and the SDK uploads the run.
    summary = json.loads((run_dir / "metrics.json").read_text())["summary"]
    assert not {"pass_hat_k", "flaky_rows", "row_pass", "cost_usd"} & set(summary)
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict
    assert ROW_METRICS_FILENAME not in verdict["files"]


def test_row_pass_is_refused_in_one_line_when_it_names_another_n(
    served: pytest.Pytester,
) -> None:
    write_workspace(served.path, rows=FLAKY_ROWS, rollout_source=ROLLOUT, evaluation={"n": 2})
    result = served.runpytest(*BASE, "--osmosis-row-pass", "2/3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--osmosis-row-pass 2/3: run * makes 2 attempts per row (n), not 3"]
    )
    assert not (served.path / ".osmosis" / "evals").exists() or not any(
        p for p in (served.path / ".osmosis" / "evals").iterdir() if not p.name.startswith(".")
    )
    bad = served.runpytest(*BASE, "--osmosis-row-pass", "3/2")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--osmosis-row-pass: must be k/n with 1 <= k <= n*, got '3/2'"])
