"""A config none of whose items pytest selected (``-k``, ``--deselect``, ``--lf``) is no run of
the session: no run directory is left for it, no results table block, no next steps; a run
of it that the session resumed is left byte for byte as it was (plugin/session.py:
``EvalSession.drop_unselected``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import calc_rows, run_session, write_workspace

pytest_plugins = ["pytester"]

PLAIN = ("--osmosis-eval", "-p", "no:cacheprovider", "-p", "no:randomly")
XDIST = ("-n", "2")


def _two_configs(root: Path) -> None:
    write_workspace(root, name="wordcount")
    write_workspace(root, name="sentiment")


def _runs(root: Path) -> list[str]:
    evals = root / ".osmosis" / "evals"
    if not evals.is_dir():
        return []
    return sorted(p.name for p in evals.iterdir() if p.is_dir() and not p.name.startswith("."))


def _after_the_rows(result: pytest.RunResult) -> str:
    """What the session says once its rows ran: the results tables and the next steps
    (the start-up lines name every config: nothing is selected yet when they are written)."""
    lines = result.stdout.lines
    at = next(i for i, line in enumerate(lines) if line.startswith("=") and "osmosis" in line)
    return "\n".join(lines[at:])


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("workers", [(), XDIST], ids=["single", "xdist"])
@pytest.mark.parametrize(
    "select",
    [
        ("-k", "wordcount"),
        (
            "--deselect=configs/eval/sentiment.toml::row_0_run_0",
            "--deselect=configs/eval/sentiment.toml::row_1_run_0",
        ),
    ],
    ids=["k", "deselect"],
)
def test_a_config_with_nothing_selected_is_no_run_of_the_session(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    workers: tuple[str, ...],
    select: tuple[str, ...],
) -> None:
    _two_configs(pytester.path)
    result = run_session(pytester, *PLAIN, *workers, *select)
    result.assert_outcomes(passed=2, deselected=0 if workers else 2)
    runs = _runs(pytester.path)
    assert len(runs) == 1 and runs[0].startswith("wordcount"), runs
    out = _after_the_rows(result)
    assert f"= osmosis: {runs[0]} =" in out and f"{runs[0]}: report" not in out
    assert "report   pytest-osmosis report" in out  # its next steps are there
    assert "sentiment" not in out


@pytest.mark.parametrize("workers", [(), XDIST], ids=["single", "xdist"])
def test_k_matching_nothing_leaves_no_run_and_exits_5(
    pytester: pytest.Pytester, model_env: ModelServer, workers: tuple[str, ...]
) -> None:
    _two_configs(pytester.path)
    result = run_session(pytester, *PLAIN, *workers, "-k", "nothingmatches")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert _runs(pytester.path) == []
    assert "= osmosis" not in result.stdout.str()  # no table, no next steps
    assert model_env.requests_total == 1  # the preflight's alone: no row ran


@pytest.mark.parametrize("workers", [(), XDIST], ids=["single", "xdist"])
def test_a_resumed_run_of_an_unselected_config_is_left_as_it_was(
    pytester: pytest.Pytester, model_env: ModelServer, workers: tuple[str, ...]
) -> None:
    _two_configs(pytester.path)
    named = (*PLAIN, "--osmosis-name", "nightly")
    first = run_session(pytester, *named, "-k", "sentiment and row_0_")
    first.assert_outcomes(passed=1, deselected=3)
    assert _runs(pytester.path) == ["nightly-sentiment"]  # one of its two rows recorded
    sentiment = pytester.path / ".osmosis" / "evals" / "nightly-sentiment"
    before = _tree(sentiment)
    second = run_session(pytester, *named, *workers, "-k", "wordcount")
    second.assert_outcomes(passed=2, deselected=0 if workers else 2)
    assert _runs(pytester.path) == ["nightly-sentiment", "nightly-wordcount"]
    assert _tree(sentiment) == before
    out = _after_the_rows(second)
    assert "nightly-sentiment =" not in out and "resume   " not in out
    if not workers:  # xdist's controller learns what was selected as its workers finish
        assert "(1 recorded earlier)" not in second.stdout.str()  # progress counts it not


def test_last_failed_runs_only_the_config_that_failed(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """``--lf`` after a session where only wordcount failed selects none of sentiment's:
    its finished run, resumed by name, is left as it was."""
    write_workspace(pytester.path, name="sentiment")
    rows = calc_rows([("What is 2 + 2?", "4"), ("What is 1 + 1?", "2", "workflow_raise")])
    write_workspace(pytester.path, name="wordcount", dataset="mixed", rows=rows)
    named = ("--osmosis-eval", "-p", "no:randomly", "--osmosis-name", "nightly")
    pytester.runpytest(*named).assert_outcomes(passed=3, errors=1)
    assert _runs(pytester.path) == ["nightly-sentiment", "nightly-wordcount"]
    sentiment = pytester.path / ".osmosis" / "evals" / "nightly-sentiment"
    before = _tree(sentiment)
    again = pytester.runpytest(*named, "--osmosis-retry-failed", "--lf")
    again.assert_outcomes(errors=1)  # the errored row ran again
    assert _runs(pytester.path) == ["nightly-sentiment", "nightly-wordcount"]
    assert _tree(sentiment) == before
    out = _after_the_rows(again)
    assert "= osmosis: nightly-wordcount =" in out and "nightly-sentiment =" not in out
