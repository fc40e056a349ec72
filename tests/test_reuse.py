"""``--osmosis-reuse RUN``: items unchanged since RUN are recorded from it, not run again
(results/reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from test_shard import ROWS, _comparable, _summary_bytes
from workspaces import calc_rows, read_index, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")
EVALS = Path(".osmosis", "evals")


def _main_run(pytester: pytest.Pytester, rows: list[dict[str, Any]] = ROWS) -> Path:
    write_workspace(pytester.path, rows=rows, evaluation={"n": 2})
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "main", *PLAIN)
    main = pytester.path / EVALS / "main"
    assert (main / "osmosis_rows.json").is_file()
    return main


def _reuse(pytester: pytest.Pytester, *more: str) -> Any:
    return pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "pr", "--osmosis-reuse", "main", *more, *PLAIN
    )


def test_an_unchanged_run_is_recorded_from_the_earlier_one(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    main = _main_run(pytester)
    calls = model_env.requests_total
    result = _reuse(pytester)
    assert model_env.requests_total == calls  # not one model call, not even a preflight
    assert "reuse      20 reused, 0 run (from run 'main')" in result.stdout.str()
    pr = pytester.path / EVALS / "pr"
    assert _comparable(pr) == [{**row, "reused": True} for row in _comparable(main)]
    assert _summary_bytes(pr) == _summary_bytes(main)
    for row in read_index(pr):
        trial = Path("rollout_trials", row["rollout_id"])
        if "trajectory_filename" in row:
            assert (pr / trial / "trajectory.json").read_bytes() == (
                main / trial / "trajectory.json"
            ).read_bytes()
        answer = main / trial / "artifacts" / "answer.txt"
        if answer.exists():
            assert (pr / trial / "artifacts" / "answer.txt").read_bytes() == answer.read_bytes()
    assert sdk_judge(pr)["accepted"]
    # The same exit status as the run it reuses: rows failed there.
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_changed_and_added_rows_run_and_the_rest_is_reused(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _main_run(pytester)
    added = calc_rows([("What is 7 + 7?", "14"), ("What is 9 + 9?", "18")])
    changed = [dict(row) for row in ROWS]
    changed[6] = {"user_prompt": "What is 10 + 10?", "ground_truth": "20"}  # row 6 edited
    rows = added[:1] + changed + added[1:]  # every old row moves down by one
    write_workspace(pytester.path, rows=rows, evaluation={"n": 2})
    calls = model_env.requests_total
    result = _reuse(pytester)
    out = result.stdout.str()
    assert "reuse      18 reused, 6 run (from run 'main')" in out, out
    asked = [
        body["messages"][-1]["content"]
        for _, body in model_env.requests[calls:]
        if body.get("messages") and body["messages"][-1]["content"].startswith("What is")
    ]  # (besides the model's preflight): the new rows' and the edited row's attempts
    assert sorted(asked) == sorted(["What is 7 + 7?", "What is 9 + 9?", "What is 10 + 10?"] * 2)
    pr = pytester.path / EVALS / "pr"
    index = read_index(pr)
    ran = sorted((r["row_index"], r["run_index"]) for r in index if not r.get("reused"))
    assert ran == [(0, 0), (0, 1), (7, 0), (7, 1), (11, 0), (11, 1)]
    verdict = sdk_judge(pr)  # the moved rows' trajectories name their new row
    assert verdict["accepted"], verdict
    journal = [json.loads(line) for line in (pr / "events.jsonl").read_text().splitlines()]
    assert {r["row_index"]: r["source_row_index"] for r in journal} == {i: i for i in range(12)}


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        (("--osmosis-model", "openai/other-model"), "model_path"),
        (("--osmosis-n", "3"), None),  # n is no input of an item: attempts 0 and 1 are reused
    ],
)
def test_a_different_model_runs_everything(
    pytester: pytest.Pytester, model_env: ModelServer, change: tuple[str, str], differs: str | None
) -> None:
    _main_run(pytester)
    result = _reuse(pytester, *change)
    out = result.stdout.str()
    if differs:
        assert f"nothing reused from run 'main': {differs} differs" in out, out
        assert not any(row.get("reused") for row in read_index(pytester.path / EVALS / "pr"))
    else:
        assert "reuse      20 reused, 10 run (from run 'main')" in out, out


def test_a_changed_rollout_runs_everything(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _main_run(pytester)
    main_py = pytester.path / "rollouts" / "calc" / "main.py"
    main_py.write_text(main_py.read_text() + "\n# a change\n")
    out = _reuse(pytester).stdout.str()
    assert "nothing reused from run 'main': rollout differs" in out, out


def test_a_bad_reuse_run_is_one_line(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=ROWS)
    result = _reuse(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "main" in err and "Traceback" not in err + result.stdout.str()
    assert not (pytester.path / EVALS / "pr").exists()


def test_reuse_under_xdist(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _main_run(pytester)
    (pytester.path / "data" / "calc.jsonl").open("a").write(
        json.dumps({"user_prompt": "What is 6 + 6?", "ground_truth": "12"}) + "\n"
    )
    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "--osmosis-name", "pr", "--osmosis-reuse", "main", "-n", "2", *PLAIN
    )
    out = result.stdout.str()
    assert "reuse      20 reused, 2 run (from run 'main')" in out, out
    index = read_index(pytester.path / EVALS / "pr")
    assert [r["row_index"] for r in index if not r.get("reused")] == [10, 10]
    assert sdk_judge(pytester.path / EVALS / "pr")["accepted"]


def test_retry_below_threshold_runs_the_reused_runs_low_rewards_again(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """As a resume does (``outcome.is_retried``): failed, skipped and below-threshold
    attempts of RUN are not reused under ``--osmosis-retry-below-threshold``."""
    _main_run(pytester)
    calls = model_env.requests_total
    out = _reuse(pytester, "--osmosis-retry-below-threshold").stdout.str()
    # rows 1 (below threshold), 2 and 3 (errors) and 4 (skipped), both attempts each
    assert "reuse      12 reused, 8 run (from run 'main')" in out, out
    asked = [
        body["messages"][-1]["content"]
        for _, body in model_env.requests[calls:]
        if body.get("messages") and body["messages"][-1]["content"].startswith("What is")
    ]
    assert asked.count("What is 3 * 5?") == 2, asked
    index = read_index(pytester.path / EVALS / "pr")
    ran = sorted({r["row_index"] for r in index if not r.get("reused")})
    assert ran == [1, 2, 3, 4]


def test_row_digests_of_runs_written_before_the_one_store_are_read(tmp_path: Path) -> None:
    """results/row_digests.py reads the two earlier stores: osmosis_rows.json by row index
    (mapped through the journal) and osmosis_metrics.json's row_digests by dataset row."""
    from pytest_osmosis.results.row_digests import read_row_digests, write_row_digests

    by_index = tmp_path / "by-index"
    by_index.mkdir()
    (by_index / "osmosis_rows.json").write_text(json.dumps({"row_digests": ["d7", "d9"]}))
    (by_index / "events.jsonl").write_text(
        "".join(
            json.dumps({"rollout_id": f"r{row}", "row_index": row, "run_index": 0,
                        "source_row_index": source, "status": "success", "reward": 1.0}) + "\n"
            for row, source in ((0, 7), (1, 9))
        )
    )
    assert read_row_digests(by_index) == {7: "d7", 9: "d9"}
    in_metrics = tmp_path / "in-metrics"
    in_metrics.mkdir()
    (in_metrics / "osmosis_metrics.json").write_text(json.dumps({"row_digests": {"3": "d3"}}))
    assert read_row_digests(in_metrics) == {3: "d3"}
    write_row_digests(in_metrics, {5: "d5", 3: "d3"})  # the store wins over the old field
    assert read_row_digests(in_metrics) == {3: "d3", 5: "d5"}
    assert read_row_digests(tmp_path) is None
