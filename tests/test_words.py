"""What a user reads: dataset rows everywhere, one outcome vocabulary, a finished run's record.

Each test reads the text a person reads (terminal lines, `pytest-osmosis info/list`, the
Markdown and HTML reports, the JUnit XML), not internal state.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from workspaces import MIXED_ROWS, calc_rows, read_index, run_session, write_workspace

from pytest_osmosis.cli import main
from pytest_osmosis.report import run_markdown
from pytest_osmosis.results.run_reader import load_run

pytest_plugins = ["pytester"]

# Dataset rows 5 and 6 do not pass: 5 is below the threshold, 6 errors.
SEVEN = calc_rows(
    [
        ("What is 0 + 1?", "1"),
        ("What is 1 + 1?", "2"),
        ("What is 2 + 1?", "3"),
        ("What is 3 + 1?", "4"),
        ("What is 4 + 1?", "5"),
        ("What is 3 * 5?", "16"),
        ("What is 1 + 1?", "2", "workflow_raise"),
    ]
)

MIXED = MIXED_ROWS  # one of each outcome, and two errors

BASE = ("--osmosis-eval", "-p", "no:cacheprovider")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def progress_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("osmosis: ")]


# ----------------------------------------------------------------------------- point 7


def test_a_row_selection_is_named_by_its_dataset_rows_everywhere(
    pytester: pytest.Pytester, model_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    write_workspace(pytester.path, rows=SEVEN)
    result = pytester.runpytest(
        *BASE, "--osmosis-rows", "5-6", "--osmosis-name", "sel", "--osmosis-report"
    )
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["FAILED *calc.toml::row_5_run_0*", "ERROR *calc.toml::row_6_run_0*"]
    )
    # No line a user reads names the selection positions 0 and 1.
    assert not re.search(r"\brow [01] run 0\b", result.stdout.str())
    # Progress, the results table's block and pytest's own headline name dataset rows.
    result.stdout.fnmatch_lines(
        [
            "osmosis: row 5 run 0 below threshold (reward 0.0)  *",
            "osmosis: row 6 run 0 errored (agent_error)  *",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        [
            "attempts that did not pass:",
            "  row 5 run 0: below threshold (reward 0.00)  */rollout_trials/*",
            "  row 6 run 0: errored (agent_error)  */rollout_trials/*",
        ]
    )
    root = pytester.path / ".osmosis" / "evals"
    run_dir = root / "sel"
    # The contract's files keep the selection position (upload needs 0..S-1).
    assert [r["row_index"] for r in read_index(run_dir)] == [0, 1]
    # (the erroring row wrote no trajectory)
    assert [p.name for p in (run_dir / "trajectories").iterdir()] == ["row_0_run_0.json"]
    info = cli(capsys, "info", "sel", "--output", str(root))
    assert "\nErrored attempts (1)\n  row 6 run 0: error_type=agent_error -> rollout_trials/" in (
        info
    )
    markdown = run_markdown(load_run(run_dir))
    assert "| 6 | 0 | agent\\_error | workflow raised RuntimeError" in markdown
    html = (run_dir / "report.html").read_text()
    cells = re.findall(r'data-key="([^"]+)"[^>]*><td class="num">(\d+)</td>', html)
    assert cells == [("5.0", "5"), ("6.0", "6")]
    assert "row 5: 0/1 attempts passed" in html and "row 6: 0/1 attempts passed" in html
    # Inputs come from the dataset file the session handed the report, by dataset row
    # (row 5's, not selection position 0's "What is 0 + 1?"); row 6 raised before
    # producing a sample, so the dataset is the only place its input is.
    inputs = re.findall(r'data-key="([^"]+)".*?<td class="clip">([^<]*)</td>', html)
    assert inputs == [("5.0", "What is 3 * 5?"), ("6.0", "What is 1 + 1?")]
    assert '"in_src":"dataset"' in html and '"lab":"2"' in html
    # The session refreshed runs.html beside the run directories and said where.
    result.stdout.fnmatch_lines(
        [f"report     {run_dir / 'report.html'}", f"all runs   {root / 'runs.html'}"]
    )
    assert 'data-run="sel"' in (root / "runs.html").read_text()


# ----------------------------------------------------------------------------- point 8


def test_one_vocabulary_in_the_terminal_info_and_report(
    pytester: pytest.Pytester, model_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    result = pytester.runpytest(*BASE, "--osmosis-name", "mix")
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "outcomes   1 passed, 1 below threshold, 2 errored, 1 skipped of 5",
            "pass rate  25.0% (1 passed / 4 attempts not skipped), pass_threshold 1.0",
        ]
    )
    assert progress_lines(result.stdout.str())[-1].startswith(
        "osmosis: row 4 run 0 skipped  [5/5 attempts done: "
        "1 passed, 1 below threshold, 2 errored, 1 skipped; pass rate 25.0%; "
    )
    assert "scored" not in result.stdout.str()
    root = pytester.path / ".osmosis" / "evals"
    info = cli(capsys, "info", "mix", "--output", str(root))
    assert "  Outcomes  1 passed, 1 below threshold, 2 errored, 1 skipped\n" in info
    assert "Pass rate    25.0% (1 passed / 4 attempts not skipped), pass_threshold 1.0" in info
    assert "scored" not in info
    markdown = run_markdown(load_run(root / "mix"))
    assert "**Pass rate 25.0%** (1 passed / 4 attempts not skipped), pass_threshold 1.0" in (
        markdown
    )
    assert "| attempts | 5 / 5: 1 passed, 1 below threshold, 2 errored, 1 skipped |" in markdown
    assert "#### Errored attempts (2)" in markdown
    assert "scored" not in markdown


def test_progress_counts_only_selected_attempts(pytester: pytest.Pytester, model_env: Any) -> None:
    write_workspace(pytester.path, rows=MIXED)
    result = pytester.runpytest(*BASE, "-k", "row_0_run_0")
    result.assert_outcomes(passed=1)
    [line] = progress_lines(result.stdout.str())  # four of the five items were deselected
    assert line.startswith(
        "osmosis: row 0 run 0 passed (reward 1.0)  [1/1 attempts done: 1 passed, "
    )


def test_after_a_resume_progress_has_the_summarys_basis(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    named = (*BASE, "--osmosis-name", "half")
    pytester.runpytest(*named, "-k", "row_0_run_0 or row_1_run_0").assert_outcomes(
        passed=1, failed=1
    )
    again = pytester.runpytest(*named)
    again.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)  # two of them replayed
    lines = progress_lines(again.stdout.str())
    assert len(lines) == 3  # only what ran in this session
    assert lines[0].startswith(
        "osmosis: row 2 run 0 errored (agent_error)  [3/5 attempts done (2 recorded earlier): "
        "1 passed, 1 below threshold, 1 errored, 0 skipped; pass rate 33.3%; "
    )
    assert (
        "[5/5 attempts done (2 recorded earlier): 1 passed, 1 below threshold, 2 errored, "
        in (lines[-1])
    )
    assert "pass rate 25.0%;" in lines[-1]
    again.stdout.fnmatch_lines(
        ["pass rate  25.0% (1 passed / 4 attempts not skipped), pass_threshold 1.0"]
    )


# ----------------------------------------------------------------------------- point 9


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_a_finished_run_keeps_its_record_and_junit_lists_its_rows(
    pytester: pytest.Pytester,
    model_env: Any,
    capsys: pytest.CaptureFixture[str],
    xdist: tuple[str, ...],
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    args = (*BASE, "--osmosis-name", "done", *xdist)
    first = run_session(pytester, *args, "--junitxml", "first.xml")
    first.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    root = pytester.path / ".osmosis" / "evals"
    run_dir = root / "done"
    snapshots = ("metrics.json", "index.jsonl", "summary.jsonl", "progress.json")
    before = {name: (run_dir / name).read_bytes() for name in snapshots}
    info_before = cli(capsys, "info", "done", "--output", str(root))
    list_before = cli(capsys, "list", "--output", str(root))
    requests = model_env.requests_total

    again = run_session(pytester, *args, "--junitxml", "again.xml")
    assert again.ret == pytest.ExitCode.TESTS_FAILED, again.stdout.str()
    again.stdout.fnmatch_lines(["*already finished: every row is recorded, none ran again*"])
    assert model_env.requests_total == requests  # nothing ran, no preflight either
    # The record is as the first session left it: duration, start, resumed flags, all.
    assert {name: (run_dir / name).read_bytes() for name in snapshots} == before
    assert cli(capsys, "info", "done", "--output", str(root)) == info_before
    assert cli(capsys, "list", "--output", str(root)) == list_before
    # JUnit lists every recorded row with its recorded outcome, not an empty suite.
    recorded = "recorded by an earlier session"
    assert junit_cases(pytester.path / "again.xml") == {
        "row_0_run_0": ("passed", ""),
        "row_1_run_0": ("failure", "reward 0.00 < pass_threshold 1.00 (row 1, run 0) [resumed]"),
        "row_2_run_0": ("error", f'failed on setup with "agent_error: {recorded} (row 2, run 0) [resumed]"'),
        "row_3_run_0": ("error", f'failed on setup with "agent_error: {recorded} (row 3, run 0) [resumed]"'),
        "row_4_run_0": ("skipped", f"{recorded} (row 4, run 0) [resumed]"),
    }
    suite = ET.parse(pytester.path / "again.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "5",
        "1",
        "2",
        "1",
    )
    # Each test case takes the duration recorded for its row.
    recorded_times = {
        f"row_{r['row_index']}_run_{r['run_index']}": r["duration_ms"] / 1000
        for r in read_index(run_dir)
    }
    assert junit_times(pytester.path / "again.xml") == pytest.approx(recorded_times, abs=0.0015)
    case = ET.parse(pytester.path / "again.xml").getroot().find(".//testcase")
    assert case is not None
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["osmosis_reward"] == "1.0"


def junit_cases(path: Path) -> dict[str, tuple[str, str]]:
    """Test case name -> (outcome, the start of its message)."""
    cases: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome, message = tag, str(element.get("message", ""))
                break
        cases[str(case.get("name"))] = (outcome, message)
    return cases


def junit_times(path: Path) -> dict[str, float]:
    return {
        str(case.get("name")): float(case.get("time", 0))
        for case in ET.parse(path).getroot().iter("testcase")
    }


def test_one_attempt_is_one_attempt() -> None:
    from pytest_osmosis.core.words import pass_rate_basis, pass_rate_text

    assert pass_rate_basis(1, 1) == "1 passed / 1 attempt not skipped"
    assert pass_rate_text(5, 8) == "62.5% (5 passed / 8 attempts not skipped)"
