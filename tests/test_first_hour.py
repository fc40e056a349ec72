"""A new user's first hour (issue 29): nothing they meet on the README's path leaves them
stuck, misled or guessing. Each test here is one thing such a user ran into."""

from __future__ import annotations

from pathlib import Path

import pytest
from workspaces import calc_rows, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")


def _workspace(root: Path) -> Path:
    return write_workspace(root, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")]))


# -- 1: a workspace laid out as the README shows ---------------------------------------------


def test_a_workspace_without_the_ini_line_says_how_to_enable_the_plugin(
    pytester: pytest.Pytester,
) -> None:
    _workspace(pytester.path)
    for args in ((), ("--osmosis-plan",)):
        result = pytester.runpytest_subprocess(*args, *PLAIN)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
        hints = [line for line in result.stdout.lines if line.startswith("osmosis: ")]
        assert hints == [
            "osmosis: configs/eval/calc.toml is an eval config, but pytest-osmosis is not "
            "enabled: run pytest --osmosis-eval, or add `osmosis_eval = true` under [pytest] "
            "in pytest.ini"
        ]


def test_a_session_without_eval_configs_gets_no_hint(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest(*PLAIN)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not [line for line in result.stdout.lines if line.startswith("osmosis")]


def test_the_ini_line_makes_plain_pytest_collect(pytester: pytest.Pytester) -> None:
    _workspace(pytester.path)
    pytester.makeini("[pytest]\nosmosis_eval = true\n")
    result = pytester.runpytest("--co", "-q", *PLAIN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["configs/eval/calc.toml::row_1_run_0"])
