"""`pytest-osmosis list / info / report` over the SDK's reference run and over our own runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

# LiteLLM (imported by the plugin run below) swaps in the importlib_metadata backport;
# importing it first keeps in-process pytester runs finding pytest11 entry points.
import importlib_metadata  # noqa: F401
import pytest
from reference_paths import REFERENCE_RUN
from workspaces import MIXED_ROWS, read_index, write_workspace

from pytest_osmosis.cli import main
from pytest_osmosis.results.metrics import aggregate_metrics

pytest_plugins = ["pytester"]

REFERENCE = REFERENCE_RUN


def copy_run(source: Path, destination: Path) -> Path:
    """A writable copy (the shared reference run is read-only)."""
    shutil.copytree(source, destination)
    for path in [destination, *destination.rglob("*")]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode):
            os.chmod(
                path, mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0)
            )
    return destination


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace holding a copy of the reference run under .osmosis/evals, as cwd."""
    if not REFERENCE.is_dir():
        pytest.skip(f"the SDK's reference run is not at {REFERENCE}")
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    copy_run(REFERENCE, tmp_path / ".osmosis" / "evals" / "reference-run")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- list


def test_list_json_matches_the_reference_run(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    metrics = load(run_dir / "metrics.json")
    payload = cli_json(capsys, "list")
    assert payload["schema_version"] == 1
    assert payload["output_root"] == str(run_dir.parent.resolve())
    assert (payload["total_count"], payload["has_more"], payload["next_offset"]) == (1, False, None)
    [item] = payload["items"]
    eval_run, summary = metrics["eval_run"], metrics["summary"]
    assert item["name"] == "reference-run"
    assert item["path"] == str(run_dir.resolve())
    assert item["status"] == eval_run["status"] == "finished"
    assert item["rollout"] == eval_run["rollout_name"]
    assert item["model"] == eval_run["model_name"]
    assert item["dataset"] == eval_run["dataset_name"]
    assert (item["rows_done"], item["rows_total"]) == (
        12,
        load(run_dir / "progress.json")["total_runs"],
    )
    assert item["pass_rate"] == summary["pass_rate"] == 0.4
    assert item["started_at"] == eval_run["started_at"]
    assert item["duration_ms"] == eval_run["duration_ms"]
    assert item["warnings"] == []


def test_list_human_table(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    header, _rule, line = out.splitlines()[2:5]
    assert header.split() == [
        "NAME",
        "STATUS",
        "ROLLOUT",
        "MODEL",
        "DATASET",
        "DONE",
        "PASS",
        "STARTED",
        "DURATION",
    ]
    assert line.split()[:7] == [
        "reference-run",
        "finished",
        "ref-rollout",
        "openai/gpt-5-mini",
        "ref-dataset",
        "12/12",
        "40.0%",
    ]
    assert line.endswith("69.4 s")


def test_list_finds_the_workspace_from_a_subdirectory(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = workspace / "rollouts" / "calc" / "pkg"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert [i["name"] for i in cli_json(capsys, "list")["items"]] == ["reference-run"]
    assert cli_json(capsys, "info", "reference-run")["data"]["name"] == "reference-run"


def test_list_without_runs_is_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    assert f"No runs under {tmp_path.resolve() / '.osmosis' / 'evals'}" in out
    assert cli_json(capsys, "list")["items"] == []


def _with_start(run_dir: Path, started: str) -> None:
    metrics = load(run_dir / "metrics.json")
    metrics["eval_run"]["started_at"] = started
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


def test_list_newest_first_with_limit_and_all(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workspace / ".osmosis" / "evals"
    (root / ".locks").mkdir()  # hidden entries are not runs
    (root / "notes").mkdir()  # neither is a directory without run files
    for name, started in (("older", "2025-01-01T00:00:00Z"), ("newest", "2027-05-01T10:00:00Z")):
        _with_start(copy_run(REFERENCE, root / name), started)
    payload = cli_json(capsys, "list", "--limit", "2")
    assert [i["name"] for i in payload["items"]] == ["newest", "reference-run"]
    assert (payload["total_count"], payload["has_more"], payload["next_offset"]) == (3, True, 2)
    everything = cli_json(capsys, "list", "--all")["items"]
    assert [i["name"] for i in everything] == ["newest", "reference-run", "older"]
    # A copied directory keeps the manifest's run_name: it still lists, with a warning.
    assert "differs from the directory name" in everything[0]["warnings"][0]
    code, out, _ = run_cli(capsys, "list", "--limit", "1")
    assert "Showing 1 of 3" in out
    assert run_cli(capsys, "list", "--all", "--limit", "2")[0] == 2
    assert run_cli(capsys, "list", "--limit", "0")[0] == 2
    assert run_cli(capsys, "list", "--output", str(root / "notes"))[0] == 0


# ----------------------------------------------------------------------------- info


def test_info_json_matches_the_reference_run(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    manifest, metrics = load(run_dir / "manifest.json"), load(run_dir / "metrics.json")
    index = jsonl(run_dir / "index.jsonl")
    payload = cli_json(capsys, "info", "reference-run")
    assert payload["schema_version"] == 1
    info = payload["data"]
    assert set(info) == {
        "name",
        "path",
        "status",
        "local_run_id",
        "context",
        "timing",
        "progress",
        "configuration",
        "results",
        "cost",
        "failed_rows",
        "below_threshold_rows",
        "skipped_rows",
        "error_types",
        "warnings",
    }
    assert info["local_run_id"] == manifest["local_run_id"]
    assert info["context"]["model"] == manifest["inputs"]["model_path"]
    assert info["context"]["entrypoint"] == manifest["inputs"]["rollout"]["entrypoint"]
    assert info["context"]["git"] == {
        "commit": manifest["provenance"]["git_head"],
        "branch": "main",
        "dirty": False,
    }
    assert info["timing"]["started_at"] == metrics["eval_run"]["started_at"]
    assert info["timing"]["duration_ms"] == metrics["eval_run"]["duration_ms"]
    config = info["configuration"]
    assert (config["n"], config["selection"], config["pass_threshold"]) == (2, "0-5", 1.0)
    assert config["timeouts"] == {"agent_workflow_timeout_s": 60.0, "grader_timeout_s": 30.0}
    assert config["env_keys"] == ["REF_LOG_LEVEL"]
    assert config["secret_names"] == ["OPENAI_API_KEY"]
    assert "info" not in json.dumps(config)  # env values are not shown, only their names
    assert info["results"] == metrics["summary"]
    assert info["cost"] is None  # the SDK records no cost: none is made up
    progress = info["progress"]
    assert (progress["done"], progress["total"], progress["pending"]) == (12, 12, 0)
    assert (
        progress["passed"],
        progress["below_threshold"],
        progress["failed"],
        progress["skipped"],
    ) == (4, 2, 4, 2)
    failed = [
        (r["row_index"], r["run_index"], r["rollout_id"], r["error_type"])
        for r in index
        if r["status"] == "failed"
    ]
    assert [
        (r["row_index"], r["run_index"], r["rollout_id"], r["error_type"])
        for r in info["failed_rows"]
    ] == failed
    assert info["error_types"] == {"agent_error": 2, "grader_failed": 2}
    assert [r["row_index"] for r in info["skipped_rows"]] == [3, 3]
    assert info["warnings"] == []


def test_info_human_output_and_dirty_warning(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    code, out, _ = run_cli(capsys, "info", str(run_dir))  # a path works as well as a name
    assert code == 0
    for expected in (
        "Run       reference-run  (finished)",
        "3a19e77e2ef2 on main  (clean)",
        "Timeouts        workflow 60 s, grader 30 s",
        "pass@k       k=1 40.0% · k=2 60.0%",
        "row 5 run 1: error_type=grader_failed -> rollout_trials/",
    ):
        assert expected in out
    assert "  Cost " not in out  # not recorded by the SDK's run: no line rather than a guess
    manifest = load(run_dir / "manifest.json")
    manifest["provenance"]["git_dirty"] = True
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = run_cli(capsys, "info", "reference-run")
    assert "(DIRTY: uncommitted changes)" in out
    assert "Warning: the workspace had uncommitted changes" in out


def test_incomplete_run_is_read_from_the_journal(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    summary = load(run_dir / "metrics.json")["summary"]
    for name in ("metrics.json", "index.jsonl", "summary.jsonl", "progress.json"):
        (run_dir / name).unlink()
    info = cli_json(capsys, "info", "reference-run")["data"]
    assert info["status"] == "incomplete"
    assert (info["progress"]["done"], info["progress"]["total"]) == (12, 12)
    assert info["progress"]["source"] == "events.jsonl"
    assert info["results"] == summary  # recomputed from the journal, same numbers
    assert any("pass_threshold is not recorded" in w for w in info["warnings"])
    # Killed mid-append: five committed records and a torn sixth.
    lines = (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "events.jsonl").write_bytes(b"".join(lines[:5]) + lines[5][:20])
    [item] = cli_json(capsys, "list")["items"]
    assert (item["status"], item["rows_done"], item["rows_total"]) == ("incomplete", 5, 12)
    info = cli_json(capsys, "info", "reference-run")["data"]
    assert info["progress"]["pending"] == 7
    assert info["results"] == aggregate_metrics(jsonl(REFERENCE / "events.jsonl")[:5], 1.0)


def test_damaged_files_are_warnings_not_crashes(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    (run_dir / "manifest.json").write_text("{not json")
    index = (run_dir / "index.jsonl").read_text().splitlines()
    (run_dir / "index.jsonl").write_text(
        "\n".join([index[0], "[1, 2]", "garbage", *index[1:]]) + "\n"
    )
    [item] = cli_json(capsys, "list")["items"]
    assert item["rows_done"] == 12  # list trusts a finished run's metrics.json
    assert "manifest.json: invalid JSON" in " | ".join(item["warnings"])
    info = cli_json(capsys, "info", "reference-run")["data"]
    warnings = " | ".join(info["warnings"])
    assert "manifest.json: invalid JSON" in warnings
    assert "index.jsonl: skipped 2 line(s)" in warnings
    assert info["progress"]["done"] == 12
    assert info["configuration"]["n"] is None
    assert info["results"]["passed"] == 4


def test_unknown_runs_and_bad_usage_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "info", "nope")
    assert code == 2
    assert "run 'nope' not found" in err and "reference-run" in err  # names what exists
    code, _, err = run_cli(capsys, "info", "nope", "--json")
    envelope = json.loads(err)
    assert (code, envelope["command"], envelope["error"]["code"]) == (2, "info", "NOT_FOUND")
    (workspace / "plain").mkdir()
    code, _, err = run_cli(capsys, "report", "plain")
    assert code == 2 and "not a run directory" in err
    assert run_cli(capsys, "info")[0] == 2
    assert run_cli(capsys, "report", "reference-run", "--format", "pdf")[0] == 2
    assert run_cli(capsys, "report", "reference-run", "--compare", "reference-run")[0] == 2
    assert run_cli(capsys, "report", "reference-run", "-o", str(workspace))[0] == 2
    assert run_cli(capsys)[0] == 2


def test_read_only_run_directory_is_left_untouched(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    before = sorted(p.name for p in run_dir.iterdir())
    run_dir.chmod(0o555)  # like the shared reference run; root could still write into it
    try:
        code, _, err = run_cli(capsys, "report", "reference-run")
        assert code == 1
        assert "the run directory is read-only; write the report elsewhere (-o FILE)" in err
        assert sorted(p.name for p in run_dir.iterdir()) == before
        assert run_cli(capsys, "report", "reference-run", "-o", "r.html")[0] == 0
    finally:
        run_dir.chmod(0o755)


def test_unwritable_report_exits_1(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = workspace / "blocker"
    blocker.write_text("a file, not a directory")
    code, _, err = run_cli(capsys, "report", "reference-run", "-o", str(blocker / "r.html"))
    assert code == 1
    assert "cannot write the report" in err


# ----------------------------------------------------------------------------- report


def test_report_writes_html_and_prints_its_path(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = workspace / ".osmosis" / "evals" / "reference-run"
    code, out, _ = run_cli(capsys, "report", "reference-run")
    assert code == 0
    path = Path(out.strip())
    assert path == run_dir.resolve() / "report.html"
    assert path.read_text().startswith("<!DOCTYPE html>")
    code, out, _ = run_cli(capsys, "report", "reference-run", "-o", "out/r.html", "--json")
    payload = json.loads(out)
    assert payload["resource"] == {"format": "html", "path": str(workspace / "out" / "r.html")}
    assert (workspace / "out" / "r.html").is_file()


def test_report_markdown_and_compare(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = workspace / ".osmosis" / "evals"
    after = copy_run(REFERENCE, root / "after")
    index = jsonl(after / "index.jsonl")
    index[1]["reward"] = 1.0  # row 0, attempt 1 now passes: row 0 improves
    index[2]["reward"] = 0.0  # row 1, attempt 0 now fails: row 1 regresses
    index[9] = {**index[9], "status": "success", "reward": 1.0}  # row 4, attempt 1 passes
    index[9].pop("error_type")
    (after / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    metrics = load(after / "metrics.json")
    metrics["summary"] = aggregate_metrics(index, 1.0)
    (after / "metrics.json").write_text(json.dumps(metrics))
    code, out, _ = run_cli(
        capsys, "report", "after", "--compare", "reference-run", "--format", "markdown"
    )
    assert code == 0
    assert out.startswith("### Osmosis eval: after vs reference-run")
    assert "**Pass rate 50.0%** (was 40.0%): **+10.0 pp**" in out
    assert (
        "- **Paired** (5 rows both runs scored): **+10.0 pp**; 1 row worse, 2 better of 5, "
        "two-sided p = 1.000 (exact paired permutation test on the rows' change in passing "
        "attempts): **within noise** at 0.05." in out
    )
    assert "#### Regressed rows (1)\n\n| row | baseline passes | current passes |" in out
    assert "| 1 | 2/2 | 1/2 |" in out
    assert "#### Improved rows (2)" in out
    assert "| 0 | 1/2 | 2/2 |" in out and "| 4 | 0/2 | 1/2 |" in out
    comparison = cli_json(
        capsys, "report", "after", "--compare", "reference-run", "--format", "markdown"
    )["comparison"]
    assert [e["source_row_index"] for e in comparison["regressed"]] == [1]
    assert [e["source_row_index"] for e in comparison["improved"]] == [0, 4]
    change = comparison["pass_rate_change"]
    assert change["difference"] == pytest.approx(0.1)
    assert change["ci95_low"] < 0 < change["ci95_high"]
    code, out, _ = run_cli(capsys, "report", "after", "--compare", "reference-run")
    html = Path(out.strip()).read_text()
    assert Path(out.strip()).name == "report-vs-reference-run.html"
    assert 'id="comparison"' in html and "Regressed rows (1)" in html
    code, out, _ = run_cli(capsys, "report", "reference-run", "--format", "markdown")
    assert "#### Errored attempts (4)" in out
    assert "| 4 | 0 | agent\\_error |" in out


def test_python_dash_m_runs_the_cli(workspace: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest_osmosis", "list", "--json"],
        capture_output=True,
        text=True,
        cwd=workspace,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["items"][0]["name"] == "reference-run"
    missing = subprocess.run(
        [sys.executable, "-m", "pytest_osmosis", "info", "missing"],
        capture_output=True,
        text=True,
        cwd=workspace,
        env=env,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("pytest-osmosis: error: run 'missing' not found")


# ----------------------------------------------------------------------------- our own run


MIXED = MIXED_ROWS  # one of each outcome, and two errors


def test_cli_over_a_run_written_by_the_plugin(
    pytester: pytest.Pytester,
    model_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    secret = model_server.env()["OPENAI_API_KEY"]
    write_workspace(
        pytester.path,
        rows=MIXED,
        evaluation={"n": 2},
        env={"MODE": "plain"},
        secrets=["OPENAI_API_KEY"],
    )
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "mine", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2, failed=2, errors=4, skipped=2)
    # Every row is counted: row 4's attempts were all skipped, so it has no class of its own.
    result.stdout.fnmatch_lines(
        ["rows       1 passed every attempt, 0 flaky, 3 passed none, 1 skipped (row 4)"]
    )
    capsys.readouterr()
    run_dir = pytester.path / ".osmosis" / "evals" / "mine"
    # skipped_rows is newer than the rest of osmosis_metrics.json: info and report below
    # read this run as a run written before it (the field taken out).
    extra = load(run_dir / "osmosis_metrics.json")
    assert extra.pop("skipped_rows") == [4]
    (run_dir / "osmosis_metrics.json").write_text(json.dumps(extra))
    metrics, index = load(run_dir / "metrics.json"), read_index(run_dir)

    [item] = cli_json(capsys, "list")["items"]
    assert (item["name"], item["status"], item["rows_done"], item["rows_total"]) == (
        "mine",
        "finished",
        10,
        10,
    )
    assert (item["rollout"], item["model"], item["dataset"]) == (
        "calc",
        "openai/test-model",
        "calc",
    )
    assert item["pass_rate"] == metrics["summary"]["pass_rate"] == pytest.approx(2 / 8)

    info = cli_json(capsys, "info", "mine")["data"]
    assert info["results"] == metrics["summary"]
    # openai/test-model has no price: every attempt's cost is unknown, and info says so.
    assert info["cost"] == {"usd": None, "priced_attempts": 0, "attempts": 10}
    assert re.search(r"^  Cost +unknown$", run_cli(capsys, "info", "mine")[1], re.M)
    assert info["context"]["config_path"] == "configs/eval/calc.toml"
    assert info["configuration"]["env_keys"] == ["MODE"]
    assert info["configuration"]["secret_names"] == ["OPENAI_API_KEY"]
    assert [(r["row_index"], r["run_index"], r["error_type"]) for r in info["failed_rows"]] == [
        (r["row_index"], r["run_index"], r["error_type"]) for r in index if r["status"] == "failed"
    ]
    messages = {r["row_index"]: r["error_message"] for r in info["failed_rows"]}
    assert messages == {
        2: "workflow raised RuntimeError: workflow exploded on purpose",
        3: "grader raised RuntimeError: grader exploded on purpose",
    }
    assert [r["row_index"] for r in info["below_threshold_rows"]] == [1, 1]

    code, out, _ = run_cli(capsys, "report", "mine")
    html = Path(out.strip()).read_text()
    assert html.count("<tr tabindex") == 10
    assert "workflow exploded on purpose" in html
    everything = html + json.dumps(info)
    assert secret not in everything  # the provider key never reaches a report


def test_markdown_to_a_file(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "report", "reference-run", "--format", "markdown", "-o", "pr.md")
    assert code == 0
    assert Path(out.strip()) == workspace / "pr.md"
    assert (
        (workspace / "pr.md").read_text().startswith("### Osmosis eval: reference-run (finished)")
    )


def test_modules_can_add_subcommands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import types

    from pytest_osmosis import cli

    module = types.ModuleType("fake_osmosis_extension")
    seen: list[argparse.Namespace] = []

    def add_fake_osmosis_extension_parser(subparsers: Any) -> None:
        parser = subparsers.add_parser("fake-ext", help="a subcommand from another module")
        parser.add_argument("--word")
        parser.set_defaults(func=lambda args: seen.append(args) or 7)

    module.add_fake_osmosis_extension_parser = add_fake_osmosis_extension_parser  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_osmosis_extension", module)
    monkeypatch.setattr(cli, "EXTENSIONS", ("fake_osmosis_extension",))
    assert main(["fake-ext", "--word", "hi"]) == 7
    assert seen[0].word == "hi"
    assert main(["--help"]) == 0
    assert "fake-ext" in capsys.readouterr().out
    # A listed module that cannot be imported (a renamed module, a broken install) is never
    # dropped silently with its subcommands: every command fails, naming it.
    monkeypatch.setattr(cli, "EXTENSIONS", ("fake_osmosis_extension", "no_such_module_xyz"))
    with pytest.raises(ImportError, match=r"cannot import no_such_module_xyz, which adds subcommands: No module named 'no_such_module_xyz'"):
        main(["list"])


def test_every_extension_module_imports() -> None:
    """The real list: each module exists and adds at least one subcommand."""
    import importlib

    from pytest_osmosis import cli

    for name in cli.EXTENSIONS:
        module = importlib.import_module(name)
        assert any(a.startswith("add_") and a.endswith("_parser") for a in vars(module)), name


def test_latest_names_the_newest_run_unless_a_run_is_called_latest(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workspace / ".osmosis" / "evals"
    newer = copy_run(REFERENCE, root / "newer")
    metrics = load(newer / "metrics.json")
    metrics["eval_run"]["started_at"] = "2027-01-01T00:00:00Z"
    (newer / "metrics.json").write_text(json.dumps(metrics))
    payload = cli_json(capsys, "report", "latest")
    assert payload["resource"]["path"] == str((newer / "report.html").resolve())
    assert "Run       newer  (finished)" in run_cli(capsys, "info", "latest")[1]
    # A run directory of that very name is never shadowed.
    copy_run(REFERENCE, root / "latest")
    assert cli_json(capsys, "info", "latest")["data"]["name"] == "latest"
    code, _, err = run_cli(capsys, "report", "latest", "--output", str(workspace / "empty"))
    assert code == 2 and "run 'latest': no runs under" in err


def test_report_index_writes_runs_html_in_the_root(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workspace / ".osmosis" / "evals"
    payload = cli_json(capsys, "report", "--index")
    assert payload["resource"] == {
        "format": "html",
        "path": str((root / "runs.html").resolve()),
        "index": True,
    }
    assert 'data-run="reference-run"' in (root / "runs.html").read_text()
    code, out, _ = run_cli(capsys, "report", "--index", "-o", "all.html")
    assert code == 0 and Path(out.strip()) == (workspace / "all.html").resolve()
    for args, message in (
        (("report",), "give a run (NAME, PATH or latest), or --index for runs.html"),
        (("report", "--index", "reference-run"), "--index takes no run"),
        (("report", "--index", "--compare", "reference-run"), "--index takes no run"),
        (("report", "--index", "--output", "nowhere"), "no such output root"),
    ):
        code, _, err = run_cli(capsys, *args)
        assert code == 2 and message in err, (args, err)
