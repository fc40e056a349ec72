"""``--osmosis-shard K/N`` and ``pytest-osmosis merge``: a CI matrix's shards joined into the
run one session would have written (shard.py, results/merge.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
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
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
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


def test_a_shard_with_items_left_is_not_finished(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    result = _run_shard(pytester, "1/2", "-k", "row_0_ or row_1_ or row_2_")
    run_dir = pytester.path / EVALS / "ci-shard-1-of-2"
    assert 0 < len(_items(run_dir)) < 10, result.stdout.str()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"
    _run_shard(pytester, "1/2")  # the rest of the shard: now it is finished
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"


def test_a_shard_keeps_its_rows_when_rows_are_added_elsewhere(
    pytester: pytest.Pytester,
) -> None:
    from pytest_osmosis.dataset import clear_dataset_cache
    from pytest_osmosis.dataset.shard import Shard
    from pytest_osmosis.workspace.plan import build_plan

    def owned(rows: list[dict[str, Any]]) -> set[str]:
        clear_dataset_cache()
        config = _workspace(pytester.path, rows)
        plan = build_plan(config, {}, None)
        plan.shard = Shard(2, 4)
        return {f"{rows[r]['user_prompt']}#{attempt}" for r, attempt in plan.work_keys()}

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


def test_the_ini_twin_shards(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    pytester.makeini("[pytest]\nosmosis_shard = 1/2\n")
    result = pytester.runpytest("--osmosis-eval", "--osmosis-name", "ini", *PLAIN)
    assert "osmosis: shard 1 of 2" in result.stdout.str()
    assert (pytester.path / EVALS / "ini-shard-1-of-2" / "metrics.json").is_file()


# -- merge -----------------------------------------------------------------------------


def _shards(pytester: pytest.Pytester, count: int, *more: str) -> list[Path]:
    for k in range(1, count + 1):
        _run_shard(pytester, f"{k}/{count}", *more)
    return [pytester.path / EVALS / f"ci-shard-{k}-of-{count}" for k in range(1, count + 1)]


def _comparable(run_dir: Path) -> list[dict[str, Any]]:
    """Index rows without what differs between two executions (ids, durations)."""
    return [
        {k: v for k, v in row.items() if k not in ("rollout_id", "duration_ms")}
        for row in read_index(run_dir)
    ]


def _summary_bytes(run_dir: Path) -> bytes:
    """metrics.json from its ``summary`` key on, as written (it follows ``eval_run``)."""
    raw = (run_dir / "metrics.json").read_bytes()
    assert list(json.loads(raw)) == ["eval_run", "summary"]
    return raw[raw.index(b'"summary"') :]


def test_merged_shards_equal_the_unsharded_run(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--osmosis-name", "whole", *PLAIN)
    whole = pytester.path / EVALS / "whole"
    shards = _shards(pytester, 3)
    code, out, err = _merge(*map(str, shards), "--output", str(pytester.path / "merged"))
    assert code == 0, err
    merged = pytester.path / "merged" / "ci"
    assert out.strip() == str(merged)
    assert _comparable(merged) == _comparable(whole)
    assert _summary_bytes(merged) == _summary_bytes(whole)
    assert (merged / "summary.jsonl").read_bytes() == (merged / "index.jsonl").read_bytes()
    assert json.loads((merged / "progress.json").read_text()) == json.loads(
        (whole / "progress.json").read_text()
    )
    mine = json.loads((merged / "manifest.json").read_text())
    theirs = json.loads((whole / "manifest.json").read_text())
    assert mine["inputs"] == theirs["inputs"] and mine["run_name"] == "ci"
    assert "shard" not in mine["provenance"]
    # Every record, trajectory, projection and artifact is the shard's, byte for byte.
    journal = [json.loads(line) for line in (merged / "events.jsonl").read_text().splitlines()]
    assert [(r["row_index"], r["run_index"]) for r in journal] == sorted(
        (r, i) for r in range(10) for i in range(2)
    )
    by_id = {row["rollout_id"]: shard for shard in shards for row in read_index(shard)}
    for row in read_index(merged):
        trial = Path("rollout_trials", row["rollout_id"])
        for name in ("trajectory.json", "artifacts/answer.txt"):
            source = by_id[row["rollout_id"]] / trial / name
            if source.exists():
                assert (merged / trial / name).read_bytes() == source.read_bytes()
        stem = f"row_{row['row_index']}_run_{row['run_index']}.json"
        if "trajectory_filename" in row:
            assert (merged / "trajectories" / stem).read_bytes() == (
                merged / trial / "trajectory.json"
            ).read_bytes()
    assert (merged / "osmosis_rows.json").read_bytes() == (whole / "osmosis_rows.json").read_bytes()
    verdict = sdk_judge(merged)
    assert verdict["accepted"], verdict
    # The unsharded command finds the merged run finished: nothing runs again.
    shutil.copytree(merged, pytester.path / EVALS / "ci")
    before = model_env.requests_total
    again = pytester.runpytest("--osmosis-eval", "--osmosis-name", "ci", *PLAIN)
    assert "already finished" in again.stdout.str()
    assert model_env.requests_total == before
    del result


def _refusal(*args: str) -> str:
    code, out, err = _merge(*args)
    assert code != 0 and not out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_merge_refuses_what_cannot_be_one_run(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    one, two = _shards(pytester, 2)
    out = str(pytester.path / "merged")
    # A shard missing: its items are listed, and the shard named.
    err = _refusal(str(one), "--output", out)
    missing = sorted(set(_items(two)))
    assert f"{len(missing)} items are in no shard (shard 2 of 2 not given): " in err
    assert f"row {missing[0][0]} run {missing[0][1]}" in err
    # The same shard twice.
    assert "shard given twice" in _refusal(str(one), str(one), "--output", out)
    # Shards of another count.
    other = _shards(pytester, 3)[0]
    assert "shards of different shard counts" in _refusal(str(one), str(other), "--output", out)
    # Different inputs: another n.
    _run_shard(pytester, "2/2", "--osmosis-n", "1", "--osmosis-name", "n1")
    n1 = pytester.path / EVALS / "n1-shard-2-of-2"
    err = _refusal(str(one), str(n1), "--output", out)
    assert "differs from shard 1 of 2" in err and "inputs.n" in err
    # Not a shard at all.
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "whole", *PLAIN)
    err = _refusal(str(one), str(pytester.path / EVALS / "whole"), "--output", out)
    assert "provenance.shard is missing" in err
    # An unfinished shard.
    partial = pytester.path / "partial"
    shutil.copytree(two, partial)
    metrics = json.loads((partial / "metrics.json").read_text())
    metrics["eval_run"]["status"] = "incomplete"
    (partial / "metrics.json").write_text(json.dumps(metrics))
    assert "is not finished (metrics.json status 'incomplete')" in _refusal(
        str(one), str(partial), "--output", out
    )
    # Overlapping items: a record of shard 1 also journalled in shard 2.
    overlap = pytester.path / "overlap"
    shutil.copytree(two, overlap)
    stolen = (one / "events.jsonl").read_text().splitlines()[0]
    with open(overlap / "events.jsonl", "a") as journal:
        journal.write(stolen + "\n")
    err = _refusal(str(one), str(overlap), "--output", out)
    record = json.loads(stolen)
    assert f"items are in more than one shard: row {record['source_row_index']} run " in err
    assert "(shards 1, 2)" in err
    # Nothing was written by any refusal; an existing target is not overwritten.
    assert not (pytester.path / "merged").exists()
    assert _merge(str(one), str(two), "--output", out)[0] == 0
    assert "exists" in _refusal(str(one), str(two), "--output", out)


def test_a_merged_run_of_a_sample_keeps_the_selection(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path, n=1)
    rows = ("--osmosis-rows", "1,3,5-8")
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "whole", *rows, *PLAIN)
    shards = _shards(pytester, 2, *rows)
    code, _, err = _merge(*map(str, shards), "--output", str(pytester.path / "m"), "--name", "x")
    assert code == 0, err
    merged = pytester.path / "m" / "x"
    assert _comparable(merged) == _comparable(pytester.path / EVALS / "whole")
    assert sdk_judge(merged)["accepted"]


def test_a_shard_under_xdist_runs_the_same_items(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path)
    _run_shard(pytester, "2/3")
    alone = _items(pytester.path / EVALS / "ci-shard-2-of-3")
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "--osmosis-name", "x", "--osmosis-shard", "2/3", "-n", "2", *PLAIN
    )
    assert "shard 2 of 3" in result.stdout.str()
    run_dir = pytester.path / EVALS / "x-shard-2-of-3"
    assert _items(run_dir) == alone
    assert json.loads((run_dir / "metrics.json").read_text())["eval_run"]["status"] == "finished"


def test_an_empty_shard_is_a_finished_run_and_merges(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _workspace(pytester.path, ROWS[:2], n=1)
    shards = []
    for k in range(1, 6):  # five shards of two items: three of them have none
        result = _run_shard(pytester, f"{k}/5")
        assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), result.outlines
        shards.append(pytester.path / EVALS / f"ci-shard-{k}-of-5")
        status = json.loads((shards[-1] / "metrics.json").read_text())["eval_run"]["status"]
        assert status == "finished"
    sizes = sorted(len(_items(s)) for s in shards)
    assert sum(sizes) == 2 and sizes[:3] == [0, 0, 0], sizes
    code, _, err = _merge(*map(str, shards), "--output", str(pytester.path / "m"))
    assert code == 0, err
    assert sdk_judge(pytester.path / "m" / "ci")["accepted"]
