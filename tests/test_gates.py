"""Issue 17's gates, on both sides of their thresholds, in one process and under ``-n 2``:
per-row verdicts from n attempts (``--osmosis-row-pass``, pass^k, flaky rows), a regression
gate against a baseline run, and budgets that stop a session early."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import CALC_ROLLOUT, HELD, calc_rows, write_workspace

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
def served(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
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
        served,
        xdist,
        "--osmosis-rows",
        "0-2",
        "--osmosis-row-pass",
        row_pass,
        "--osmosis-name",
        "r",
    )
    assert result.ret == code, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "pass@k     pass@1 83.3%  pass@2 100.0%",
            "pass^k     pass^1 83.3%  pass^2 66.7%",
            "rows       2 passed every attempt, 1 flaky (row 2), 0 passed none",
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


# -- a regression gate against a baseline run -----------------------------------------

# Ten rows that pass; eight of them fail while CALC_BREAK is set (10/10 -> 2/10).
BASELINE_ROWS = calc_rows(
    [(f"What is {i} + {i}?", str(2 * i), "" if i < 2 else "breakable") for i in range(10)]
)


# 2/10 against 10/10: -80.0 pp. Unpaired: 95% CI -94.3 to -38.4 pp (Newcombe). Paired:
# 8 rows worse, none better, p = 2 / 2**8 = 0.008.
PAIRED_LINE = (
    "8 rows worse, 0 better of 10, two-sided p = 0.008 (exact McNemar *); a drop of more than "
    "{} pp is {} *"
)


@pytest.mark.parametrize(
    ("xdist", "test", "maximum", "code", "line"),
    [
        (False, "unpaired", "0.38", 1, "95% CI -94.3 pp to -38.4 pp (Newcombe, * is shown"),
        (False, "unpaired", "0.39", 0, "95% CI -94.3 pp to -38.4 pp (Newcombe, * is not shown"),
        (False, "paired", "0.79", 1, PAIRED_LINE.format("79.0", "shown")),
        (False, "paired", "0.8", 0, PAIRED_LINE.format("80.0", "not shown")),
        (True, "paired", "0.79", 1, PAIRED_LINE.format("79.0", "shown")),
        (True, "paired", "0.8", 0, PAIRED_LINE.format("80.0", "not shown")),
    ],
)
def test_regression_gate_against_a_baseline(
    served: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    xdist: bool,
    test: str,
    maximum: str,
    code: int,
    line: str,
) -> None:
    write_workspace(served.path, rows=BASELINE_ROWS, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 0
    monkeypatch.setenv("CALC_BREAK", "1")
    result = _run(
        served,
        xdist,
        "--osmosis-name",
        "pr",
        "--osmosis-baseline",
        "main",
        "--osmosis-max-regression",
        maximum,
        "--osmosis-gate-test",
        test,
    )
    assert result.ret == code, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"*osmosis gate {'PASSED' if code == 0 else 'FAILED'}*",
            "pr: against baseline main on the 10 rows both scored: pass rate 20.0% (2 passed / "
            "10 attempts not skipped), baseline 100.0% (10 passed / 10 attempts not skipped): "
            "-80.0 pp",
            f"  deciding: {test} test: {line}",
            "  rows that passed in the baseline and fail now: 2, 3, 4, 5, 6, 7, 8, 9",
        ]
    )


def test_a_baseline_that_measured_something_else_is_refused_in_one_line(
    served: pytest.Pytester,
) -> None:
    write_workspace(served.path, rows=BASELINE_ROWS, rollout_source=ROLLOUT)
    assert served.runpytest(*BASE, "--osmosis-name", "main").ret == 0
    gate = ("--osmosis-baseline", "main", "--osmosis-max-regression", "0.1")
    result = served.runpytest(*BASE, "--osmosis-name", "pr", "--osmosis-n", "2", *gate)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --osmosis-baseline main: not comparable with run pr: n 2 (baseline 1)"]
    )
    assert not _run_dir(served, "pr").exists()  # refused before any row
    # Another selection is compared on the rows both runs have, and says so.
    fewer = served.runpytest(*BASE, "--osmosis-name", "pr", "--osmosis-rows", "0-4", *gate)
    assert fewer.ret == 0, fewer.stdout.str()
    fewer.stdout.fnmatch_lines(
        [
            "  rows: 5 rows compared by content (prompt, label, metadata); "
            "5 removed (rows 5, 6, 7, 8, 9)",
            "  differs from the baseline: row selection 0-4 (baseline 0-9)",
        ]
    )
    served.run("rm", "-rf", str(_run_dir(served, "pr")))
    by_path = served.runpytest(
        *BASE, "--osmosis-name", "pr", "--osmosis-baseline", str(_run_dir(served, "main")), "-q"
    )
    assert by_path.ret == 0  # a run directory names a baseline too; no gate: no verdict
    missing = served.runpytest(*BASE, *gate[:1], "nope", *gate[2:])
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: --osmosis-baseline: run 'nope' not found *"])
    alone = served.runpytest(*BASE, "--osmosis-max-regression", "0.1")
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines(["ERROR: --osmosis-max-regression: needs --osmosis-baseline RUN"])


# -- budgets that stop early ------------------------------------------------------------

# Rows the stub model answers at once (HELD only names them for the tests below).
HELD_ROWS = calc_rows(
    [("What is 1 + 1?", "2")] + [(f"What is {i} {HELD}", str(i + 100)) for i in range(1, 8)]
)


def _journalled(run_dir: Path) -> int:
    return len((run_dir / "events.jsonl").read_text().splitlines())


@pytest.mark.bridge_placements
# Two sessions, each up to minutes on a loaded machine under -n 2 (a hang guard, no budget).
@pytest.mark.timeout(900)
@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
@pytest.mark.parametrize(
    ("budget", "spent"),
    [
        (("--osmosis-max-tokens", "1"), "* tokens of --osmosis-max-tokens 1"),
        (
            ("--osmosis-model", "openai/gpt-4o-mini", "--osmosis-max-cost", "0.000001"),
            "$0.00000* of --osmosis-max-cost $0.000001",
        ),
    ],
    ids=["tokens", "cost"],
)
def test_a_spent_budget_stops_new_rows_and_the_run_resumes(
    served: pytest.Pytester, xdist: bool, budget: tuple[str, ...], spent: str
) -> None:
    """Every row spends more than the budget, and the first row runs alone (nothing is
    known of a row's spend before one is recorded), so exactly one row runs per session,
    whichever row (and, under xdist, whichever worker) takes the first ticket. (The test
    once held every row but row 0 at the model server: under xdist a held row could take
    the first ticket and the session then waited for the stub's hold, not for us.)"""
    write_workspace(served.path, rows=HELD_ROWS)
    run_dir = _run_dir(served, "b")
    result = _run(served, xdist, "--osmosis-name", "b", *budget)
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"*Interrupted: osmosis: budget spent ({spent}): rows in flight finished, "
            "rows not started stay pending; run the same command again to resume*"
        ]
    )
    assert _journalled(run_dir) == 1
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    assert metrics["summary"]["total_samples"] == 1
    # The same command again resumes: each session spends its own budget, on one new row.
    again = _run(served, xdist, "--osmosis-name", "b", *budget)
    assert again.ret == pytest.ExitCode.INTERRUPTED, again.stdout.str()
    assert _journalled(run_dir) == 2, again.stdout.str()


# Twelve rows that each spend the same (6 tokens): budgets of about three rows, four in flight.
ALIKE_ROWS = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(10, 22)])
TRIALS = 3


@pytest.mark.bridge_placements
@pytest.mark.timeout(900)
@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
@pytest.mark.parametrize(
    ("budget", "delay"),
    [
        (("--osmosis-max-tokens", "20"), 0.0),
        (("--osmosis-max-tokens", "20"), 0.2),
        (("--osmosis-model", "openai/gpt-4o-mini", "--osmosis-max-cost", "0.000004"), 0.0),
    ],
    ids=["tokens-fast-model", "tokens-slow-model", "cost-fast-model"],
)
def test_a_budget_overshoots_by_at_most_one_rows_spend(
    served: pytest.Pytester, model_server: Any, xdist: bool, budget: tuple[str, ...], delay: float
) -> None:
    """Rows start only while the spend plus a reserve for each row in flight stays below the
    budget; the stop line and the results table say the final spend, metrics.json's."""
    write_workspace(served.path, rows=ALIKE_ROWS)
    model_server.delay = delay
    tokens_budget = budget[0] == "--osmosis-max-tokens"
    limit = float(budget[-1])
    for trial in range(TRIALS):
        name = f"b{trial}"
        result = _run(served, xdist, "--osmosis-name", name, "--osmosis-concurrency", "4", *budget)
        assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
        rows = [json.loads(line) for line in (_run_dir(served, name) / "events.jsonl").open()]
        assert 1 <= len(rows) < len(ALIKE_ROWS)
        if tokens_budget:
            spends = [int(row["tokens"]) for row in rows]
            spent = f"{sum(spends)} tokens of --osmosis-max-tokens 20"
            metrics = json.loads((_run_dir(served, name) / "metrics.json").read_text())
            assert metrics["summary"]["tokens_used"] == sum(spends)
        else:
            doc = json.loads((_run_dir(served, name) / ROW_METRICS_FILENAME).read_text())
            spends = list(doc["cost_usd_by_rollout"].values())
            assert doc["cost_usd"] == pytest.approx(sum(spends))
            spent = f"${sum(spends):.6f} of --osmosis-max-cost $0.000004"
        assert sum(spends) >= limit  # the budget was spent ...
        assert sum(spends) - limit <= max(spends)  # ... and overshot by one row's spend at most
        result.stdout.fnmatch_lines(
            [
                f"budget     spent: {spent} (this session)",
                f"*Interrupted: osmosis: budget spent ({spent}): rows in flight finished, "
                "rows not started stay pending; run the same command again to resume*",
            ]
        )


@pytest.mark.bridge_placements
@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
def test_budgets_not_spent_run_every_row_and_show_the_cost(
    served: pytest.Pytester, xdist: bool
) -> None:
    write_workspace(served.path, rows=HELD_ROWS[:3])
    result = _run(
        served,
        xdist,
        "--osmosis-name",
        "b",
        "--osmosis-model",
        "openai/gpt-4o-mini",
        "--osmosis-max-tokens",
        "100000",
        "--osmosis-max-cost",
        "1",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["tokens     * cost $0.0000* duration *"])
    assert "budget spent" not in result.stdout.str()
    doc = json.loads((_run_dir(served, "b") / ROW_METRICS_FILENAME).read_text())
    assert 0 < doc["cost_usd"] < 0.001
    assert len(doc["cost_usd_by_rollout"]) == 3
    from pytest_osmosis.results.run_reader import load_run

    # The report's per-attempt cost reads the rows' cost_usd, which load_run fills from it.
    rows = load_run(_run_dir(served, "b"))["rows"]
    assert [row["cost_usd"] for row in rows] == [
        doc["cost_usd_by_rollout"][row["rollout_id"]] for row in rows
    ]


@pytest.mark.bridge_placements
def test_an_attempt_without_a_priced_call_has_an_unknown_cost_everywhere(
    served: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """Row 3 raises before any model call: its cost is unknown, not $0, and the results
    table, the progress line, ``info`` and the report's cost card say so in the same words."""
    from pytest_osmosis.cli import main

    rows = calc_rows([("What is 2 + 2?", "4"), ("What is 3 + 3?", "6"), ("What is 4 + 4?", "8")])
    write_workspace(
        served.path, rows=[*rows, *calc_rows([("What is 1 + 1?", "2", "workflow_raise")])]
    )
    args = ("--osmosis-name", "c", "--osmosis-report", "--osmosis-progress", "log")
    result = served.runpytest(*BASE, *args, "--osmosis-model", "openai/gpt-4o-mini")
    doc = json.loads((_run_dir(served, "c") / ROW_METRICS_FILENAME).read_text())
    known = [cost for cost in doc["cost_usd_by_rollout"].values() if cost is not None]
    assert len(known) == 3 and len(doc["cost_usd_by_rollout"]) == 4
    words = f"${sum(known):.6f} for 3 of 4 priced attempts"
    result.stdout.fnmatch_lines(
        [f"*4/4 attempts done*; cost {words}; *", f"tokens * cost {words} *"]
    )
    report = (_run_dir(served, "c") / "report.html").read_text()
    assert f'<div class="sub">{words}; ' in report
    capsys.readouterr()
    assert main(["info", str(_run_dir(served, "c"))]) == 0
    assert re.search(rf"^  Cost +{re.escape(words)}$", capsys.readouterr().out, re.M)
    # A model without a price: nothing was priced, so every surface says unknown.
    unpriced = served.runpytest(*BASE, "--osmosis-name", "u", "--osmosis-report")
    unpriced.stdout.fnmatch_lines(["tokens * cost unknown *"])
    assert "$" not in unpriced.stdout.str()
    report = (_run_dir(served, "u") / "report.html").read_text()
    assert '<div class="label">Cost</div><div class="value ">unknown</div>' in report
    assert main(["info", str(_run_dir(served, "u"))]) == 0
    assert re.search(r"^  Cost +unknown$", capsys.readouterr().out, re.M)


@pytest.mark.bridge_placements
def test_a_cost_budget_for_a_model_without_a_price_is_refused_at_start(
    served: pytest.Pytester,
) -> None:
    write_workspace(served.path, rows=HELD_ROWS[:1])
    result = served.runpytest(*BASE, "--osmosis-max-cost", "1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --osmosis-max-cost: model 'openai/test-model' has no price in LiteLLM's "
            "local cost map, so a cost budget cannot be kept (use --osmosis-max-tokens)"
        ]
    )
    bad = served.runpytest(*BASE, "--osmosis-max-tokens", "0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--osmosis-max-tokens: must be a positive whole number*"])


# -- the pieces, without a session ---------------------------------------------------------


def test_pass_hat_k_row_classes_and_the_document() -> None:
    from pytest_osmosis.core.outcome import row_class, row_passes
    from pytest_osmosis.results.metrics import pass_at_k, pass_hat_k
    from pytest_osmosis.results.row_metrics import row_metrics

    # 2 of 3 attempts pass: pass^2 = C(2,2)/C(3,2) = 1/3, pass@2 = 1.
    assert pass_hat_k(attempts=3, passes=2, k=2) == pytest.approx(1 / 3)
    assert pass_at_k(attempts=3, passes=2, k=2) == 1.0
    assert pass_hat_k(attempts=3, passes=1, k=2) == 0.0
    assert pass_hat_k(attempts=3, passes=3, k=3) == 1.0
    assert [row_class(p, 3) for p in (3, 2, 0)] == ["passed", "flaky", "failed"]
    assert row_class(0, 0) is None  # every attempt skipped: no class
    assert row_passes(2, 3, 2) and not row_passes(2, 3, None) and not row_passes(0, 0, 1)
    doc = row_metrics(
        {0: (3, 3), 1: (2, 3), 5: (0, 3), 7: (0, 0)},
        n=3,
        row_pass=(2, 3),
        costs={"a": 0.5, "b": None},
    )
    assert doc["rows"] == {"passed": 1, "flaky": 1, "failed": 1}
    assert doc["flaky_rows"] == [1]
    assert doc["skipped_rows"] == [7]  # every attempt skipped: no class, still a row
    assert doc["pass_hat_k"] == [
        {"k": 1, "value": pytest.approx(5 / 9)},
        {"k": 2, "value": pytest.approx((1 + 1 / 3 + 0) / 3)},
    ]
    assert doc["row_pass"] == {"k": 2, "n": 3, "passed": 2, "failed": 1}
    assert doc["cost_usd"] is None  # one attempt without a price: the run's cost is unknown
    assert row_metrics({0: (1, 1)}, n=1, costs={"a": 0.25, "b": 0.5})["cost_usd"] == 0.75
    assert "pass_hat_k" not in row_metrics({0: (1, 1)}, n=1)


@pytest.mark.parametrize(
    ("flag", "text", "message"),
    [
        ("row_pass", "2", "--osmosis-row-pass: must be k/n with 1 <= k <= n (e.g. 2/3), got '2'"),
        (
            "row_pass",
            "0/3",
            "--osmosis-row-pass: must be k/n with 1 <= k <= n (e.g. 2/3), got '0/3'",
        ),
        (
            "max_regression",
            "1.5",
            "--osmosis-max-regression: must be a number from 0 to 1, got '1.5'",
        ),
        ("max_cost", "-1", "--osmosis-max-cost: must be a positive number, got '-1'"),
        ("max_cost", "inf", "--osmosis-max-cost: must be a positive number, got 'inf'"),
        (
            "max_tokens",
            "1.5",
            "--osmosis-max-tokens: must be a positive whole number of tokens, got '1.5'",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(flag: str, text: str, message: str) -> None:
    from pytest_osmosis import gate

    with pytest.raises(gate.GateOptionError) as raised:
        gate.gate_options({flag: text}.get)
    assert str(raised.value) == message
    assert gate.gate_options({"row_pass": "2/3"}.get).values["row_pass"] == (2, 3)
    assert gate.gate_options({"max_tokens": "5"}.get).budgeted
