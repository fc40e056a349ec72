"""``--osmosis-shard K/N`` and ``pytest-osmosis merge``: a CI matrix's shards joined into the
run one session would have written (shard.py, results/merge.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sdk_planner import sdk_judge
from workspaces import MIXED_ROWS, calc_rows, read_index, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")
EVALS = Path(".osmosis", "evals")

#: Ten rows, two attempts each: 20 work items, every outcome among them.
ROWS = MIXED_ROWS + calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(5)])


def _workspace(root: Path, rows: list[dict[str, Any]] = ROWS, n: int = 2) -> Path:
    return write_workspace(root, rows=rows, evaluation={"n": n})


def _run_shard(pytester: pytest.Pytester, shard: str, *more: str) -> Any:
    return pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "ci", "--osmosis-shard", shard, *more, *PLAIN
    )


def _items(run_dir: Path) -> set[tuple[int, int]]:
    return {(row["row_index"], row["run_index"]) for row in read_index(run_dir)}


def _merge(*args: str) -> tuple[int, str, str]:
    """``pytest-osmosis merge ...`` in process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from pytest_osmosis.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["merge", *args])
    return code, out.getvalue(), err.getvalue()


# -- selection -----------------------------------------------------------------------


def test_shards_split_the_items_and_each_writes_its_own_run(
    pytester: pytest.Pytester, model_env
) -> None:  # type: ignore[no-untyped-def]
    _workspace(pytester.path)
    seen: dict[int, set[tuple[int, int]]] = {}
    for k in (1, 2, 3):
        result = _run_shard(pytester, f"{k}/3")
        out = result.stdout.str()
        assert f"osmosis: shard {k} of 3 (--osmosis-shard)" in out  # the header
        assert f"osmosis: ci-shard-{k}-of-3 (shard {k} of 3)" in out  # the results table
        run_dir = pytester.path / EVALS / f"ci-shard-{k}-of-3"
        seen[k] = _items(run_dir)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["eval_run"]["status"] == "finished"  # its own share is complete
        assert metrics["summary"]["total_samples"] == len(seen[k])
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["provenance"]["shard"] == {"index": k, "count": 3}
        assert manifest["inputs"]["dataset"]["selected_source_rows"] == "0-9"  # before sharding
    everything = {(r, i) for r in range(10) for i in range(2)}
    assert set().union(*seen.values()) == everything
    assert sum(len(items) for items in seen.values()) == len(everything)  # no overlap
    assert all(4 <= len(items) <= 9 for items in seen.values()), seen  # roughly a third each
    # The two attempts of one row go to consecutive shards, never both to the same one.
    for items in seen.values():
        assert not any((r, 0) in items and (r, 1) in items for r in range(10))


def test_a_shard_keeps_its_rows_when_rows_are_added_elsewhere(
    pytester: pytest.Pytester,
) -> None:
    from pytest_osmosis.dataset import clear_dataset_cache
    from pytest_osmosis.shard import Shard
    from pytest_osmosis.workspace.plan import build_plan

    def owned(rows: list[dict[str, Any]]) -> set[str]:
        clear_dataset_cache()
        config = _workspace(pytester.path, rows)
        plan = build_plan(config, {}, None)
        plan.shard = Shard(2, 4)
        return {
            f"{rows[r]['user_prompt']}#{attempt}" for r, attempt in plan.work_keys()
        }

    before = owned(ROWS)
    added = calc_rows([(f"What is {i} * 7?", str(i * 7)) for i in range(40)])
    after = owned(added[:20] + ROWS + added[20:])  # rows before and after every old row
    assert before and before <= after


def test_plan_says_which_shard(pytester: pytest.Pytester) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--osmosis-plan", "--osmosis-shard", "2/4")
    out = result.stdout.str()
    assert "of 20, shard 2 of 4 (" in out, out
    assert "-shard-2-of-4 (new run)" in out


@pytest.mark.parametrize("value", ["0/4", "5/4", "2", "a/b", "1/0"])
def test_a_bad_shard_is_one_line(pytester: pytest.Pytester, value: str) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", f"--osmosis-shard={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--osmosis-shard:" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_the_ini_twin_shards(pytester: pytest.Pytester, model_env) -> None:  # type: ignore[no-untyped-def]
    _workspace(pytester.path)
    pytester.makeini("[pytest]\nosmosis_shard = 1/2\n")
    result = pytester.runpytest("--osmosis-eval", "--osmosis-name", "ini", *PLAIN)
    assert "osmosis: shard 1 of 2" in result.stdout.str()
    assert (pytester.path / EVALS / "ini-shard-1-of-2" / "metrics.json").is_file()
