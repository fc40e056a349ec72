"""The report's per-attempt columns, compare view and runs.html, in a real Chromium.

The browser is Debian's chromium driven by Playwright (``chromium_page``): every request
a page makes must be local, and console errors or uncaught exceptions fail the test.

The run is a copy of the official SDK's reference run inside a copy of the workspace that
made it, so the dataset file (found by the manifest's sha256) gives the input of the rows
that failed before producing a sample.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from chromium_page import Watched, needs_chromium
from reference_paths import REFERENCE_RUN, REFERENCE_WORKSPACE, needs_reference, writable_copy

from pytest_osmosis.cli import main
from pytest_osmosis.core.words import percent
from pytest_osmosis.report import write_index, write_report, write_report_for_run
from pytest_osmosis.report.data import CELL_CHARS
from pytest_osmosis.report.stats import wilson_interval
from pytest_osmosis.results.metrics import aggregate_metrics

pytest_plugins = ["chromium_page"]
pytestmark = [
    needs_chromium,
    needs_reference,
]
LONG_ANSWER = "The sum is four. " + "Let me explain the arithmetic step by step. " * 40


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def edit_json(path: Path, change: Any) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``<workspace>/.osmosis/evals`` holding a copy of the reference run."""
    workspace = writable_copy(REFERENCE_WORKSPACE, tmp_path / "ws")
    evals = workspace / ".osmosis" / "evals"
    run = writable_copy(REFERENCE_RUN, evals / "reference-run")
    index = jsonl(run / "index.jsonl")
    trial = run / "rollout_trials"

    def explain_and_lengthen(document: dict[str, Any]) -> None:
        document["steps"][-1]["message"] = LONG_ANSWER
        document["final_metrics"]["total_cost_usd"] = 0.0125
        document["extra"]["osmosis"]["sample_extra_fields"] = {
            "explanation": "expected 4; the answer says four in words"
        }

    # Row 0, attempt 0: a long answer, a grader's explanation and a cost in the trajectory.
    edit_json(trial / index[0]["rollout_id"] / "trajectory.json", explain_and_lengthen)
    # Row 1, attempt 0: RubricGrader's artifact (in the trial and its projection); the
    # journal row carries a cost.
    for judged in (trial / index[2]["rollout_id"] / "artifacts", run / "artifacts/row_1_run_0"):
        judged.mkdir(parents=True, exist_ok=True)
        (judged / "rubric_judgement.json").write_text(
            json.dumps({"score": 1.0, "explanation": "50 is exactly ten times five"})
        )
    index[2]["cost_usd"] = 0.5
    write_jsonl(run / "index.jsonl", index)
    return evals


def cells(page: Any, key: str) -> dict[str, str]:
    """A table row's cells by column header."""
    values: dict[str, str] = page.evaluate(
        """key => {
            const heads = Array.from(document.querySelectorAll('#rows thead th'))
                .map(th => th.textContent);
            const tr = document.querySelector(`#rows tbody tr[data-key="${key}"]`);
            return Object.fromEntries(Array.from(tr.cells).map((td, i) => [heads[i], td.textContent]));
        }""",
        key,
    )
    return values


def test_the_table_shows_input_label_answer_explanation_and_cost(
    root: Path, watched: Watched
) -> None:
    page = watched.open(write_report_for_run(root / "reference-run"))
    heads = page.eval_on_selector_all("#rows thead th", "ths => ths.map(th => th.textContent)")
    assert heads[:8] == [
        "row",
        "attempt",
        "outcome",
        "reward",
        "input",
        "label",
        "final answer",
        "grader's explanation",
    ]
    assert "cost" in heads
    first = cells(page, "0.0")
    assert first["input"] == "What is 2 + 2?" and first["label"] == "4"
    # A long answer is one cut line in the cell, and the cell clips it to its width.
    assert first["final answer"].startswith("The sum is four.")
    assert len(first["final answer"]) == CELL_CHARS and first["final answer"].endswith("...")
    assert page.evaluate(
        "() => { const td = document.querySelector('#rows tr[data-key=\"0.0\"] td:nth-child(7)');"
        " return td.scrollWidth > td.clientWidth; }"
    )
    assert first["grader's explanation"] == "expected 4; the answer says four in words"
    assert first["cost"] == "$0.0125"
    second = cells(page, "1.0")
    assert second["grader's explanation"] == "50 is exactly ten times five"
    assert second["cost"] == "$0.5000"
    assert cells(page, "0.1")["final answer"] == "I am not sure"
    # Row 5 failed in the grader before any sample was written: its input is the dataset's.
    failed = cells(page, "5.1")
    assert failed["input"] == "make the workflow go boom" and failed["label"] == "0"
    assert failed["final answer"] == "" and failed["outcome"] == "errored"
    # The cost card adds both priced attempts.
    cards = page.inner_text("#cards")
    assert "COST" in cards.upper() and "$0.5125" in cards
    # The search box finds a row by its input.
    page.fill("#f-search", "boom")
    visible = page.eval_on_selector_all(
        "#rows tbody tr", "trs => trs.filter(tr => !tr.hidden).map(tr => tr.dataset.key)"
    )
    assert visible == ["5.0", "5.1"]
    # Sorting by the input column orders rows by their question.
    page.fill("#f-search", "")
    page.click("#rows th[data-sort=q_in]")
    inputs = page.eval_on_selector_all(
        "#rows tbody tr td:nth-child(5)", "tds => tds.map(td => td.textContent)"
    )
    assert inputs == sorted(inputs, key=str.lower)


def test_the_drawer_holds_the_full_input_answer_and_explanation(
    root: Path, watched: Watched
) -> None:
    page = watched.open(write_report_for_run(root / "reference-run"))
    page.click('#rows tbody tr[data-key="0.0"] td')
    detail = watched.drawer_text()
    assert "Row 0 · attempt 0" in detail
    assert page.inner_text("#detail pre.answer") == LONG_ANSWER
    assert page.inner_text("#detail pre.explanation") == (
        "expected 4; the answer says four in words"
    )
    assert page.inner_text("#detail pre.label") == "4"
    assert page.eval_on_selector_all("#detail .input pre", "ps => ps.map(p => p.textContent)") == [
        "You are a calculator.",
        "What is 2 + 2?",
    ]
    assert "cost $0.0125" in detail
    # A row without a sample: its input and label from the dataset, and its error.
    page.evaluate("location.hash = 'row=5.0'")
    page.wait_for_function("document.querySelector('#detail h3').textContent.includes('Row 5')")
    detail = watched.drawer_text()
    assert "make the workflow go boom" in detail and "from the dataset" in detail
    assert "grader_failed" in detail and "No trajectory" in detail
    assert page.inner_text("#detail pre.label") == "0"
    assert page.query_selector("#detail pre.answer") is None
    assert "Inputs from" in page.inner_text("#inputs-from")


def test_without_the_dataset_inputs_come_from_trajectories(
    root: Path, tmp_path: Path, watched: Watched
) -> None:
    """A moved run (no workspace around it) still shows what its trajectories hold."""
    moved = shutil.move(root / "reference-run", tmp_path / "elsewhere" / "reference-run")
    page = watched.open(write_report_for_run(Path(moved)))
    assert cells(page, "0.1")["input"] == "What is 2 + 2?"
    assert cells(page, "5.1")["input"] == ""
    page.evaluate("location.hash = 'row=5.1'")
    assert "Not known: no trajectory, and the dataset file was not found." in (
        watched.drawer_text()
    )
    assert "dataset file was not found" in page.inner_text("#inputs-from")


def _baseline(root: Path) -> Path:
    """A run where row 1 failed both attempts and row 2 passed both: 1 regressed, 2 improved."""
    baseline = writable_copy(root / "reference-run", root / "baseline")
    index = jsonl(baseline / "index.jsonl")
    index[2]["reward"] = index[3]["reward"] = 0.0
    index[4]["reward"] = 1.0
    write_jsonl(baseline / "index.jsonl", index)
    edit_json(
        baseline / "metrics.json",
        lambda m: m.update(summary=aggregate_metrics(index, 1.0)),
    )
    edit_json(baseline / "manifest.json", lambda m: m.update(run_name="baseline"))
    return baseline


def test_compare_view_puts_both_runs_answers_side_by_side(root: Path, watched: Watched) -> None:
    baseline = _baseline(root)
    path, comparison = write_report(root / "reference-run", baseline_dir=baseline)
    assert comparison is not None
    page = watched.open(path)
    rows = page.eval_on_selector_all(
        "#row-by-row tbody tr", "trs => trs.map(tr => [tr.dataset.cmp, tr.dataset.change])"
    )
    # Regressed rows first, then improved ones, then the rest by row.
    assert rows == [
        ["2", "regressed"],
        ["1", "improved"],
        ["0", "unchanged"],
        ["3", "unchanged"],
        ["4", "unchanged"],
        ["5", "unchanged"],
    ]
    first_row = page.inner_text('#row-by-row tr[data-cmp="1"]')
    assert "What is 10 * 5?" in first_row and "0/2 passed" in first_row
    assert "2/2 passed" in first_row
    # Only the changed rows.
    page.select_option("#f-change", "changed")
    shown = page.eval_on_selector_all(
        "#row-by-row tbody tr", "trs => trs.filter(tr => !tr.hidden).map(tr => tr.dataset.cmp)"
    )
    assert sorted(shown) == ["1", "2"]
    # Clicking a row opens both runs' attempts side by side.
    page.click('#row-by-row tr[data-cmp="1"] td')
    detail = watched.drawer_text()
    assert "Row 1 · both runs" in detail and "What is 10 * 5?" in detail
    assert page.evaluate("location.hash") == "#cmp=1"
    sides = page.eval_on_selector_all(
        "#detail .side",
        "ds => ds.map(d => [d.querySelector('h4').textContent,"
        " Array.from(d.querySelectorAll('.attempt .pill')).map(p => p.textContent),"
        " Array.from(d.querySelectorAll('pre.answer')).map(p => p.textContent),"
        " Array.from(d.querySelectorAll('pre.explanation')).map(p => p.textContent)])",
    )
    assert sides[0][0] == "baseline: baseline" and sides[1][0] == "current: reference-run"
    assert sides[0][1] == ["below threshold", "below threshold"]
    assert sides[1][1] == ["passed", "passed"]
    assert sides[0][2] == sides[1][2] == ["50", "50"]
    assert sides[1][3] == ["50 is exactly ten times five"]
    # Both columns sit next to each other, and "open" leads to the current attempt.
    left, right = page.eval_on_selector_all(
        "#detail .side", "ds => ds.map(d => d.getBoundingClientRect().left)"
    )
    assert right > left + 100
    page.click("#detail .side-a .attempt a")
    page.wait_for_function("location.hash === '#row=1.0'")
    assert "Row 1 · attempt 0" in watched.drawer_text()


def test_runs_index_lists_every_run_and_plots_the_pass_rate_over_time(
    root: Path, watched: Watched
) -> None:
    baseline = _baseline(root)
    edit_json(
        baseline / "metrics.json",
        lambda m: m["eval_run"].update(started_at="2026-11-20T08:00:00Z"),
    )
    write_report_for_run(root / "reference-run")  # the baseline has no report.html
    page = watched.open(write_index(root))
    runs = page.eval_on_selector_all(
        "#runs tbody tr", "trs => trs.map(tr => [tr.dataset.run, tr.cells[7].textContent])"
    )

    def rate(passed: int) -> str:
        low, high = wilson_interval(passed, 10)
        return f"{percent(passed / 10)} {percent(low)} – {percent(high)}"

    assert runs == [["reference-run", rate(4)], ["baseline", rate(3)]]
    assert page.eval_on_selector_all("#runs tbody tr td:first-child a", "as => as.length") == 1
    points = page.eval_on_selector_all(
        "svg[data-plot=runs-over-time] circle.point",
        "cs => cs.map(c => [c.querySelector('title').textContent, c.closest('a') !== null,"
        " Math.round(c.getBoundingClientRect().width)])",
    )
    assert [p[0].split(" · ")[0] for p in points] == ["baseline", "reference-run"]
    assert [p[1] for p in points] == [False, True]
    assert all(width > 4 for _, _, width in points)
    assert (
        page.eval_on_selector_all("svg[data-plot=runs-over-time] polyline.line", "ls => ls.length")
        == 1
    )
    # A point opens its run's report.
    page.click("svg[data-plot=runs-over-time] a")
    page.wait_for_url("**/reference-run/report.html")
    assert page.inner_text("h1") == "reference-run"


def test_report_latest_opens_the_newest_run(
    root: Path,
    watched: Watched,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    older = _baseline(root)
    edit_json(
        older / "metrics.json", lambda m: m["eval_run"].update(started_at="2026-01-01T00:00:00Z")
    )
    monkeypatch.chdir(root.parent.parent)
    assert main(["report", "latest"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == (root / "reference-run" / "report.html").resolve()
    page = watched.open(path)
    assert page.inner_text("h1") == "reference-run"
    assert main(["report", "--index"]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert index == (root / "runs.html").resolve()
    page = watched.open(index)
    assert page.eval_on_selector_all("#runs tbody tr", "trs => trs.length") == 2


def test_the_attempts_table_fits_a_1400_px_window(root: Path, browser: Any) -> None:
    """Every column, the last one included, is visible without scrolling sideways, with
    the explanation and cost columns both shown (issue 29, point 8)."""
    watched = Watched(browser, width=1400)
    try:
        page = watched.open(write_report_for_run(root / "reference-run"))
        widths = page.eval_on_selector(
            "#attempts .tablewrap", "w => [w.scrollWidth, w.clientWidth]"
        )
        headers = page.eval_on_selector_all("#rows thead th", "ths => ths.map(t => t.textContent)")
        assert "grader's explanation" in headers and "cost" in headers
        assert widths[0] <= widths[1], widths
        assert watched.problems == []
    finally:
        watched.context.close()
