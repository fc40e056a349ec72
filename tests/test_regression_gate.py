"""Issue 25: a regression gate whose decisions are right.

A baseline must be whole and mean the same by "passed" (else one line, exit 4); both sides
are counted from their journals; rows are matched by content; the gate is paired (the
exact McNemar test on the rows that flipped, an exact paired permutation test for n > 1) unless ``--osmosis-gate-test
unpaired``; and it says, before the first row and in the verdict, what it can detect.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
from fractions import Fraction
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import CALC_ROLLOUT, calc_rows, write_workspace

# "breakable" rows fail while CALC_BREAK is set (the same dataset, a worse rollout); a "kill"
# row SIGKILLs the session while CALC_KILL is set (no cleanup, no metrics.json).
ROLLOUT = CALC_ROLLOUT.replace("import math\n", "import math\nimport os\nimport signal\n").replace(
    '        if do == "no_reward":',
    '        if do == "breakable" and os.environ.get("CALC_BREAK"):\n'
    "            ctx.set_reward(0.0)\n"
    "            return\n"
    '        if do == "kill" and os.environ.get("CALC_KILL"):\n'
    "            os.kill(os.getpid(), signal.SIGKILL)\n"
    '        if do == "no_reward":',
)
assert "CALC_BREAK" in ROLLOUT and "CALC_KILL" in ROLLOUT

BASE = ["--osmosis-eval", "-p", "no:cacheprovider"]

# The case: 30 rows; 15 pass (7 of them break), 12 fail (a wrong label), 3 skipped:
# 15/27 = 55.6% -> 8/27 = 29.6%, 7 rows worse and none better.
THIRTY = calc_rows(
    [(f"What is {i} + {i}?", str(2 * i), "breakable" if i < 7 else "") for i in range(15)]
    + [(f"What is {i} + {i}?", str(2 * i + 1)) for i in range(15, 27)]
    + [(f"What is {i} + {i}?", str(2 * i), "skip") for i in range(27, 30)]
)


@pytest.fixture
def served(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    for key in ("CALC_BREAK", "CALC_KILL", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(key, raising=False)
    return pytester


def _run_dir(pytester: pytest.Pytester, name: str) -> Path:
    return pytester.path / ".osmosis" / "evals" / name


def _gate(maximum: str, *more: str) -> tuple[str, ...]:
    return (
        "--osmosis-name",
        "pr",
        "--osmosis-baseline",
        "main",
        "--osmosis-max-regression",
        maximum,
        *more,
    )


def test_a_killed_baseline_is_refused(
    served: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = calc_rows(
        [(f"What is {i} + {i}?", str(2 * i), "kill" if i == 2 else "breakable") for i in range(12)]
    )
    write_workspace(served.path, rows=rows, rollout_source=ROLLOUT)
    monkeypatch.setenv("CALC_KILL", "1")
    killed = served.runpytest_subprocess(
        *BASE, "--osmosis-name", "main", "--osmosis-concurrency", "1"
    )
    assert killed.ret == -signal.SIGKILL, killed.stdout.str()
    main = _run_dir(served, "main")
    assert not (main / "metrics.json").exists()
    recorded = len((main / "events.jsonl").read_text().splitlines())
    assert recorded < 12
    monkeypatch.delenv("CALC_KILL")
    monkeypatch.setenv("CALC_BREAK", "1")  # every row fails now: 12 of 12
    result = served.runpytest_subprocess(*BASE, *_gate("0.3"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --osmosis-baseline main: not finished ({recorded} of 12 attempts "
            "recorded, no metrics.json): not a whole run"
        ]
    )
    assert not _run_dir(served, "pr").exists()  # refused before any row


def test_a_baseline_whose_journal_does_not_cover_its_selection_is_refused(
    served: pytest.Pytester,
) -> None:
    write_workspace(served.path, rows=THIRTY[10:22], rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 1
    journal = _run_dir(served, "main") / "events.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:10]))  # metrics.json still says finished
    result = served.runpytest(*BASE, *_gate("0.1"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --osmosis-baseline main: its journal does not cover its selection "
            "(10 of 12 attempts recorded): not a whole run"
        ]
    )


def test_a_baseline_at_another_pass_threshold_is_refused_unless_allowed(
    served: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = THIRTY[:12]
    write_workspace(served.path, rows=rows, rollout_source=ROLLOUT)
    # At threshold 2.0 nothing passes: today a 0 of 12 run passes against it.
    assert served.runpytest(*BASE, "--osmosis-name", "main", "--osmosis-pass-threshold", "2").ret
    monkeypatch.setenv("CALC_BREAK", "1")
    result = served.runpytest(*BASE, *_gate("0.1"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --osmosis-baseline main: pass_threshold 2 (this run 1) changes what "
            "passed means; --osmosis-baseline-allow pass_threshold compares anyway"
        ]
    )
    assert not _run_dir(served, "pr").exists()
    allowed = served.runpytest(*BASE, *_gate("0.1", "--osmosis-baseline-allow", "pass_threshold"))
    assert allowed.ret == 0, allowed.stdout.str()  # none worse: nothing passed at 2.0
    allowed.stdout.fnmatch_lines(
        [
            "*osmosis gate PASSED*",
            "pr: against baseline main on the 12 rows both scored: *",
            "  differs from the baseline: pass_threshold 2 (this run 1) changes what passed "
            "means, compared on purpose (--osmosis-baseline-allow)",
        ]
    )


def test_a_metrics_json_that_disagrees_with_its_journal_is_refused(
    served: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workspace(served.path, rows=THIRTY[10:22], rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 1
    path = _run_dir(served, "main") / "metrics.json"
    metrics = json.loads(path.read_text())
    assert metrics["summary"]["passed"] == 5
    metrics["summary"]["passed"] = 12  # a hand edit: "it all passed on main"
    metrics["summary"]["pass_rate"] = 1.0
    path.write_text(json.dumps(metrics, indent=2))
    monkeypatch.setenv("CALC_BREAK", "1")
    result = served.runpytest(*BASE, *_gate("0.1"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --osmosis-baseline main: metrics.json disagrees with its journal: passed 12 (journal 5)"
        ]
    )


# The deciding line and the other test's line, in the order the verdict prints them.
PAIRED = (
    "paired test: 7 rows worse, 0 better of 27, two-sided p = 0.016 (exact McNemar test on "
    "the rows whose verdict flipped); a drop of more than 5.0 pp is shown (fails when p < 0.05 "
    "and the drop exceeds 5.0 pp)"
)
UNPAIRED = (
    "unpaired test: 95% CI -47.7 pp to +0.3 pp (Newcombe, as if the runs were independent "
    "samples); a drop of more than 5.0 pp is not shown"
)


@pytest.mark.parametrize("test", ["paired", "unpaired"])
def test_seven_flips_in_thirty_rows_fail_the_paired_gate_and_pass_the_unpaired_one(
    served: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, test: str
) -> None:
    write_workspace(served.path, rows=THIRTY, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 1
    monkeypatch.setenv("CALC_BREAK", "1")
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = served.runpytest(*BASE, *_gate("0.05", "--osmosis-gate-test", test))
    paired = test == "paired"
    assert result.ret == (1 if paired else 0), result.stdout.str()
    deciding, other = (PAIRED, UNPAIRED) if paired else (UNPAIRED, PAIRED)
    power = [
        "*can detect: a drop of 25.1 pp or more with 80% power at 30 rows "
        "(paired test, at best: no row gets better)"
        if paired
        else "*can detect: a drop of 33.2 pp or more with 80% power at 30 rows "
        "(unpaired test, 30 attempts a side at a pass rate of 56%)",
        "*warning: --osmosis-max-regression 5.0 pp is below what 30 rows can detect; "
        f"catching a drop of 5.0 pp with 80% power takes at least {157 if paired else 1560} rows",
    ]
    result.stdout.fnmatch_lines(
        [
            "osmosis gate: pr against baseline main: 30 rows compared by content "
            "(prompt, label, metadata)",
            *power,  # before the first row
            "osmosis: row 0 run 0 below threshold *",
            f"*osmosis gate {'FAILED' if paired else 'PASSED'}*",
            "pr: against baseline main on the 27 rows both scored: pass rate 29.6% "
            "(8 passed / 27 attempts not skipped), baseline 55.6% (15 passed / 27 attempts not "
            "skipped): -25.9 pp",
            f"  deciding: {deciding}",
            f"  not deciding (--osmosis-gate-test): {other}",
            "  rows that passed in the baseline and fail now: 0, 1, 2, 3, 4, 5, 6",
            "  rows that failed in the baseline and pass now: none",
            "  rows: 30 rows compared by content (prompt, label, metadata)",
            *power,  # and in the verdict
        ]
    )
    text = summary.read_text()
    assert f"- deciding: {deciding}" in text
    assert "### Regressions against the baseline (7)" in text
    assert "- run pr, row 0, baseline 1/1, now 0/1" in text


def test_the_pull_request_markdown_says_what_the_paired_test_says(
    served: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_osmosis.report import compare_runs, comparison_markdown
    from pytest_osmosis.results.run_reader import load_run

    write_workspace(served.path, rows=THIRTY, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 1
    monkeypatch.setenv("CALC_BREAK", "1")
    assert served.runpytest(*BASE, "--osmosis-name", "pr").ret == 1
    comparison = compare_runs(load_run(_run_dir(served, "pr")), load_run(_run_dir(served, "main")))
    text = comparison_markdown(comparison)
    assert (
        "- **Paired** (27 rows both runs scored): **-25.9 pp**; 7 rows worse, 0 better of 27, "
        "two-sided p = 0.016 (exact McNemar test on the rows whose verdict flipped): "
        "**significant** at 0.05." in text
    )
    assert "(within noise; Newcombe, as if the runs were independent samples)" in text
    assert "#### Regressed rows (7)" in text


def test_rows_are_matched_by_content_over_an_edited_dataset(
    served: pytest.Pytester,
) -> None:
    # Rows pass and fail in turn: matched by position after an insertion, every row would
    # look flipped; matched by content, none is.
    rows = calc_rows([(f"What is {i} + {i}?", str(2 * i) if i % 2 else "wrong") for i in range(10)])
    write_workspace(served.path, rows=rows, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 1
    edited = (
        calc_rows([("What is 20 + 20?", "40")])  # added at the top
        + rows[:4]
        + [{**rows[4], "ground_truth": "8"}]  # row 4's label changed (now dataset row 5)
        + rows[5:9]  # row 9 removed
    )
    write_workspace(served.path, rows=edited, rollout_source=ROLLOUT)
    result = served.runpytest(*BASE, *_gate("0"))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*osmosis gate PASSED*",
            "pr: against baseline main on the 8 rows both scored: pass rate 50.0% "
            "(4 passed / 8 attempts not skipped), baseline 50.0% (4 passed / 8 attempts not "
            "skipped): +0.0 pp",
            "  deciding: paired test: 0 rows worse, 0 better of 8, two-sided p = 1.000 *",
            # The new row, and row 4 whose label changed (now dataset row 5); row 4 as it
            # was, and row 9, which is gone.
            "  rows: 8 rows compared by content (prompt, label, metadata); 2 added (rows 0, 5)"
            "; 2 removed (rows 4, 9)",
            "  differs from the baseline: dataset file (sha256) *",
        ]
    )


def test_a_row_edited_in_place_is_changed(served: pytest.Pytester) -> None:
    rows = THIRTY[:6]
    write_workspace(served.path, rows=rows, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 0
    edited = [*rows[:2], {**rows[2], "ground_truth": "nope"}, *rows[3:]]
    write_workspace(served.path, rows=edited, rollout_source=ROLLOUT)
    result = served.runpytest(*BASE, *_gate("0"))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["  rows: 5 rows compared by content (prompt, label, metadata); 1 changed (row 2)"]
    )


def test_a_baseline_with_no_row_in_common_is_refused(served: pytest.Pytester) -> None:
    write_workspace(served.path, rows=THIRTY[:5], rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 0
    write_workspace(served.path, rows=THIRTY[15:20], rollout_source=ROLLOUT)
    result = served.runpytest(*BASE, *_gate("0.1"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --osmosis-baseline main: no row in common with run pr (rows are matched "
            "by prompt, label and metadata; 5 baseline rows, 5 here)"
        ]
    )


def test_the_plan_says_what_the_gate_can_detect(served: pytest.Pytester) -> None:
    write_workspace(served.path, rows=THIRTY, rollout_source=ROLLOUT)
    result = served.runpytest(
        *BASE, "--osmosis-plan", "--osmosis-baseline", "main", "--osmosis-max-regression", "0.1"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "  gate  * can detect: a drop of 25.1 pp or more with 80% power at 30 rows "
            "(paired test, at best: no row gets better)",
            "  gate  * warning: --osmosis-max-regression 10.0 pp is below what 30 rows can "
            "detect; "
            "catching a drop of 10.0 pp with 80% power takes at least 78 rows",
        ]
    )


def _flips(worse: int, better: int, same: int = 0) -> list[Fraction]:
    """One attempt a row: -1 a row that now fails, +1 one that now passes, 0 the rest."""
    return [Fraction(-1)] * worse + [Fraction(1)] * better + [Fraction(0)] * same


def _by_enumeration(changes: list[Fraction]) -> float:
    """The permutation test's p by listing every sign flip (small m only)."""
    moved = [abs(c) for c in changes if c]
    observed = abs(sum(changes))
    flips = list(itertools.product((-1, 1), repeat=len(moved)))
    totals = [abs(sum(s * c for s, c in zip(signs, moved, strict=True))) for signs in flips]
    extreme = sum(1 for total in totals if total >= observed)
    return extreme / len(flips)


def test_the_paired_test_and_its_power_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_osmosis.baseline import match_rows
    from pytest_osmosis.report import stats
    from pytest_osmosis.report.stats import (
        fewest_flips,
        paired_power,
        permutation_test,
        size_needed,
        smallest_drop,
    )

    # One attempt a row: the exact McNemar test, 2 * P(binomial(b + c, 1/2) <= min(b, c)).
    assert permutation_test(_flips(7, 0, 20)) == 0.015625  # 2 / 2**7: the p
    assert permutation_test(_flips(0, 7)) == permutation_test(_flips(7, 0))
    assert permutation_test(_flips(3, 3)) == 1.0 and permutation_test([]) == 1.0
    assert permutation_test(_flips(10, 2)) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert permutation_test(_flips(1200, 1100)) < 0.05  # exact at thousands of rows
    # More attempts a row (and uneven ones, after skips): every sign flip, counted.
    rng = random.Random(25)
    for _ in range(20):
        changes = [
            Fraction(rng.randint(0, 3), 3) - Fraction(rng.randint(0, 2), rng.choice((2, 3)))
            for _ in range(rng.randint(1, 12))
        ]
        assert permutation_test(changes) == pytest.approx(_by_enumeration(changes))
    # Past EXACT_BITS the normal approximation stands in, close to the exact value.
    many = [Fraction(rng.randint(0, 3) - rng.randint(0, 3), 3) for _ in range(400)]
    exact = permutation_test(many)
    monkeypatch.setattr(stats, "EXACT_BITS", 8)
    assert permutation_test(many) == pytest.approx(exact, abs=0.01)
    assert fewest_flips() == 6  # 2 / 64 < 0.05 <= 2 / 32
    assert paired_power(30, 1.0) == 1.0 and paired_power(5, 1.0) == 0.0
    drop = smallest_drop(lambda d: paired_power(30, d))
    assert drop is not None and paired_power(30, drop) >= 0.8 > paired_power(30, drop - 0.001)
    rows = size_needed(lambda size: paired_power(size, 0.05))
    assert paired_power(rows, 0.05) >= 0.8 > paired_power(rows - 1, 0.05)
    match = match_rows({0: "a", 1: "b", 2: "c", 3: "a"}, {0: "a", 1: "x", 2: "b", 5: "a"})
    assert match.pairs == [(0, 0), (1, 2), (3, 5)]  # the 2nd copy of "a" with the 2nd
    assert (match.added, match.removed, match.changed) == ([2], [1], [])
    moved = match_rows({0: "a", 1: "z"}, {0: "a", 1: "b"})
    assert (moved.added, moved.removed, moved.changed) == ([], [], [1])


def test_the_report_puts_a_moved_row_beside_its_baseline_row() -> None:
    from pytest_osmosis.report.compare import side_by_side

    # A row inserted at the top: the baseline's rows 0 and 1 are the current 1 and 2, and the
    # baseline's row 9 is gone (the current file may hold another question at row 9).
    comparison = {
        "regressed": [],
        "improved": [],
        "only_in_current": [0, 9],
        "only_in_baseline": [9],
        "rows": {"moved": [[1, 0], [2, 1]], "removed": [9], "changed": []},
    }
    current = [{"r": r, "n": 0, "in": f"now {r}", "outcome": "passed"} for r in (0, 1, 2, 9)]
    baseline = [{"r": r, "n": 0, "in": f"then {r}", "outcome": "passed"} for r in (0, 1, 9)]
    rows = side_by_side(comparison, current, baseline)
    assert [(p["r"], p["change"], p["in"], len(p["a"]), len(p["b"])) for p in rows] == [
        (0, "only_current", "now 0", 1, 0),
        (1, "unchanged", "now 1", 1, 1),
        (2, "unchanged", "now 2", 1, 1),
        (9, "only_current", "now 9", 1, 0),
        ("9 (baseline)", "only_baseline", "then 9", 0, 1),
    ]
