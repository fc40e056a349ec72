"""The HTML report in a real headless Chromium: plots, filters, sorting, the drawer.

The browser is Debian's chromium driven by Playwright (``chromium_page``): no download,
a fresh context per test, every request a page makes must be file: or data:, and console
errors or uncaught exceptions fail the test. The report is the official SDK's reference
run (see test_report_views.py for the per-attempt columns, the comparison and runs.html).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from chromium_page import Watched, needs_chromium
from reference_paths import REFERENCE_RUN, writable_copy

from pytest_osmosis.report import write_report_for_run

REFERENCE = REFERENCE_RUN
pytest_plugins = ["chromium_page"]
pytestmark = [
    needs_chromium,
    pytest.mark.skipif(not REFERENCE.is_dir(), reason="reference run not available"),
]


@pytest.fixture
def report(tmp_path: Path) -> Path:
    return write_report_for_run(writable_copy(REFERENCE, tmp_path / "evals" / "reference-run"))


def index_of(report: Path) -> list[dict[str, Any]]:
    lines = (report.parent / "index.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def keys(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['row_index']}.{r['run_index']}" for r in rows]


VISIBLE_KEYS = (
    "() => Array.from(document.querySelectorAll('#rows tbody tr'))"
    ".filter(tr => !tr.hidden && tr.offsetParent !== null).map(tr => tr.dataset.key)"
)


def test_page_loads_cleanly_and_draws_the_plots(report: Path, watched: Watched) -> None:
    page = watched.open(report)
    assert page.get_attribute("body", "data-ready") == "1"
    plots = page.evaluate(
        "() => Array.from(document.querySelectorAll('svg.plot')).map(svg => {"
        " const box = svg.getBoundingClientRect();"
        " return [svg.dataset.plot, svg.querySelectorAll('rect.bar, circle.point').length,"
        " Math.round(box.width), Math.round(box.height)]; })"
    )
    assert [p[0] for p in plots] == ["reward", "pass-at-k", "per-row", "duration"]
    for name, marks, width, height in plots:
        assert marks > 0, name
        assert width > 200 and height > 100, (name, width, height)
    assert plots[1][1] == 2  # pass@k has one point per k: n = 2 here
    assert plots[2][1] == 6  # the per-row chart has one bar per dataset row
    assert page.evaluate(VISIBLE_KEYS) == keys(index_of(report))
    assert page.inner_text("#count") == "12 of 12 attempts shown"


def test_filters_show_exactly_the_matching_attempts(report: Path, watched: Watched) -> None:
    index = index_of(report)
    page = watched.open(report)
    page.select_option("#f-outcome", "failed")
    failed = [r for r in index if r["status"] == "failed"]
    assert len(failed) == 4
    assert page.evaluate(VISIBLE_KEYS) == keys(failed)
    page.select_option("#f-error", "grader_failed")
    assert page.evaluate(VISIBLE_KEYS) == keys(
        [r for r in failed if r["error_type"] == "grader_failed"]
    )
    page.select_option("#f-error", "")
    page.select_option("#f-outcome", "")
    page.fill("#f-max", "0.5")
    assert page.evaluate(VISIBLE_KEYS) == keys(
        [r for r in index if r.get("reward") is not None and r["reward"] <= 0.5]
    )
    page.fill("#f-max", "")
    page.fill("#f-search", index[6]["rollout_id"][:10])
    assert page.evaluate(VISIBLE_KEYS) == keys([index[6]])
    page.fill("#f-search", "")
    # Sorting by reward, descending on the second click, keeps every row.
    page.click("th[data-sort=reward]")
    page.click("th[data-sort=reward]")
    shown = page.evaluate(VISIBLE_KEYS)
    rewards = {f"{r['row_index']}.{r['run_index']}": r.get("reward") for r in index}
    graded = [rewards[k] for k in shown if rewards[k] is not None]
    assert graded == sorted(graded, reverse=True)
    assert sorted(shown) == sorted(rewards)


def test_clicking_an_attempt_opens_its_trajectory(report: Path, watched: Watched) -> None:
    row = index_of(report)[0]
    trajectory = json.loads(
        (report.parent / "rollout_trials" / row["rollout_id"] / "trajectory.json").read_text()
    )
    page = watched.open(report)
    assert page.is_hidden("#detail")
    page.click('#rows tbody tr[data-key="0.0"] td')
    detail = watched.drawer_text()
    assert "Row 0 · attempt 0" in detail
    steps = page.eval_on_selector_all("#detail .step pre.msg", "ps => ps.map(p => p.textContent)")
    assert steps == [s["message"] for s in trajectory["steps"]]
    assert "12 prompt / 3 completion" in detail
    assert "answer.txt" in detail and "logs/trace.json" in detail
    assert page.evaluate("location.hash") == "#row=0.0"
    box = page.locator("#detail").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 300
    # A failed attempt without a trajectory says so, and names its error type.
    page.evaluate("location.hash = 'row=5.1'")
    page.wait_for_function("document.querySelector('#detail h3').textContent.includes('Row 5')")
    detail = watched.drawer_text()
    assert "Row 5 · attempt 1" in detail
    assert "grader_failed" in detail and "No trajectory" in detail
    page.keyboard.press("Escape")
    assert page.is_hidden("#detail")
    assert page.evaluate("location.hash") == ""


def test_a_deep_link_screenshot(report: Path, browser: Any) -> None:
    """The way docs/*.png are made (docs/make_screenshot.py): a deep link, a PNG."""
    watched = Watched(browser, width=1400, height=1000)
    try:
        page = watched.open(report, "#row=0.0")
        page.wait_for_selector("#detail:not([hidden])")
        shot = page.screenshot()
    finally:
        watched.context.close()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", shot[16:24]) == (1400, 1000)
    assert watched.problems == []
