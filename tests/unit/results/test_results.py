"""Tests of pytest_osmosis.results: the completed-run directory library.

Formats are checked against the run directory the official SDK wrote
(``shared/reference-run`` beside the clone, override with ``OSMOSIS_REFERENCE_RUN``) and,
when ``OSMOSIS_SDK_PYTHON`` names a Python with ``osmosis-ai``, against the SDK's own upload
planner and source digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import uuid
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_paths import REFERENCE_RUN, REFERENCE_WORKSPACE
from sdk_planner import SDK_MISSING, SDK_PYTHON, sdk_python_imports

from pytest_osmosis.core.errors import ConfigError, RolloutLoadError, RunDirectoryError
from pytest_osmosis.results import (
    Redactor,
    RunDirectory,
    RunLog,
    aggregate_metrics,
    ambient_secret_values,
    archive_run_directory,
    build_inputs,
    build_provenance,
    build_trajectory,
    canonical_json,
    format_row_selector,
    generated_run_name,
    git_provenance,
    inputs_digest,
    pass_at_k,
    prepare_trial_dir,
    read_journal,
    source_digest,
    validate_run_name,
    validate_trajectory,
    write_trajectory,
)
from pytest_osmosis.results.atomic import atomic_write_bytes, pretty_json
from pytest_osmosis.results.index import render_index
from pytest_osmosis.results.journal import journal_line, normalize_record
from pytest_osmosis.results.metrics import population_std

needs_reference = pytest.mark.skipif(
    not (REFERENCE_RUN / "manifest.json").is_file(),
    reason=f"reference run not found at {REFERENCE_RUN}",
)


SDK_AVAILABLE = sdk_python_imports("osmosis_ai.eval.local.upload")
needs_sdk = pytest.mark.skipif(not SDK_AVAILABLE, reason=SDK_MISSING)


def run_sdk(script: str, payload: Any, cwd: Path) -> Any:
    """Run *script* in the SDK's Python with *payload* on stdin; return its JSON stdout."""
    result = subprocess.run(
        [str(SDK_PYTHON), "-I", "-c", textwrap.dedent(script)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def make_inputs(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "model_path": "openai/gpt-5-mini",
        "dataset_sha256": "ab" * 32,
        "selected_source_rows": "0-2",
        "n": 2,
        "rollout_name": "calc",
        "entrypoint": "main.py",
        "source_digest": "cd" * 32,
        "env": {"B": "2", "A": "1"},
        "secret_names": ["OPENAI_API_KEY"],
        "agent_timeout_s": 60,
        "grader_timeout_s": None,
    }
    values.update(overrides)
    return build_inputs(**values)


PROVENANCE = {"sdk_version": "0.3.8"}
STARTED = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def open_run(root: Path, name: str = "run-1", **kwargs: Any) -> RunDirectory:
    inputs = kwargs.pop("inputs", None) or make_inputs()
    return RunDirectory.open(root, name, inputs, PROVENANCE, **kwargs)


def refresh(run: RunDirectory, status: str = "finished", **kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "status": status,
        "total_dataset_rows": 5,
        "sampled_rows": 3,
        "pass_threshold": 1.0,
        "dataset_name": "calc-ds",
        "started_at": STARTED,
    }
    args.update(kwargs)
    return run.refresh(**args)


def execute(
    run: RunDirectory,
    row: int,
    attempt: int,
    *,
    status: str = "success",
    reward: float | None = 1.0,
    trajectory: bool = True,
    artifacts: dict[str, str] | None = None,
    tokens: int | None = 7,
    **extra: Any,
) -> dict[str, Any]:
    """Do what the plugin does for one work item: trial dir, trajectory, journal."""
    rollout_id = uuid.uuid4().hex
    artifacts_dir = prepare_trial_dir(run.path, rollout_id)
    assert artifacts_dir is not None
    for relative, text in (artifacts or {}).items():
        target = artifacts_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if trajectory:
        doc = build_trajectory(
            rollout_id=rollout_id,
            messages=[
                {"role": "user", "content": f"row {row}"},
                {
                    "role": "assistant",
                    "content": "ok",
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                },
            ],
            label="ok",
            reward=reward,
            sample_metrics={},
            sample_extra_fields=None,
            request_metadata={"row": row},
            request_extra_fields={"row_index": row, "run_index": attempt},
            sdk_version="0.3.8",
        )
        write_trajectory(artifacts_dir.parent, doc)
    record: dict[str, Any] = {
        "row_index": row,
        "run_index": attempt,
        "source_row_index": row + 1,
        "rollout_id": rollout_id,
        "status": status,
        "reward": reward,
        "tokens": tokens,
        "duration_ms": 12.5,
        "error_type": "agent_error" if status == "failed" else None,
        "error_message": "boom",  # an extra key the journal must drop
        **extra,
    }
    return run.append(record)


def complete_run(root: Path, name: str = "run-1") -> RunDirectory:
    """A finished 3 x 2 run with every outcome kind."""
    run = open_run(root, name)
    execute(run, 0, 0, artifacts={"answer.txt": "4", "logs/trace.json": "{}"})
    execute(run, 0, 1, reward=0.0)
    execute(run, 1, 0, status="skipped", reward=None)
    execute(run, 1, 1, artifacts={"deep/er/x.bin": "x"})
    execute(run, 2, 0, status="failed", reward=None, trajectory=False, tokens=None)
    execute(run, 2, 1, status="failed", reward=None)
    refresh(run)
    return run


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def copy_tree(source: Path, destination: Path) -> None:
    """Copy files without their (read-only) modes, so tmp_path stays removable."""
    for dirpath, _dirs, files in os.walk(source):
        target = destination / Path(dirpath).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            (target / name).write_bytes((Path(dirpath) / name).read_bytes())


def key_structure(value: Any) -> Any:
    """Key order (recursively) without the values: what 'same shape' means."""
    if isinstance(value, dict):
        return [(key, key_structure(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [key_structure(item) for item in value]
    return type(value).__name__


# --------------------------------------------------------------------------- #
# Metrics
# --------------------------------------------------------------------------- #


@needs_reference
def test_aggregate_metrics_reproduces_reference_summary_exactly() -> None:
    rows = read_lines(REFERENCE_RUN / "index.jsonl")
    expected = json.loads((REFERENCE_RUN / "metrics.json").read_text())["summary"]
    summary = aggregate_metrics(rows, 1.0)
    assert summary == expected
    assert list(summary) == list(expected)
    assert pretty_json(summary) == pretty_json(expected)


def test_metrics_when_nothing_is_scored_and_single_attempt() -> None:
    rows = [
        {"row_index": 0, "run_index": 0, "status": "skipped", "tokens": 3},
        {"row_index": 1, "run_index": 0, "status": "skipped", "tokens": True},
    ]
    summary = aggregate_metrics(rows, 0.5)
    assert summary == {
        "total_samples": 2,
        "completed_samples": 0,
        "graded": 0,
        "passed": 0,
        "failed": 0,
        "skipped": 2,
        "pass_rate": 0,
        "pass_threshold": 0.5,
        "tokens_used": 3,
    }
    assert '"pass_rate": 0,' in pretty_json(summary)  # the integer, as the SDK writes


def test_pass_at_k_uses_powers_of_two_and_counts_rewardless_failures() -> None:
    rows = [{"row_index": 0, "run_index": i, "status": "success", "reward": 0.0} for i in range(4)]
    rows[2]["reward"] = 1.0
    rows += [
        {"row_index": 1, "run_index": 0, "status": "failed"},
        {"row_index": 1, "run_index": 1, "status": "success", "reward": 1.0},
        {"row_index": 1, "run_index": 2, "status": "skipped"},
    ]
    summary = aggregate_metrics(rows, 1.0)
    assert summary["n_runs"] == 4
    # row 0: 4 attempts 1 pass -> 0.25, 0.5, 1.0; row 1: 2 attempts 1 pass -> 0.5, 1.0.
    assert summary["pass_at_k"] == [
        {"k": 1, "value": (0.25 + 0.5) / 2},
        {"k": 2, "value": (0.5 + 1.0) / 2},
        {"k": 4, "value": 1.0},
    ]
    assert summary["completed_samples"] == 6 and summary["failed"] == 1
    assert summary["pass_rate"] == 2 / 6
    assert pass_at_k(attempts=4, passes=1, k=2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(attempts=1, passes=0, k=2)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
        min_size=2,
        max_size=12,
    )
)
def test_population_std_is_correctly_rounded(values: list[float]) -> None:
    """Python 3.12's pstdev is correctly rounded; ours must be on every Python."""
    result = population_std(values)
    exact = [Fraction(v) for v in values]
    mean = sum(exact, Fraction(0)) / len(exact)
    variance = sum(((x - mean) ** 2 for x in exact), Fraction(0)) / len(exact)
    if variance == 0:
        assert result == 0.0
        return
    import math

    below = Fraction(math.nextafter(result, 0.0))
    above = Fraction(math.nextafter(result, math.inf))
    here = Fraction(result)
    assert ((below + here) / 2) ** 2 <= variance <= ((here + above) / 2) ** 2
    if sys.version_info >= (3, 12):
        import statistics

        assert result == statistics.pstdev(values)


# --------------------------------------------------------------------------- #
# Byte formats against the reference run
# --------------------------------------------------------------------------- #


@needs_reference
def test_line_and_snapshot_formats_match_reference_bytes() -> None:
    index_bytes = (REFERENCE_RUN / "index.jsonl").read_bytes()
    assert render_index(reversed(read_lines(REFERENCE_RUN / "index.jsonl"))) == index_bytes
    for raw in (REFERENCE_RUN / "events.jsonl").read_bytes().splitlines(keepends=True):
        record = normalize_record(json.loads(raw), where="ref")
        assert journal_line(record) == raw
    for name in ("metrics.json", "progress.json", "manifest.json"):
        raw = (REFERENCE_RUN / name).read_bytes()
        assert pretty_json(json.loads(raw)).encode() == raw, name


@needs_reference
def test_run_directory_reproduces_reference_run(tmp_path: Path) -> None:
    """Replay the reference journal over its trials: every derived file is identical."""
    reference_manifest = json.loads((REFERENCE_RUN / "manifest.json").read_text())
    run = RunDirectory.open(
        tmp_path,
        "reference-run",
        reference_manifest["inputs"],
        reference_manifest["provenance"],
        fresh=False,
        retry_failed=False,
    )
    copy_tree(REFERENCE_RUN / "rollout_trials", run.path / "rollout_trials")
    for raw in (REFERENCE_RUN / "events.jsonl").read_text().splitlines():
        run.append(json.loads(raw))
    metrics = run.refresh(
        status="finished",
        total_dataset_rows=6,
        sampled_rows=6,
        n=2,
        pass_threshold=1.0,
        dataset_name="ref-dataset",
        model_path="openai/gpt-5-mini",
        rollout_name="ref-rollout",
        started_at=STARTED,
    )
    run.close()
    for name in ("index.jsonl", "summary.jsonl", "progress.json", "events.jsonl"):
        assert (run.path / name).read_bytes() == (REFERENCE_RUN / name).read_bytes(), name
    reference_metrics = json.loads((REFERENCE_RUN / "metrics.json").read_text())
    written = json.loads((run.path / "metrics.json").read_text())
    assert written == metrics
    assert written["summary"] == reference_metrics["summary"]
    assert key_structure(written) == key_structure(reference_metrics)
    assert written["eval_run"]["id"] == run.local_run_id
    assert written["eval_run"]["started_at"] == "2026-01-02T03:04:05.678901Z"
    for tree in ("trajectories", "artifacts"):
        ours = sorted(p.relative_to(run.path) for p in (run.path / tree).rglob("*") if p.is_file())
        theirs = sorted(
            p.relative_to(REFERENCE_RUN) for p in (REFERENCE_RUN / tree).rglob("*") if p.is_file()
        )
        assert ours == theirs
        for relative in ours:
            assert (run.path / relative).read_bytes() == (REFERENCE_RUN / relative).read_bytes()
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert key_structure(manifest) == key_structure(reference_manifest)


@needs_reference
def test_reference_trajectories_reproduced_byte_for_byte(tmp_path: Path) -> None:
    dataset = [
        json.loads(line)
        for line in (REFERENCE_WORKSPACE / "data" / "ref.jsonl").read_text().splitlines()
    ]
    events = {record["rollout_id"]: record for record in read_lines(REFERENCE_RUN / "events.jsonl")}
    checked = 0
    for row in read_lines(REFERENCE_RUN / "index.jsonl"):
        if "trajectory_filename" not in row:
            continue
        rollout_id = row["rollout_id"]
        source = dataset[events[rollout_id]["source_row_index"]]
        trial = REFERENCE_RUN / "rollout_trials" / rollout_id
        assistant = {
            "role": "assistant",
            "content": (trial / "artifacts" / "answer.txt").read_text(),
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            "model": "ignored-by-bridge",
        }
        doc = build_trajectory(
            rollout_id=rollout_id,
            messages=[
                {"role": "system", "content": source["system_prompt"]},
                {"role": "user", "content": source["user_prompt"]},
                assistant,
            ],
            label=source["ground_truth"],
            reward=row.get("reward"),
            sample_metrics={"llm_calls": 1.0},
            sample_extra_fields={},
            request_metadata=source["metadata"],
            request_extra_fields={"row_index": row["row_index"], "run_index": row["run_index"]},
            sdk_version="0.3.0",
        )
        out = tmp_path / rollout_id
        write_trajectory(out, doc)
        assert (out / "trajectory.json").read_bytes() == (trial / "trajectory.json").read_bytes()
        checked += 1
    assert checked == 10


# --------------------------------------------------------------------------- #
# Manifest, inputs, provenance
# --------------------------------------------------------------------------- #


@needs_reference
def test_build_inputs_reproduces_reference_inputs_with_protocol_0_4() -> None:
    reference = json.loads((REFERENCE_RUN / "manifest.json").read_text())["inputs"]
    inputs = build_inputs(
        model_path="openai/gpt-5-mini",
        dataset_sha256=reference["dataset"]["sha256"],
        selected_source_rows=format_row_selector(range(6)),
        n=2,
        rollout_name="ref-rollout",
        entrypoint="main.py",
        source_digest=reference["rollout"]["source_digest"],
        env={"REF_LOG_LEVEL": "info"},
        secret_names=("OPENAI_API_KEY",),
        agent_timeout_s=60,
        grader_timeout_s=30,
    )
    assert inputs["versions"]["rollout_protocol"] == "0.4"  # osmosis-ai 0.3.8
    expected = json.loads(json.dumps(reference))
    expected["versions"]["rollout_protocol"] = "0.4"
    assert pretty_json(inputs) == pretty_json(expected)  # same keys, order and types
    other = make_inputs()
    assert list(other["env"]) == ["A", "B"]
    assert other["timeouts"] == {"agent_timeout_sec": 60.0, "grader_timeout_sec": None}
    digest = hashlib.sha256(
        json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert inputs_digest(inputs) == digest


def test_manifest_written_once_in_sdk_form(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    raw = (run.path / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    assert raw == pretty_json(manifest).encode()
    assert list(manifest) == [
        "schema_version",
        "local_run_id",
        "run_name",
        "created_at",
        "inputs",
        "provenance",
    ]
    assert re.fullmatch(r"[0-9a-f]{32}", manifest["local_run_id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", manifest["created_at"])
    assert manifest["run_name"] == "run-1" and manifest["provenance"] == PROVENANCE
    run.close()
    again = open_run(tmp_path)
    assert again.local_run_id == manifest["local_run_id"]
    again.close()
    assert (tmp_path / "run-1" / "manifest.json").read_bytes() == raw


def test_build_provenance_orders_and_omits(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "configs" / "eval").mkdir(parents=True)
    provenance = build_provenance(
        sdk_version="0.3.8",
        config_branch=None,
        config_commit_sha="abc1234",
        advanced={},
        config_path=workspace / "configs" / "eval" / "x.toml",
        workspace=workspace,
    )
    assert provenance == {
        "sdk_version": "0.3.8",
        "config_commit_sha": "abc1234",
        "config_path": "configs/eval/x.toml",
    }
    assert list(build_provenance(sdk_version="1", advanced={"a": 1}, config_path="c.toml")) == [
        "sdk_version",
        "config_path",
        "advanced",
    ]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_provenance(tmp_path: Path) -> None:
    assert git_provenance(tmp_path) == {}
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(tmp_path), *args], check=True, env=env, capture_output=True
        )

    git("init", "-q", "-b", "trunk")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-q", "-m", "one")
    clean = git_provenance(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["git_head"])
    assert clean == {"git_head": clean["git_head"], "git_branch": "trunk", "git_dirty": False}
    (tmp_path / "f").write_text("2")
    assert git_provenance(tmp_path)["git_dirty"] is True
    git("checkout", "-q", "--detach")
    assert "git_branch" not in git_provenance(tmp_path)


# generated_run_name: the name of a run that --osmosis-name does not name.
NAME_DIGEST = "0123456789abcdef" * 4
NAME_NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("config", "stem"),
    [
        ("configs/eval/gsm8k.toml", "gsm8k"),
        ("my config+v2.toml", "my-config-v2"),
        (".hidden.toml", "hidden"),
        ("--.toml", "eval"),
        ("_x_.toml", "x"),
        ("ünï.toml", "ünï"),
    ],
)
def test_generated_run_name(config: str, stem: str) -> None:
    assert (
        generated_run_name(Path(config), NAME_DIGEST, NAME_NOW)
        == f"{stem}-20260102T030405Z-01234567"
    )


def test_generated_run_name_time_zones_and_digest_case() -> None:
    plus_two = NAME_NOW.astimezone(timezone(timedelta(hours=2)))
    assert (
        generated_run_name(Path("a.toml"), NAME_DIGEST, plus_two) == "a-20260102T030405Z-01234567"
    )
    naive = NAME_NOW.replace(tzinfo=None)
    assert (
        generated_run_name(Path("a.toml"), NAME_DIGEST.upper(), naive)
        == "a-20260102T030405Z-01234567"
    )


def test_generated_run_name_fits_the_limit() -> None:
    name = generated_run_name(Path("k" * 200 + ".toml"), NAME_DIGEST, NAME_NOW)
    assert len(name) == 96 and validate_run_name(name) == name


def test_generated_run_name_rejects_bad_digest() -> None:
    with pytest.raises(ValueError, match="inputs digest"):
        generated_run_name(Path("a.toml"), "xyz", NAME_NOW)


def test_format_row_selector_and_run_names() -> None:
    assert format_row_selector([12, 0, 1, 2, 3, 9, 2, 8]) == "0-3,8-9,12"
    assert format_row_selector([5]) == "5"
    assert validate_run_name("nightly_2026.v1-a") == "nightly_2026.v1-a"
    for bad in ("", ".locks", "-x", ".x", "a/b", "..", "a b", "x" * 97):
        with pytest.raises(RunDirectoryError, match="run name"):
            validate_run_name(bad)


def write_files(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_source_digest_exclusions_and_symlinks(tmp_path: Path) -> None:
    rollout = tmp_path / "rollout"
    write_files(rollout, {"main.py": "print(1)\n", "pkg/util.py": "X = 1\n", "a-b/z.py": ""})
    base = source_digest(rollout, None)
    noise = {
        "__pycache__/m.pyc": "x",
        "pkg/__pycache__/u.pyc": "x",
        ".venv/lib/x.py": "x",
        "node_modules/m/i.js": "x",
        "uv.lock": "x",
        "x.egg-info/PKG-INFO": "x",
        "out/run/index.jsonl": "x",
    }
    write_files(rollout, noise)
    assert source_digest(rollout, rollout / "out") == base
    assert source_digest(rollout, None) != base  # the nested output counts when not excluded
    (rollout / "pkg" / "util.py").write_text("X = 2\n")
    assert source_digest(rollout, rollout / "out") != base
    (rollout / "linked.py").symlink_to(rollout / "main.py")
    source_digest(rollout, rollout / "out")  # a file symlink is fine
    (rollout / "broken.py").symlink_to(rollout / "missing.py")
    with pytest.raises(RolloutLoadError, match="broken symlink"):
        source_digest(rollout, rollout / "out")
    (rollout / "broken.py").unlink()
    (rollout / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RolloutLoadError, match="directory symlink"):
        source_digest(rollout, rollout / "out")
    (rollout / ".venv" / "py").symlink_to(tmp_path)  # inside an excluded dir: ignored
    (rollout / "dirlink").unlink()
    source_digest(rollout, rollout / "out")
    with pytest.raises(ConfigError, match="must not be the rollout source"):
        source_digest(rollout, rollout)


@needs_reference
def test_source_digest_matches_reference_manifest() -> None:
    manifest = json.loads((REFERENCE_RUN / "manifest.json").read_text())
    rollout = REFERENCE_WORKSPACE / "rollouts" / "ref-rollout"
    assert source_digest(rollout, None) == manifest["inputs"]["rollout"]["source_digest"]


@needs_sdk
def test_source_digest_matches_sdk(tmp_path: Path) -> None:
    rollout = tmp_path / "r"
    write_files(
        rollout,
        {
            "main.py": "x",
            "a-b/c.py": "1",
            "a/b.py": "2",
            "a.b/c": "3",
            "ü/ñ.txt": "4",
            "__pycache__/x": "5",
            "build/y": "6",
            "o/z": "7",
            "deep/x.egg-info/q": "8",
        },
    )
    (rollout / "link.py").symlink_to(rollout / "main.py")
    script = """
        import json, sys
        from pathlib import Path
        from osmosis_ai.eval.local.runner import compute_source_digest
        root, out = json.load(sys.stdin)
        print(json.dumps([compute_source_digest(Path(root), exclude=Path(out)),
                          compute_source_digest(Path(root))]))
    """
    theirs = run_sdk(script, [str(rollout), str(rollout / "o")], tmp_path)
    assert [source_digest(rollout, rollout / "o"), source_digest(rollout, None)] == theirs


# --------------------------------------------------------------------------- #
# Journal
# --------------------------------------------------------------------------- #


def test_journal_records_are_canonical_and_drop_extra_keys(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    record = execute(run, 0, 0, reward=1, tokens=None)
    run.close()
    line = (run.path / "events.jsonl").read_bytes()
    assert line == (canonical_json(record) + "\n").encode()
    assert json.loads(line) == {
        "row_index": 0,
        "run_index": 0,
        "source_row_index": 1,
        "rollout_id": record["rollout_id"],
        "status": "success",
        "reward": 1.0,
        "duration_ms": 12.5,
    }
    assert b'"reward":1.0' in line


def test_ctrl_c_during_an_append_lands_after_the_record_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between the journal's fsync and the records update once left the index one
    row short: the interrupt is held until both are done, then raised as usual."""
    # Python's own Ctrl-C handler, as in a pytest session (an xdist worker runs with SIGINT's
    # default action, which would end the worker rather than raise).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_during_an_append(tmp_path, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_during_an_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = open_run(tmp_path)
    real_fsync = os.fsync

    def fsync_then_ctrl_c(fd: int) -> None:
        real_fsync(fd)
        signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C right here

    monkeypatch.setattr(os, "fsync", fsync_then_ctrl_c)
    record = {"row_index": 0, "run_index": 0, "rollout_id": "a" * 32, "status": "success"}
    with pytest.raises(KeyboardInterrupt):
        run.append(record)
    monkeypatch.undo()
    assert set(run.records) == {(0, 0)} == set(read_journal(run.path))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    run.close()


def test_a_journal_line_that_would_not_read_back_is_refused_unwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our JSON turned out wrong (a replaced encoder): the record is not journalled, and
    the session stops on it as on any storage fault, rather than write what replay refuses."""
    from pytest_osmosis.results import stdjson

    run = open_run(tmp_path)
    execute(run, 0, 0)
    before = (run.path / "events.jsonl").read_bytes()
    real = stdjson.dumps
    monkeypatch.setattr(stdjson, "dumps", lambda value, **kw: real(value, indent=1))
    record = {"row_index": 1, "run_index": 0, "rollout_id": "b" * 32, "status": "success"}
    with pytest.raises(RunDirectoryError, match=r"row 1 run 0 does not read back as written"):
        run.append(record)
    monkeypatch.undo()
    assert (run.path / "events.jsonl").read_bytes() == before
    assert set(run.records) == {(0, 0)}
    run.close()


def test_a_rollout_replacing_json_dumps_changes_none_of_our_files(tmp_path: Path) -> None:
    """The functions the run directory is written with were bound before any rollout ran."""
    import json

    from pytest_osmosis.results import stdjson

    real = json.dumps
    try:
        json.dumps = lambda value, **kw: "garbage"
        run = open_run(tmp_path)
        record = execute(run, 0, 0)
        refresh(run)
        run.close()
    finally:
        json.dumps = real
    assert stdjson.dumps is real
    assert (run.path / "events.jsonl").read_bytes() == journal_line(
        normalize_record(record, where="test")
    )
    assert json.loads((run.path / "metrics.json").read_text())["summary"]["total_samples"] == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"reward": True}, "reward must be a number"),
        ({"rollout_id": "../x"}, "single path segment"),
        ({"status": "pending"}, "status must be one of"),
        ({"run_index": None}, "run_index is missing"),
    ],
)
def test_append_refuses_invalid_records(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    run = open_run(tmp_path)
    record = {"row_index": 0, "run_index": 0, "rollout_id": "a" * 32, "status": "success"}
    record.update(bad)
    with pytest.raises(RunDirectoryError, match=message):
        run.append(record)
    run.close()
    assert (run.path / "events.jsonl").read_bytes() == b""


def test_torn_final_line_is_discarded_then_truncated(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    first = execute(run, 0, 0)
    run.close()
    journal = run.path / "events.jsonl"
    torn = b'{"row_index":0,"run_index":1,"rollout_id":"' + b"b" * 32 + b'","status":"succ'
    with journal.open("ab") as handle:
        handle.write(torn)
    assert set(read_journal(run.path)) == {(0, 0)}
    assert journal.read_bytes().endswith(torn)  # read_journal never writes
    warnings: list[str] = []
    resumed = open_run(tmp_path, warn=warnings.append)
    assert set(resumed.records) == {(0, 0)}
    assert resumed.records[(0, 0)] == first
    assert len(warnings) == 1 and "partial final record" in warnings[0]
    second = execute(resumed, 0, 1)
    resumed.close()
    lines = journal.read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["rollout_id"] for line in lines] == [
        first["rollout_id"],
        second["rollout_id"],
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{not json\n", "invalid JSON"),
        (b"\n", "blank journal record"),
        (b'{"row_index":0,"run_index":"1","rollout_id":"x","status":"failed"}\n', "run_index"),
    ],
)
def test_corrupt_committed_line_refuses_naming_the_line(
    tmp_path: Path, line: bytes, reason: str
) -> None:
    run = open_run(tmp_path)
    execute(run, 0, 0)
    run.close()
    journal = run.path / "events.jsonl"
    with journal.open("ab") as handle:
        handle.write(line)
        handle.write(journal.read_bytes().splitlines(keepends=True)[0])
    with pytest.raises(RunDirectoryError, match=rf"events\.jsonl:2: .*{reason}") as info:
        open_run(tmp_path)
    assert "\n" not in str(info.value)
    with pytest.raises(RunDirectoryError, match=r"events\.jsonl:2"):
        read_journal(run.path)
    open_run(tmp_path, name="other").close()  # the failed open released its lock
    with pytest.raises(RunDirectoryError):
        open_run(tmp_path)  # still corrupt, but not locked


def test_latest_record_wins_on_replay(tmp_path: Path) -> None:
    run = open_run(tmp_path, retry_failed=True)
    execute(run, 0, 0, status="failed", reward=None)
    winner = execute(run, 0, 0)
    run.close()
    assert read_journal(run.path)[(0, 0)] == winner


# --------------------------------------------------------------------------- #
# Resume, fresh, retry, lock
# --------------------------------------------------------------------------- #


def test_resume_refuses_changed_inputs_naming_keys(tmp_path: Path) -> None:
    open_run(tmp_path).close()
    changed = make_inputs(n=3, model_path="openai/other", env={"A": "1", "B": "2"})
    with pytest.raises(RunDirectoryError) as info:
        open_run(tmp_path, inputs=changed)
    message = str(info.value)
    assert "changed: model_path, n)" in message
    assert "--osmosis-fresh" in message and "\n" not in message
    extra_key = {**make_inputs(), "new_key": 1}
    with pytest.raises(RunDirectoryError, match=r"changed: new_key\)"):
        open_run(tmp_path, inputs=extra_key)
    open_run(tmp_path).close()  # unchanged inputs (env order irrelevant) resume fine


def test_fresh_archives_and_starts_a_new_run(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    execute(run, 0, 0)
    old_id = run.local_run_id
    run.close()
    archived: list[Path] = []
    fresh = open_run(tmp_path, fresh=True, on_archive=archived.append)
    assert fresh.local_run_id != old_id and fresh.records == {}
    fresh.close()
    assert len(archived) == 1
    assert re.fullmatch(r"run-1\.archive-\d{8}T\d{6}Z(-\d+)?", archived[0].name)
    assert json.loads((archived[0] / "manifest.json").read_text())["local_run_id"] == old_id
    assert len(read_journal(archived[0])) == 1
    moment = datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    first = tmp_path / "a"
    first.mkdir()
    assert archive_run_directory(first, now=moment).name == "a.archive-20260506T070809Z"
    first.mkdir()
    assert archive_run_directory(first, now=moment).name == "a.archive-20260506T070809Z-1"
    # Without a manifest, --fresh has nothing to archive.
    (tmp_path / "bare").mkdir()
    open_run(tmp_path, name="bare", fresh=True, on_archive=archived.append).close()
    assert len(archived) == 1


def test_pending_honours_retry_failed(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    execute(run, 0, 0)
    execute(run, 0, 1, status="failed", reward=None)
    execute(run, 1, 0, status="skipped", reward=None)
    run.close()
    keys = [(r, i) for r in range(2) for i in range(2)]
    plain = open_run(tmp_path)
    assert plain.pending(keys) == {(1, 1)}
    plain.close()
    retry = open_run(tmp_path, retry_failed=True)
    assert retry.pending(keys) == {(0, 1), (1, 0), (1, 1)}
    execute(retry, 0, 1, status="failed", reward=None)
    assert retry.pending(keys) == {(1, 0), (1, 1)}  # retried once per invocation
    retry.close()


def test_lock_refuses_a_second_writer(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    with pytest.raises(RunDirectoryError, match=r"holds .*\.locks/run-1\.lock"):
        open_run(tmp_path)
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            str(tmp_path / ".locks" / "run-1.lock"),
        ],
        capture_output=True,
        check=False,
    )
    assert holder.returncode != 0 and b"BlockingIOError" in holder.stderr
    run.close()
    open_run(tmp_path).close()
    assert (tmp_path / ".locks" / "run-1.lock").exists()


def test_symlinked_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "run-1").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(RunDirectoryError, match="symbolic link"):
        open_run(tmp_path)


# --------------------------------------------------------------------------- #
# Snapshots and projections
# --------------------------------------------------------------------------- #


def test_refresh_writes_consistent_snapshots(tmp_path: Path) -> None:
    run = complete_run(tmp_path)
    index = (run.path / "index.jsonl").read_bytes()
    assert (run.path / "summary.jsonl").read_bytes() == index
    assert not index.endswith(b"\n\n")
    rows = read_lines(run.path / "index.jsonl")
    assert [(r["row_index"], r["run_index"]) for r in rows] == [
        (r, i) for r in range(3) for i in range(2)
    ]
    for row in rows:
        assert None not in row.values() and "resumed" not in row
        assert list(row) == [
            key
            for key in (
                "row_index",
                "run_index",
                "rollout_id",
                "trajectory_filename",
                "status",
                "reward",
                "tokens",
                "duration_ms",
                "error_type",
            )
            if key in row
        ]
    assert "trajectory_filename" not in rows[4] and "tokens" not in rows[4]
    assert rows[5]["trajectory_filename"] == "trajectory.json"
    assert "reward" not in rows[2] and rows[2]["status"] == "skipped"
    assert (run.path / "progress.json").read_text() == (
        '{\n  "total_runs": 6,\n  "sampled_rows": 3,\n  "total_dataset_rows": 5\n}\n'
    )
    metrics = json.loads((run.path / "metrics.json").read_text())
    assert metrics["summary"] == aggregate_metrics(rows, 1.0)
    assert metrics["eval_run"]["status"] == "finished"
    assert list(metrics["eval_run"]) == [
        "id",
        "status",
        "name",
        "dataset_name",
        "model_name",
        "rollout_name",
        "duration_ms",
        "started_at",
        "completed_at",
    ]
    assert metrics["eval_run"]["model_name"] == "openai/gpt-5-mini"
    assert metrics["eval_run"]["rollout_name"] == "calc"
    assert sorted(p.name for p in (run.path / "trajectories").iterdir()) == [
        "row_0_run_0.json",
        "row_0_run_1.json",
        "row_1_run_0.json",
        "row_1_run_1.json",
        "row_2_run_1.json",
    ]
    assert (run.path / "artifacts" / "row_0_run_0" / "logs" / "trace.json").read_text() == "{}"
    run.close()


def test_unfinished_runs_are_never_marked_finished(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    execute(run, 0, 0)
    running = refresh(run, status="running", duration_ms=5.0)
    assert running["eval_run"]["status"] == "running"
    assert running["eval_run"]["duration_ms"] == 5.0
    assert "completed_at" not in running["eval_run"]
    claimed = refresh(run, status="finished")
    assert claimed["eval_run"]["status"] == "incomplete"
    assert "completed_at" not in claimed["eval_run"]
    run.close()
    started = datetime.now(timezone.utc) - timedelta(seconds=2)
    done = complete_run(tmp_path, "run-2")
    finished = refresh(done, started_at=started)
    assert finished["eval_run"]["status"] == "finished"
    assert finished["eval_run"]["duration_ms"] >= 2000.0
    assert finished["eval_run"]["completed_at"].endswith("Z")
    done.close()


def test_resumed_rows_and_trajectory_checks(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    good = execute(run, 0, 0, tokens=None)
    wrong = execute(run, 0, 1)
    run.close()
    # A trajectory that names another rollout is not this attempt's trajectory.
    trial = run.path / "rollout_trials" / wrong["rollout_id"]
    doc = json.loads((trial / "trajectory.json").read_text())
    doc["extra"]["osmosis"]["rollout_id"] = "f" * 32
    (trial / "trajectory.json").write_text(json.dumps(doc))
    resumed = open_run(tmp_path)
    refresh(resumed, status="running")
    rows = read_lines(resumed.path / "index.jsonl")
    assert rows[0]["resumed"] is True and rows[1]["resumed"] is True
    assert rows[0]["trajectory_filename"] == "trajectory.json"
    assert "tokens" not in rows[0]  # no bridge count and no totals in final_metrics
    assert "trajectory_filename" not in rows[1]
    assert not (resumed.path / "trajectories" / "row_0_run_1.json").exists()
    execute(resumed, 0, 1)
    refresh(resumed, status="running")
    rows = read_lines(resumed.path / "index.jsonl")
    assert rows[0]["resumed"] is True and "resumed" not in rows[1]
    assert rows[1]["trajectory_filename"] == "trajectory.json"
    assert (resumed.path / "trajectories" / "row_0_run_1.json").exists()
    resumed.close()
    assert good["rollout_id"] == rows[0]["rollout_id"]


def test_refresh_projects_only_what_changed_and_repairs_after_a_crash(tmp_path: Path) -> None:
    run = complete_run(tmp_path)
    projection = run.path / "trajectories" / "row_0_run_0.json"
    inode = projection.stat().st_ino
    refresh(run)
    assert projection.stat().st_ino == inode  # unchanged item: not copied again
    crashed = execute(run, 0, 0, artifacts={"new.txt": "n"})  # journaled, never refreshed
    run.close()
    (run.path / "trajectories" / "row_1_run_1.json").unlink()  # a lost projection
    broken = read_journal(run.path)[(2, 1)]["rollout_id"]
    (run.path / "rollout_trials" / broken / "trajectory.json").write_text("{truncated")
    resumed = open_run(tmp_path)
    unchanged = resumed.path / "trajectories" / "row_0_run_1.json"
    inode = unchanged.stat().st_ino
    refresh(resumed)
    rows = {(r["row_index"], r["run_index"]): r for r in read_lines(run.path / "index.jsonl")}
    assert rows[(0, 0)]["rollout_id"] == crashed["rollout_id"]
    assert (run.path / "artifacts" / "row_0_run_0" / "new.txt").read_text() == "n"
    assert json.loads(projection.read_text())["session_id"] == crashed["rollout_id"]
    assert (run.path / "trajectories" / "row_1_run_1.json").is_file()
    assert "trajectory_filename" not in rows[(2, 1)]  # re-checked: the file changed
    assert not (run.path / "trajectories" / "row_2_run_1.json").exists()
    assert unchanged.stat().st_ino == inode
    assert all(row["resumed"] is True for row in rows.values())
    resumed.close()


def test_tokens_fall_back_to_trajectory_final_metrics(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    record = execute(run, 0, 0, tokens=None)
    trial = run.path / "rollout_trials" / record["rollout_id"]
    doc = json.loads((trial / "trajectory.json").read_text())
    doc["final_metrics"].update(total_prompt_tokens=30, total_completion_tokens=4)
    write_trajectory(trial, doc)
    refresh(run, status="running")
    assert read_lines(run.path / "index.jsonl")[0]["tokens"] == 34
    doc["final_metrics"] = {"total_steps": 2, "total_prompt_tokens": True}
    write_trajectory(trial, doc)
    refresh(run, status="running")
    assert "tokens" not in read_lines(run.path / "index.jsonl")[0]
    run.close()


def test_a_settled_item_is_projected_at_once_and_not_again_at_the_end(tmp_path: Path) -> None:
    """The controller settles each result as it is recorded: the end of the run (refresh)
    then copies nothing for it, and a retry settled later replaces the projection."""
    run = open_run(tmp_path, retry_failed=True)
    first = execute(run, 0, 0, status="failed", reward=None, artifacts={"a.txt": "a"})
    projection = run.path / "trajectories" / "row_0_run_0.json"
    assert not projection.exists()
    run.settle((0, 0))
    assert json.loads(projection.read_text())["session_id"] == first["rollout_id"]
    assert (run.path / "artifacts" / "row_0_run_0" / "a.txt").read_text() == "a"
    inode = projection.stat().st_ino
    refresh(run, status="running")
    assert projection.stat().st_ino == inode  # settled: not copied again
    retried = execute(run, 0, 0, artifacts={"b.txt": "b"})
    run.settle((0, 0))
    assert json.loads(projection.read_text())["session_id"] == retried["rollout_id"]
    assert sorted(p.name for p in (run.path / "artifacts" / "row_0_run_0").iterdir()) == ["b.txt"]
    run.settle((4, 0))  # nothing recorded: nothing to do
    refresh(run, status="running")
    assert read_lines(run.path / "index.jsonl")[0]["rollout_id"] == retried["rollout_id"]
    run.close()


def test_settling_on_a_full_disk_leaves_the_copy_to_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk can fail the copy and even the warning about it: settle raises nothing
    (the result is journalled), and the end of the run copies the item again."""
    from pytest_osmosis.results import rundir as rundir_module

    run = open_run(tmp_path)
    record = execute(run, 0, 0)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rundir_module, "project_work_item", disk_full)
    monkeypatch.setattr(run, "_warn", disk_full)
    run.settle((0, 0))
    monkeypatch.undo()
    projection = run.path / "trajectories" / "row_0_run_0.json"
    assert not projection.exists()
    refresh(run, status="running")
    assert json.loads(projection.read_text())["session_id"] == record["rollout_id"]
    run.close()


class HeldFsync:
    """``os.fsync`` of the journal, held at its first call until released: what rows
    finishing meanwhile do is seen while the first commit is still on the disk."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.journal_syncs = 0
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(os.sep + "events.jsonl"):
            self.journal_syncs += 1
            if self.journal_syncs == 1:
                self.entered.set()
                assert self.release.wait(60), "the test never released the first fsync"
        self._fsync(fd)


def staged(run: RunDirectory, row: int) -> dict[str, Any]:
    """A finished row's record, handed to the journal as the event loop does."""
    record = {"row_index": row, "run_index": 0, "rollout_id": uuid.uuid4().hex}
    record.update(status="success", reward=1.0, duration_ms=1.0)
    run.stage(record)
    return record


def written_row(run: RunDirectory, row: int, **usage: int) -> tuple[dict[str, Any], Any]:
    """A row as the session finishes it: its trajectory written, then its record staged with
    what was written (the loop thread's part); pytest has not reported it yet."""
    rollout_id = uuid.uuid4().hex
    artifacts_dir = prepare_trial_dir(run.path, rollout_id)
    assert artifacts_dir is not None
    doc = _trajectory_of(
        [{"role": "user", "content": f"row {row}"}, {"role": "assistant", "content": "ok"}],
        rollout_id=rollout_id,
        step_usage=[usage] if usage else None,
    )
    written = write_trajectory(artifacts_dir.parent, doc)
    assert written is not None
    record = {"row_index": row, "run_index": 0, "rollout_id": rollout_id}
    record.update(status="success", reward=1.0, duration_ms=1.0)
    run.stage(record, written)
    return record, written


def test_settle_copies_the_trajectory_its_writer_handed_over_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trajectory just written is neither read nor parsed again when its row is
    settled: its verdict and its projection come from what the writer handed over, and
    the index says what a check of the file would."""
    from pytest_osmosis.results import journal as journal_module
    from pytest_osmosis.results import projection as projection_module
    from pytest_osmosis.results import rundir as rundir_module

    run = open_run(tmp_path)
    record, written = written_row(run, 0, prompt_tokens=30, completion_tokens=4)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read or checked again")

    for module, name in (
        (rundir_module, "valid_trajectory"),
        (rundir_module, "read_valid_trajectory"),
        (rundir_module, "read_regular_file"),
        (projection_module, "read_regular_file"),
        (rundir_module, "normalize_record"),  # checked as it was staged: not again
        (journal_module, "normalize_record"),
    ):
        monkeypatch.setattr(module, name, refused)
    run.append({**record, "config": "an extra key, dropped"})  # a report's copy of the result
    run.settle((0, 0))
    monkeypatch.undo()
    projection = run.path / "trajectories" / "row_0_run_0.json"
    trial = run.path / "rollout_trials" / record["rollout_id"]
    assert projection.read_bytes() == written.data == (trial / "trajectory.json").read_bytes()
    refresh(run, status="running")
    (row,) = read_lines(run.path / "index.jsonl")
    assert (row["trajectory_filename"], row["tokens"]) == ("trajectory.json", 34)
    run.close()


@pytest.mark.parametrize("change", ["replaced", "rewritten", "removed", "linked"])
def test_a_trajectory_changed_after_it_was_written_is_checked_at_settle(
    tmp_path: Path, change: str
) -> None:
    """What the writer handed over stands only for the file it wrote: a trajectory replaced,
    rewritten in place, removed or swapped for a link before its row is settled is read
    and checked as it is now (the index drops it, no projection copies the old bytes)."""
    run = open_run(tmp_path)
    record, written = written_row(run, 0)
    path = run.path / "rollout_trials" / record["rollout_id"] / "trajectory.json"
    other = json.loads(written.data)
    other["session_id"] = other["extra"]["osmosis"]["rollout_id"] = "f" * 32
    if change == "replaced":  # another file renamed over it, naming another rollout
        (path.parent / "other.json").write_text(json.dumps(other))
        os.replace(path.parent / "other.json", path)
    elif change == "rewritten":  # the same file, cut short
        with open(path, "r+b") as handle:
            handle.truncate(len(written.data) // 2)
    elif change == "removed":
        path.unlink()
    else:  # swapped for a link to another rollout's document
        (path.parent / "elsewhere.json").write_text(json.dumps(other))
        path.unlink()
        path.symlink_to("elsewhere.json")
    run.append(record)
    run.settle((0, 0))
    assert not (run.path / "trajectories" / "row_0_run_0.json").exists()
    refresh(run, status="running")
    (row,) = read_lines(run.path / "index.jsonl")
    assert "trajectory_filename" not in row
    assert not (run.path / "trajectories" / "row_0_run_0.json").exists()
    run.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names descriptors by /proc")
def test_rows_that_finish_during_a_commit_share_the_next_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: rows staged while a commit syncs are written and synced together, and
    append returns only once its own row is synced (and writes it once)."""
    held = HeldFsync()
    monkeypatch.setattr(os, "fsync", held)
    run = open_run(tmp_path)
    first = staged(run, 0)
    assert held.entered.wait(60)
    rows = [staged(run, 1), staged(run, 2)]
    journal = run.path / "events.jsonl"
    assert read_lines(journal) == [normalize_record(first, where="test")]  # not synced yet
    held.release.set()
    for record in (first, *rows):
        run.append(record)
    assert held.journal_syncs == 2  # row 0 alone, rows 1 and 2 together
    assert [line["row_index"] for line in read_lines(journal)] == [0, 1, 2]
    refresh(run, status="running")
    assert [line["row_index"] for line in read_lines(run.path / "index.jsonl")] == [0, 1, 2]
    run.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names descriptors by /proc")
def test_rows_nobody_waits_for_share_one_fsync_and_a_wait_commits_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group-commit window: rows that finish ahead of pytest's report wait for others
    to share their fsync, and the row pytest waits for ends the window at once. The window
    is an hour here: a wait that did not start the commit would hang (pytest-timeout)."""
    from pytest_osmosis.results import journal as journal_module

    monkeypatch.setattr(journal_module, "GROUP_WINDOW_S", 3600.0)
    held = HeldFsync()
    held.release.set()  # counts the journal's syncs, holds none
    monkeypatch.setattr(os, "fsync", held)
    run = open_run(tmp_path)
    rows = [staged(run, row) for row in range(3)]
    run.append(rows[2])
    assert held.journal_syncs == 1  # the three rows, together
    for record in rows[:2]:
        run.append(record)  # synced already: nothing written again
    assert held.journal_syncs == 1
    assert [line["row_index"] for line in read_lines(run.path / "events.jsonl")] == [0, 1, 2]
    run.close()


def test_a_staged_row_never_appended_is_indexed_as_the_journal_holds_it(tmp_path: Path) -> None:
    """The session ended before pytest reported the row: the journal has it, so the index
    does too; appending it afterwards (journal_finished) writes nothing again."""
    run = open_run(tmp_path)
    record = staged(run, 0)
    refresh(run, status="running")
    assert [line["rollout_id"] for line in read_lines(run.path / "index.jsonl")] == [
        record["rollout_id"]
    ]
    run.append(record)
    assert len(read_lines(run.path / "events.jsonl")) == 1
    run.close()
    reopened = RunDirectory.open(tmp_path, "run-1", make_inputs(), PROVENANCE)
    assert reopened.pending([(0, 0)]) == set()
    reopened.close()


def test_kept_is_what_the_journal_holds_and_nothing_is_journalled_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count a stop line states: rows staged and never appended (nobody waits for them:
    an hour's window here) are written by the seal and counted; a row finishing after it
    is not journalled; an attempt journalled twice is one work item."""
    from pytest_osmosis.results import journal as journal_module

    monkeypatch.setattr(journal_module, "GROUP_WINDOW_S", 3600.0)
    run = open_run(tmp_path)
    first = staged(run, 0)
    run.append(first)
    run.append({**first, "rollout_id": uuid.uuid4().hex})  # row 0 run again (a retry)
    staged(run, 1)
    staged(run, 2)
    journal = run.path / "events.jsonl"
    assert len(read_lines(journal)) == 2  # rows 1 and 2 wait in the window
    assert run.kept() == 3
    assert [line["row_index"] for line in read_lines(journal)] == [0, 0, 1, 2]
    staged(run, 3)  # finished after the seal: dropped, not written at close
    with pytest.raises(RunDirectoryError, match="closed"):
        run.append(staged(run, 4))
    assert run.kept() == 3
    run.close()
    assert run.kept() == 3
    assert len(read_lines(journal)) == 4
    reopened = RunDirectory.open(tmp_path, "run-1", make_inputs(), PROVENANCE)
    assert len(reopened.records) == 3
    assert reopened.pending([(r, 0) for r in range(5)]) == {(3, 0), (4, 0)}
    reopened.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names descriptors by /proc")
def test_a_failed_group_commit_fails_each_of_its_rows_and_is_cut_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk during a commit of several rows: each row's append raises, none is in
    the journal (the torn write is cut off), and the next commit appends after the last
    whole record."""
    held = HeldFsync()
    monkeypatch.setattr(os, "fsync", held)
    run = open_run(tmp_path)
    first = staged(run, 0)
    assert held.entered.wait(60)
    write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(os.sep + "events.jsonl"):
            write(fd, bytes(data)[: len(data) // 2])
            raise OSError(28, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "write", full)
    rows = [staged(run, 1), staged(run, 2)]
    held.release.set()
    run.append(first)
    for record in rows:
        with pytest.raises(RunDirectoryError, match="No space left on device"):
            run.append(record)
    monkeypatch.setattr(os, "write", write)
    journal = run.path / "events.jsonl"
    assert [line["row_index"] for line in read_lines(journal)] == [0]
    assert run.pending([(0, 0), (1, 0), (2, 0)]) == {(1, 0), (2, 0)}
    run.append(rows[0])
    assert [line["row_index"] for line in read_lines(journal)] == [0, 1]
    run.close()


def test_retry_replaces_the_projection(tmp_path: Path) -> None:
    run = open_run(tmp_path, retry_failed=True)
    first = execute(run, 0, 0, status="failed", reward=None, artifacts={"a.txt": "old"})
    refresh(run, status="running")
    assert (run.path / "artifacts" / "row_0_run_0" / "a.txt").read_text() == "old"
    execute(run, 0, 0, status="failed", reward=None, trajectory=False, artifacts={"b.txt": "new"})
    refresh(run, status="running")
    assert not (run.path / "trajectories" / "row_0_run_0.json").exists()
    assert sorted(p.name for p in (run.path / "artifacts" / "row_0_run_0").iterdir()) == ["b.txt"]
    assert (run.path / "rollout_trials" / first["rollout_id"] / "trajectory.json").exists()
    run.close()


def test_projection_skips_unsafe_artifacts(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.txt").write_text("outside")
    run = open_run(tmp_path / "out")
    record = execute(
        run, 0, 0, artifacts={"ok.txt": "fine", "manifest.json": "{}", "sub/manifest.json": "{}"}
    )
    artifacts = run.path / "rollout_trials" / record["rollout_id"] / "artifacts"
    (artifacts / "leak.txt").symlink_to(secret)
    (artifacts / "linkdir").symlink_to(outside, target_is_directory=True)
    (artifacts / "sub" / "up.txt").symlink_to(Path("..") / ".." / ".." / ".." / ".." / secret)
    other = execute(run, 0, 1)
    other_artifacts = run.path / "rollout_trials" / other["rollout_id"] / "artifacts"
    shutil.rmtree(other_artifacts)
    other_artifacts.symlink_to(outside, target_is_directory=True)
    warnings: list[str] = []
    run._warn = warnings.append  # what RunDirectory.open(warn=...) sets
    refresh(run, status="running")
    projected = run.path / "artifacts" / "row_0_run_0"
    files = sorted(p.relative_to(projected).as_posix() for p in projected.rglob("*"))
    assert files == ["ok.txt", "sub", "sub/manifest.json"]
    assert not (run.path / "artifacts" / "row_0_run_1").exists()
    text = "\n".join(warnings)
    for name in ("leak.txt", "linkdir", "up.txt", "symlinked artifact root"):
        assert name in text
    run.close()


def test_file_modes_are_owner_only(tmp_path: Path) -> None:
    run = complete_run(tmp_path)
    log = RunLog(run.logs_path, Redactor())
    log.info("run", "hello")
    log.close()
    run.close()
    paths = [
        run.path / name
        for name in (
            "manifest.json",
            "events.jsonl",
            "index.jsonl",
            "summary.jsonl",
            "progress.json",
            "metrics.json",
            "logs.txt",
        )
    ]
    paths += list((run.path / "trajectories").iterdir())
    paths += [p for p in (run.path / "artifacts").rglob("*") if p.is_file()]
    paths.append(tmp_path / ".locks" / "run-1.lock")
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    leftovers = [p for p in run.path.rglob(".*.tmp")]
    assert leftovers == []


def test_prepare_trial_dir(tmp_path: Path) -> None:
    artifacts = prepare_trial_dir(tmp_path, "c" * 32)
    assert artifacts == tmp_path / "rollout_trials" / ("c" * 32) / "artifacts"
    assert artifacts.is_dir()
    marker = artifacts.parent / ".osmosis-health-check"
    assert marker.read_bytes() == b"osmosis-health-check"
    assert prepare_trial_dir(tmp_path, "c" * 32) == artifacts
    with pytest.raises(RunDirectoryError):
        prepare_trial_dir(tmp_path, "../escape")
    (tmp_path / "blocked").write_text("")
    assert prepare_trial_dir(tmp_path / "blocked", "d" * 32, backoff_s=0.0) is None


# --------------------------------------------------------------------------- #
# Logs and redaction
# --------------------------------------------------------------------------- #


def test_redactor_longest_first_and_min_length() -> None:
    redactor = Redactor(["sk-abcdefgh", "sk-abcdefgh-long-tail", "short", ""])
    text = "a sk-abcdefgh-long-tail b sk-abcdefgh c short"
    assert redactor.redact(text) == "a [REDACTED] b [REDACTED] c short"
    assert Redactor(["short"], min_length=1).redact("short!") == "[REDACTED]!"
    env = {"OPENAI_API_KEY": "sk-123456789", "HF_TOKEN": "tiny", "OTHER": "sk-999999999"}
    assert ambient_secret_values(env) == ["sk-123456789"]


def test_run_log_format_and_redaction(tmp_path: Path) -> None:
    path = tmp_path / "logs.txt"
    log = RunLog(path, Redactor(["supersecret-value"]))
    line = log.write("info", "dispatch", "sending supersecret-value", rollout_id="r", row_index=1)
    log.warning("resume", "two\nlines", key="supersecret-value")
    log.close()
    lines = path.read_text().splitlines()
    assert lines[0] == line
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z INFO \[dispatch\] sending \[REDACTED\] "
        r'\{"rollout_id":"r","row_index":1\}',
        lines[0],
    )
    assert lines[1].endswith('WARNING [resume] two\\nlines {"key":"[REDACTED]"}')
    assert len(lines) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --------------------------------------------------------------------------- #
# Conformance with the official SDK's upload planner
# --------------------------------------------------------------------------- #

UPLOAD_SCRIPT = """
    import json, sys
    from pathlib import Path
    from osmosis_ai.eval.local.upload import LocalEvalUploadError, build_eval_upload_plan
    results = []
    for run_dir in json.load(sys.stdin):
        try:
            plan = build_eval_upload_plan(Path(run_dir))
        except LocalEvalUploadError as exc:
            results.append({"error": str(exc)})
        else:
            results.append({"files": [f.path for f in plan.files], "run": plan.run,
                            "versions": plan.schema_versions, "provenance": plan.provenance})
    print(json.dumps(results))
"""


@needs_sdk
def test_sdk_upload_planner_accepts_our_finished_run(tmp_path: Path) -> None:
    finished = complete_run(tmp_path / "a", "good-run")
    log = RunLog(finished.logs_path, Redactor())
    log.info("run", "done")
    log.close()
    finished.close()
    running = open_run(tmp_path / "b", "running-run")
    for r in range(3):
        for i in range(2):
            execute(running, r, i)
    refresh(running, status="running")
    running.close()
    partial = open_run(tmp_path / "c", "partial-run")
    execute(partial, 0, 0)
    refresh(partial, status="finished")
    partial.close()
    good, unfinished, incomplete = run_sdk(
        UPLOAD_SCRIPT, [str(finished.path), str(running.path), str(partial.path)], tmp_path
    )
    assert "error" not in good, good
    rows = read_lines(finished.path / "index.jsonl")
    expected = {"index.jsonl", "progress.json", "logs.txt"}
    for row in rows:
        if "trajectory_filename" in row:
            expected.add(f"rollout_trials/{row['rollout_id']}/trajectory.json")
    artifacts = {
        f"rollout_trials/{rows[0]['rollout_id']}/artifacts/answer.txt",
        f"rollout_trials/{rows[0]['rollout_id']}/artifacts/logs/trace.json",
        f"rollout_trials/{rows[3]['rollout_id']}/artifacts/deep/er/x.bin",
    }
    assert set(good["files"]) == expected | artifacts
    assert good["run"]["evaluation_config"] == {"n": 2, "pass_threshold": 1.0}
    assert good["versions"]["rollout_protocol"] == "0.4"
    assert "not completed" in unfinished["error"]
    assert "incomplete" in incomplete["error"]


# --------------------------------------------------------------------------- #
# Trajectories against the SDK's converter
# --------------------------------------------------------------------------- #


def test_trajectory_formatting_compacts_numeric_arrays(tmp_path: Path) -> None:
    doc = build_trajectory(
        rollout_id="e" * 32,
        messages=[
            {"role": "user", "content": "é"},
            {"role": "assistant", "content": "x"},
        ],
        label=None,
        reward=None,
        sample_metrics=None,
        sample_extra_fields={"ids": [1, -2, 3.5e-07]},
        request_metadata=None,
        request_extra_fields={"row_index": 0, "run_index": 0},
        sdk_version="0.3.8",
        model_name="m",
        step_usage=[{"prompt_tokens": 2, "completion_token_ids": [7, 8, 9], "model_name": "s"}],
    )
    write_trajectory(tmp_path, doc)
    text = (tmp_path / "trajectory.json").read_text()
    assert not text.endswith("\n")
    assert '"ids": [1, -2, 3.5e-07]' in text and '"completion_token_ids": [7, 8, 9]' in text
    assert "\\u00e9" in text  # ASCII-escaped like the SDK
    assert json.loads(text) == doc
    agent = doc["steps"][1]
    assert agent["model_name"] == "s" and agent["llm_call_count"] == 1
    assert doc["final_metrics"] == {"total_prompt_tokens": 2, "total_steps": 2}
    assert doc["agent"] == {"name": "osmosis-rollout-sdk", "version": "0.3.8", "model_name": "m"}
    assert stat.S_IMODE((tmp_path / "trajectory.json").stat().st_mode) == 0o600
    with pytest.raises(ValueError):
        build_trajectory(
            rollout_id="e" * 32,
            messages=[],
            label=None,
            reward=None,
            sample_metrics=None,
            sample_extra_fields=None,
            request_metadata=None,
            request_extra_fields=None,
            sdk_version="0.3.8",
        )


def _random_case(rng: Any, index: int) -> dict[str, Any]:
    """One random sample in OpenAI chat shape, with the odd shapes rollouts produce."""

    def content() -> Any:
        return rng.choice(
            [
                "plain text",
                "ünïcode ✓",
                None,
                "",
                [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}],
                {"weird": [1, 2]},
                42,
            ]
        )

    def usage() -> Any:
        return rng.choice(
            [
                {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
                {
                    "input_tokens": 4,
                    "output_tokens": 0,
                    "input_tokens_details": {"cached_tokens": 1},
                },
                {"prompt_tokens": 0, "input_tokens": 9, "prompt_tokens_details": {}},
                {"prompt_tokens": 12.0, "cost_usd": 0.25, "cached_tokens": 2},
                {"prompt_tokens": 12.5},
                {"prompt_tokens": "7", "completion_tokens_details": {"reasoning_tokens": 3}},
                {"total_tokens": 5},
                "not a mapping",
            ]
        )

    def tool_calls() -> Any:
        return rng.choice(
            [
                [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
                [{"function": {"arguments": "[1, 2]"}}, "junk", {"id": "c2", "function": None}],
                [{"id": "c3", "function": {"name": "g", "arguments": {"y": [1.5, 2]}}}],
                [{"id": "c4", "function": {"name": "h", "arguments": "not json"}}],
                "a string",
                [],
            ]
        )

    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 7)):
        role = rng.choice(
            ["system", "developer", "user", "assistant", "assistant", "tool", "function", "critic"]
        )
        message: dict[str, Any] = {"role": role, "content": content()}
        if role == "critic" and rng.random() < 0.3:
            del message["role"]
        if role in ("tool", "function"):
            message["tool_call_id"] = rng.choice(["c1", "c3", "zz", None])
        if rng.random() < 0.4:
            message["tool_calls"] = tool_calls()
        if rng.random() < 0.3:
            message["reasoning_content"] = rng.choice(["thinking", {"steps": [1, 2]}])
        if role == "assistant" and rng.random() < 0.6:
            message["usage"] = usage()
        if role == "assistant" and rng.random() < 0.3:
            message.update(rng.choice([{"model": "m1"}, {"model_name": "m2"}, {"model": ""}]))
        if rng.random() < 0.2:
            message["extra"] = rng.choice(
                [
                    {"response": {"model": "m3", "usage": {"prompt_tokens": 1}}},
                    {"timestamp": "2024-05-06T07:08:09Z"},
                    {"timestamp": 1700000000.5},
                ]
            )
        if rng.random() < 0.2:
            message[rng.choice(["created_at", "timestamp", "completed_at"])] = rng.choice(
                ["2024-01-02T03:04:05.123+00:00", 1700000000, "yesterday", True, "2024-01-02"]
            )
        messages.append(message)
    calls = None
    if rng.random() < 0.3:
        calls = [
            rng.choice(
                [
                    {"prompt_tokens": 3, "completion_tokens": 4, "model_name": "mm"},
                    {"prompt_token_ids": [1, 2, 3], "logprobs": [-0.5, -1e-05]},
                    {"cost_usd": 0.5, "ignored": "x"},
                    {},
                ]
            )
            for _ in range(rng.randint(1, 3))
        ]
    return {
        "rollout_id": uuid.UUID(int=index + 1).hex,
        "messages": messages,
        "label": rng.choice([None, "4", ""]),
        "reward": rng.choice([None, 1.0, 0.0, 0.25]),
        "sample_metrics": rng.choice([{}, {"llm_calls": 1.0, "xs": [1, 2]}]),
        "sample_extra_fields": rng.choice([{}, {"k": {"nested": None}}]),
        "request_metadata": rng.choice([None, {}, {"op": "add", "v": [1e20, -0.0]}]),
        "request_extra_fields": {"row_index": index, "run_index": 0},
        "model_name": rng.choice([None, "agent-model"]),
        "step_usage": calls,
    }


SDK_TRAJECTORY_SCRIPT = """
    import json, sys
    from osmosis_ai.consts import PACKAGE_VERSION
    from osmosis_ai.rollout.trajectory.atif import Trajectory, format_trajectory_json
    from osmosis_ai.rollout.trajectory.converter import convert_sample_to_trajectory
    from osmosis_ai.rollout.trajectory.report import SampleReport
    from osmosis_ai.rollout import RolloutSample
    payload = json.load(sys.stdin)
    theirs, verdicts = [], []
    for case in payload["cases"]:
        try:
            sample = RolloutSample(messages=case["messages"], label=case["label"],
                                   reward=case["reward"], metrics=case["sample_metrics"],
                                   extra_fields=case["sample_extra_fields"])
            report = None
            if case["step_usage"] is not None:
                report = SampleReport(model_name=case["model_name"],
                                      llm_call_metrics=case["step_usage"])
            doc = convert_sample_to_trajectory(
                sample, rollout_id=case["rollout_id"],
                request_metadata=case["request_metadata"],
                request_extra_fields=case["request_extra_fields"],
                report=report, default_model_name=case["model_name"])
            theirs.append(format_trajectory_json(doc.to_json_dict()))
        except ValueError as exc:
            theirs.append(None)
    for doc in payload["ours"]:
        try:
            Trajectory.model_validate(doc, strict=True)
            verdicts.append(True)
        except ValueError:
            verdicts.append(False)
    print(json.dumps({"version": PACKAGE_VERSION, "theirs": theirs, "valid": verdicts}))
"""


def _trajectory_of(messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "rollout_id": "f" * 32,
        "label": None,
        "reward": 1.0,
        "sample_metrics": None,
        "sample_extra_fields": None,
        "request_metadata": None,
        "request_extra_fields": None,
        "sdk_version": "0.3.8",
        **kwargs,
    }
    return build_trajectory(messages=messages, **fields)


def test_a_rollouts_odd_values_are_coerced_or_refused_as_the_schema_says() -> None:
    """The document is built without the pydantic models, which still decide every value
    not already of its field's type: the same coercions, the same refusals."""
    from pytest_osmosis.execution.runner import _one_line

    def metrics(usage: dict[str, Any]) -> Any:
        doc = _trajectory_of([{"role": "assistant", "content": "x", "usage": usage}])
        validate_trajectory(doc)
        return doc["steps"][0].get("metrics")

    assert metrics({"prompt_tokens": "12", "completion_tokens": 2.0}) == {
        "prompt_tokens": 12,
        "completion_tokens": 2,
    }
    assert metrics({"prompt_tokens": 3, "cost_usd": 1}) == {"prompt_tokens": 3, "cost_usd": 1.0}
    # What the schema cannot hold costs the step its metrics, not the document.
    assert metrics({"prompt_tokens": 1.5}) is None
    assert metrics({"prompt_tokens": 1, "cost_usd": float("nan")}) is None
    assert metrics({"prompt_tokens": "many"}) is None
    # The user's free-form values are written as JSON the way the models dumped them.
    doc = _trajectory_of(
        [{"role": "user", "content": "x"}],
        request_metadata={"when": datetime(2026, 1, 2, tzinfo=timezone.utc), "pair": (1, 2)},
        sample_extra_fields={"score": float("inf"), 3: "three"},
    )
    validate_trajectory(doc)
    osmosis = doc["extra"]["osmosis"]
    assert osmosis["request_metadata"] == {"when": "2026-01-02T00:00:00Z", "pair": [1, 2]}
    assert osmosis["sample_extra_fields"] == {"score": None, "3": "three"}
    # Refusals stay clear one-line errors naming the value (the row keeps its result).
    tool_call = {"id": "c1", "function": {"name": "f", "arguments": {1: "x"}}}
    with pytest.raises(ValueError) as refused:
        _trajectory_of([{"role": "assistant", "content": "", "tool_calls": [tool_call]}])
    assert _one_line(refused.value) == "arguments.1.[key]: Input should be a valid string"

    class Opaque:
        pass

    with pytest.raises(ValueError, match="Unable to serialize unknown type: .*Opaque"):
        _trajectory_of([{"role": "user", "content": "x"}], sample_extra_fields={"o": Opaque()})
    with pytest.raises(ValueError, match="finite"):  # the totals the schema refuses
        _trajectory_of(
            [{"role": "assistant", "content": "x"}],
            step_usage=[{"prompt_tokens": 1, "cost_usd": float("inf")}],
        )
    # A key no UTF-8 file can hold (a lone surrogate) is refused the same way, naming where.
    tool_call = {"id": "c1", "function": {"name": "f", "arguments": {"ok": {"\ud800k": 1}}}}
    with pytest.raises(ValueError) as surrogate:
        _trajectory_of(
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [tool_call]}]
        )
    assert _one_line(surrogate.value) == (
        "steps.1.tool_calls.0.arguments.ok: the key '\\ud800k' is not valid Unicode text "
        "(a lone surrogate)"
    )
    with pytest.raises(ValueError) as surrogate:
        _trajectory_of([{"role": "user", "content": "x"}], sample_metrics={"\udcff": 1.0})
    assert _one_line(surrogate.value) == (
        "extra.osmosis.sample_metrics: the key '\\udcff' is not valid Unicode text "
        "(a lone surrogate)"
    )
    with pytest.raises(ValueError) as empty:
        _trajectory_of([])
    assert _one_line(empty.value) == (
        "the sample has no messages: a trajectory needs at least one step"
    )


@needs_sdk
def test_trajectories_match_sdk_converter_and_validate_strictly(tmp_path: Path) -> None:
    import random

    rng = random.Random(20260101)
    cases = [_random_case(rng, index) for index in range(200)]
    ours_text: list[str | None] = []
    ours_docs: list[dict[str, Any]] = []
    version = "0.3.8"
    for case in cases:
        try:
            doc = build_trajectory(
                rollout_id=case["rollout_id"],
                messages=case["messages"],
                label=case["label"],
                reward=case["reward"],
                sample_metrics=case["sample_metrics"],
                sample_extra_fields=case["sample_extra_fields"],
                request_metadata=case["request_metadata"],
                request_extra_fields=case["request_extra_fields"],
                sdk_version=version,
                model_name=case["model_name"],
                step_usage=case["step_usage"],
            )
        except ValueError:
            ours_text.append(None)
            continue
        ours_docs.append(doc)
        write_trajectory(tmp_path, doc)
        ours_text.append((tmp_path / "trajectory.json").read_text())
    result = run_sdk(SDK_TRAJECTORY_SCRIPT, {"cases": cases, "ours": ours_docs}, tmp_path)
    assert result["version"] == version
    assert sum(text is not None for text in ours_text) > 150  # the fuzz mostly builds
    for case, mine, theirs in zip(cases, ours_text, result["theirs"], strict=True):
        assert mine == theirs, json.dumps(case)
    assert all(result["valid"])


def test_pieces_are_written_whole_in_blocks(tmp_path: Path) -> None:
    # An index of many lines is written from its lines, never joined whole (issue 30 item 5).
    lines = [f'{{"row_index": {i}, "pad": "{"x" * (i % 97)}"}}\n'.encode() for i in range(12000)]
    written: list[int] = []
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        written.append(len(data))
        return real_write(fd, data)

    target = tmp_path / "index.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "write", write)
        atomic_write_bytes(target, iter(lines))
    assert target.read_bytes() == b"".join(lines)
    assert sum(written) == len(b"".join(lines)) > 3 * (1 << 18)
    assert len(written) >= 3 and max(written) < (1 << 18) + 200  # blocks, not one write
    atomic_write_bytes(target, b"whole")  # bytes are still one piece
    assert target.read_bytes() == b"whole"
    atomic_write_bytes(target, iter([]))
    assert target.read_bytes() == b""
