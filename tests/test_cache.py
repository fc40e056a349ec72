"""The model-call cache (model/cache.py): real sessions against the loopback model server,
counting the requests it receives, and the SQLite file read back directly.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from workspaces import calc_rows, only_run_dir, read_index, write_workspace

from pytest_osmosis.model.cache import CACHE_FILENAME, cache_path

QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 * 5?", "15"), ("What is 7 - 2?", "5")]


def _cache_file(root: Path) -> Path:
    return cache_path(root / ".osmosis" / "evals")


def _entries(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT key, model, response, total_tokens FROM calls"))


def _results(root: Path) -> list[tuple[Any, ...]]:
    """What a run recorded per attempt, without what differs between runs (ids, time)."""
    return sorted(
        (r["row_index"], r["run_index"], r["status"], r["reward"], r["tokens"], r.get("error_type"))
        for r in read_index(only_run_dir(root))
    )


def _fresh_runs(root: Path) -> None:
    """Remove the run directories (not the cache beside them) for a second, fresh session."""
    import shutil

    output = root / ".osmosis" / "evals"
    for entry in output.iterdir():
        if entry.name != ".cache":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def test_a_second_run_with_use_calls_no_model_and_gives_the_same_results(
    pytester: pytest.Pytester, model_env
) -> None:  # type: ignore[no-untyped-def]
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS), evaluation={"n": 2})
    first = pytester.runpytest("--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider")
    first.assert_outcomes(passed=6)
    assert model_env.requests_total == 7  # the preflight's call, then one per attempt
    recorded = _results(pytester.path)
    assert len(_entries(_cache_file(pytester.path))) == 6  # 3 rows x 2 attempts, one call each
    assert not list(only_run_dir(pytester.path).rglob(CACHE_FILENAME))  # never in a run dir

    _fresh_runs(pytester.path)
    model_env.reset()
    second = pytester.runpytest("--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider")
    second.assert_outcomes(passed=6)
    assert model_env.requests_total == 0
    assert _results(pytester.path) == recorded  # rewards and tokens: the recorded usage
    metrics = json.loads((only_run_dir(pytester.path) / "metrics.json").read_text())
    assert metrics["summary"]["tokens_used"] == sum(r[4] for r in recorded)


def test_off_is_the_default_and_writes_no_cache(pytester: pytest.Pytester, model_env) -> None:  # type: ignore[no-untyped-def]
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / ".osmosis" / "evals" / ".cache").exists()


def test_replay_fails_exactly_the_row_whose_entry_is_gone_and_calls_no_model(
    pytester: pytest.Pytester, model_env
) -> None:  # type: ignore[no-untyped-def]
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS))
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "record", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=3)
    path = _cache_file(pytester.path)
    with sqlite3.connect(path) as conn:
        keys = {
            json.loads(response)["choices"][0]["message"]["content"]: key
            for key, response in conn.execute("SELECT key, response FROM calls")
        }
        conn.execute("DELETE FROM calls WHERE key = ?", (keys["15"],))  # row 1's only call
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2, failed=1)
    assert model_env.requests_total == 0
    result.stdout.fnmatch_lines(
        ["*cache_miss: no recorded answer for row 1 run 0 call 1 (openai/test-model)*"]
    )
    index = {r["row_index"]: r for r in read_index(only_run_dir(pytester.path))}
    assert index[1]["status"] == "failed" and index[1]["error_type"] == "cache_miss"
    assert [index[i]["status"] for i in (0, 2)] == ["success", "success"]


def test_replay_without_a_cache_stops_before_any_row(pytester: pytest.Pytester, model_env) -> None:  # type: ignore[no-untyped-def]
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--osmosis-cache replay: no model-call cache at *"])
    assert model_env.requests_total == 0


def test_bad_cache_options_are_one_line(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    result = pytester.runpytest("--osmosis-eval", "--osmosis-cache", "sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--osmosis-cache: expected one of off, use, record, replay, got 'sometimes'"]
    )
    result = pytester.runpytest("--osmosis-eval", "--osmosis-cache-max-age", "7 days")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--osmosis-cache-max-age: expected a positive age like*"])
