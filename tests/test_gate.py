"""The CI gate: the exit status follows the aggregate, on both sides of the threshold."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from model_server import ModelServer
from readme_examples import readme_example
from workspaces import calc_rows, write_workspace

# 3 of 5 attempts pass (60%); one row is a workflow error (20% error rate).
ROWS = calc_rows(
    [
        ("What is 2 + 2?", "4"),
        ("What is 3 + 3?", "6"),
        ("What is 4 + 4?", "8"),
        ("What is 3 * 5?", "16"),
        ("What is 1 + 1?", "2", "workflow_raise"),
    ]
)


@pytest.fixture
def workspace(pytester: pytest.Pytester, model_env: ModelServer) -> pytest.Pytester:
    write_workspace(pytester.path, rows=ROWS)
    return pytester


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (
            ("--osmosis-min-pass-rate", "0.6"),
            0,
            "*pass rate 60.0% (3 passed / 5 attempts not skipped) >= 60.0%*",
        ),
        (
            ("--osmosis-min-pass-rate", "0.61"),
            1,
            "*pass rate 60.0% (3 passed / 5 attempts not skipped) < 61.0%*",
        ),
        (
            ("--osmosis-min-pass-rate", "0.2", "--osmosis-gate-bound", "wilson"),
            0,
            "*Wilson lower bound 23.1% >= 20.0%*",
        ),
        (
            ("--osmosis-min-pass-rate", "0.5", "--osmosis-gate-bound", "wilson"),
            1,
            "*Wilson lower bound 23.1% < 50.0%*",
        ),
        (
            ("--osmosis-max-error-rate", "0.2"),
            0,
            "*error rate 20.0% (1 errored / 5 attempts not skipped) <= 20.0%*",
        ),
        (
            ("--osmosis-max-error-rate", "0.1"),
            1,
            "*error rate 20.0% (1 errored / 5 attempts not skipped) > 10.0%*",
        ),
    ],
)
def test_gate_decides_the_exit_status(
    workspace: pytest.Pytester, args: tuple[str, ...], code: int, line: str
) -> None:
    result = workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider", *args)
    assert result.ret == code
    result.stdout.fnmatch_lines([f"*osmosis gate {'PASSED' if code == 0 else 'FAILED'}*", line])
    result.assert_outcomes(passed=3, failed=1, errors=1)  # rows stay visible either way


@pytest.mark.parametrize(("rate", "code"), [("0.6", 0), ("0.7", 1)])
def test_gate_under_xdist(workspace: pytest.Pytester, rate: str, code: int) -> None:
    result = workspace.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "-n", "2", "--osmosis-min-pass-rate", rate
    )
    assert result.ret == code


def test_without_a_gate_pytest_semantics_hold(workspace: pytest.Pytester) -> None:
    result = workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "osmosis gate" not in result.stdout.str()


def test_ini_twin_and_the_gate_hook(workspace: pytest.Pytester) -> None:
    workspace.makeini("[pytest]\nosmosis_min_pass_rate = 0.9\n")
    assert workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider").ret == 1
    workspace.makeconftest(
        """
        def pytest_osmosis_gate(config, metrics, verdict):
            assert verdict["passed"] is False
            return metrics[0]["summary"]["passed"] >= 3
        """
    )
    result = workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*decided by pytest_osmosis_gate*"])


def test_junit_carries_reward_threshold_error_type_and_tokens(workspace: pytest.Pytester) -> None:
    result = workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "--junitxml=out.xml")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    cases = ET.parse(workspace.path / "out.xml").getroot().iter("testcase")
    props = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in cases
    }
    assert props["row_0_run_0"]["osmosis_reward"] == "1.0"
    assert props["row_0_run_0"]["osmosis_pass_threshold"] == "1.0"
    assert int(props["row_0_run_0"]["osmosis_tokens"]) > 0
    assert props["row_4_run_0"]["osmosis_error_type"] == "agent_error"
    assert "osmosis_reward" not in props["row_4_run_0"]


def test_bad_gate_values_are_usage_errors(workspace: pytest.Pytester) -> None:
    result = workspace.runpytest("--osmosis-eval", "--osmosis-min-pass-rate", "80")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--osmosis-min-pass-rate: must be a number from 0 to 1, got '80'*"]
    )


def token_rule(limit: int) -> str:
    """The README's gate rule: no run may spend more than *limit* tokens."""
    rule = readme_example(0)
    assert "LIMIT = 50_000\n" in rule
    return rule.replace("LIMIT = 50_000\n", f"LIMIT = {limit}\n")


@pytest.mark.parametrize(
    ("limit", "args", "code", "lines"),
    [
        # alone, the rule decides: failed rows no longer fail the session...
        (10**9, (), 0, ["*osmosis gate PASSED*", "*every run under 1000000000 tokens*"]),
        # ...and it fails a run the built-in rules pass; both say why
        (
            1,
            ("--osmosis-min-pass-rate", "0.6"),
            1,
            ["*osmosis gate FAILED*", "*pass rate 60.0%*>= 60.0%*", "*: more than 1 tokens*"],
        ),
    ],
)
def test_a_conftest_gate_rule_joins_the_built_in_gate(
    workspace: pytest.Pytester, limit: int, args: tuple[str, ...], code: int, lines: list[str]
) -> None:
    workspace.makeconftest(token_rule(limit))
    result = workspace.runpytest("--osmosis-eval", "-p", "no:cacheprovider", *args)
    assert result.ret == code
    result.stdout.fnmatch_lines(lines)
    result.assert_outcomes(passed=3, failed=1, errors=1)


def test_a_gate_rule_that_returns_no_verdict_fails_the_gate(workspace: pytest.Pytester) -> None:
    workspace.makeconftest("def pytest_osmosis_gate_verdict(config, runs):\n    return True\n")
    result = workspace.runpytest(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-min-pass-rate", "0.1"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*osmosis gate FAILED*",
            "*pytest_osmosis_gate_verdict returned bool True, not a pytest_osmosis.gate.Verdict or None*",
        ]
    )
