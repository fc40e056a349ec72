"""Artifacts (issue 6, point 5): what a rollout leaves under ``artifacts_dir`` cannot escape.

A rollout can put anything in its artifacts directory: symlinks to host files (absolute
or climbing out with ``..``), a symlinked directory, names ``osmosis eval upload`` refuses
(a backslash, a control character, bytes that are not UTF-8, a path longer than 1024
characters), FIFOs. None of it may reach the projection ``artifacts/row_r_run_n/``, every
refusal must name the file, and the run must stay uploadable: the SDK's planner refuses
the whole run for one symlink under ``rollout_trials/<id>/artifacts``, so refused entries
are moved aside to ``rollout_trials/<id>/refused_artifacts/`` (never uploaded, nothing
deleted). The projection itself never writes through a link a rollout planted in the run
directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import calc_rows, read_index, write_workspace

from pytest_osmosis.results.projection import (
    MAX_UPLOAD_PATH_LENGTH,
    REFUSED_ARTIFACTS_DIRNAME,
    project_work_item,
    refuse_unsafe_artifacts,
    upload_path_problem,
)

pytest_plugins = ["pytester"]

HOST_SECRET = "host-file-content-never-copied"
ROLLOUT_ID = "0123456789abcdef0123456789abcdef"
PREFIX = f"rollout_trials/{ROLLOUT_ID}/artifacts/"
#: Long enough that the upload path passes 1024 characters; each part stays under NAME_MAX.
DEEP = ("d" * 200, "e" * 200, "f" * 200, "g" * 200, "h" * 200)


def plant(artifacts: Path, outside: Path) -> None:
    """Everything a hostile or careless rollout might leave behind, plus good files."""
    (artifacts / "answer.txt").write_text("fine")
    (artifacts / "logs").mkdir()
    (artifacts / "logs" / "trace.json").write_text("{}")
    (artifacts / "abs-link").symlink_to(outside / "secret.txt")
    (artifacts / "logs" / "up-link").symlink_to(
        Path("../../../../../../..") / outside / "secret.txt"
    )
    (artifacts / "dir-link").symlink_to(outside, target_is_directory=True)
    (artifacts / "back\\slash.txt").write_text("x")
    (artifacts / "bell\x07.txt").write_text("x")
    fd = os.open(os.fsencode(artifacts) + b"/latin-\xe9.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    deep = artifacts.joinpath(*DEEP)
    deep.mkdir(parents=True)
    (deep / "too-far.txt").write_text("x")
    os.mkfifo(artifacts / "pipe")


REFUSED = ["abs-link", "logs/up-link", "dir-link", "back\\slash.txt", "bell\x07.txt", DEEP[0]]


def outside_dir(tmp: Path) -> Path:
    outside = tmp / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.txt").write_text(HOST_SECRET)
    return outside


def test_upload_path_rules_match_the_planner() -> None:
    assert upload_path_problem(PREFIX + "a/b.txt") is None
    assert "longer than 1024" in str(upload_path_problem(PREFIX + "x" * MAX_UPLOAD_PATH_LENGTH))
    assert "backslash" in str(upload_path_problem(PREFIX + "a\\b"))
    assert "control character" in str(upload_path_problem(PREFIX + "a\nb"))
    assert "'..'" in str(upload_path_problem(PREFIX + "a/../b"))
    assert "not valid UTF-8" in str(upload_path_problem(PREFIX + "caf\udce9"))


def test_refused_entries_are_moved_aside_and_named(tmp_path: Path) -> None:
    outside = outside_dir(tmp_path)
    trial = tmp_path / "rollout_trials" / ROLLOUT_ID
    artifacts = trial / "artifacts"
    artifacts.mkdir(parents=True)
    plant(artifacts, outside)
    warnings: list[str] = []
    assert refuse_unsafe_artifacts(trial, ROLLOUT_ID, warn=warnings.append) == 7
    text = "\n".join(warnings)
    for name in [*REFUSED, "latin-"]:
        assert repr(name)[1:-1] in text or name in text, name
    assert "\n" not in "".join(warnings)  # one line each, control characters escaped
    # What is left is exactly what the planner accepts; nothing was followed or deleted.
    left = sorted(
        p.relative_to(artifacts).as_posix() for p in artifacts.rglob("*") if not p.is_dir()
    )
    assert left == ["answer.txt", "logs/trace.json", "pipe"]
    refused = trial / REFUSED_ARTIFACTS_DIRNAME / "artifacts"
    assert os.readlink(refused / "abs-link") == str(outside / "secret.txt")
    assert (refused / "dir-link").is_symlink() and (refused / "logs" / "up-link").is_symlink()
    assert refused.joinpath(*DEEP, "too-far.txt").exists()
    assert (outside / "secret.txt").read_text() == HOST_SECRET
    assert refuse_unsafe_artifacts(trial, ROLLOUT_ID, warn=warnings.append) == 0


def test_a_symlinked_artifact_root_is_moved_aside(tmp_path: Path) -> None:
    outside = outside_dir(tmp_path)
    trial = tmp_path / "rollout_trials" / ROLLOUT_ID
    trial.mkdir(parents=True)
    (trial / "artifacts").symlink_to(outside, target_is_directory=True)
    warnings: list[str] = []
    assert refuse_unsafe_artifacts(trial, ROLLOUT_ID, warn=warnings.append) == 1
    assert not os.path.lexists(trial / "artifacts")
    assert "symlinked artifact root" in warnings[0] and ROLLOUT_ID in warnings[0]
    assert (outside / "secret.txt").read_text() == HOST_SECRET


def test_the_projection_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    outside = outside_dir(tmp_path)
    run_dir = tmp_path / "run"
    trial = run_dir / "rollout_trials" / ROLLOUT_ID
    (trial / "artifacts").mkdir(parents=True)
    (trial / "artifacts" / "answer.txt").write_text("fine")
    (run_dir / "artifacts").symlink_to(outside, target_is_directory=True)
    (run_dir / "trajectories").symlink_to(outside, target_is_directory=True)
    warnings: list[str] = []
    project_work_item(
        run_dir,
        row_index=0,
        run_index=0,
        rollout_id=ROLLOUT_ID,
        trajectory_filename=None,
        warn=warnings.append,
    )
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (run_dir / "artifacts").is_symlink()
    assert (run_dir / "artifacts" / "row_0_run_0" / "answer.txt").read_text() == "fine"
    assert sum("was a symbolic link" in w for w in warnings) == 2


PLANTING_ROLLOUT = f"""
import os
from pathlib import Path

from pytest_osmosis.rollout import AgentWorkflow, Grader

DEEP = {DEEP!r}


class Planting(AgentWorkflow):
    async def run(self, ctx):
        a = ctx.artifacts_dir
        outside = Path(os.environ["OUTSIDE_DIR"])
        (a / "answer.txt").write_text("fine")
        (a / "logs").mkdir()
        (a / "logs" / "trace.json").write_text("{{}}")
        (a / "abs-link").symlink_to(outside / "secret.txt")
        (a / "logs" / "up-link").symlink_to(Path("../../../../../../..") / outside / "secret.txt")
        (a / "dir-link").symlink_to(outside, target_is_directory=True)
        (a / "back\\\\slash.txt").write_text("x")
        (a / "bell\\x07.txt").write_text("x")
        fd = os.open(os.fsencode(a) + b"/latin-\\xe9.txt", os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        deep = a.joinpath(*DEEP)
        deep.mkdir(parents=True)
        (deep / "too-far.txt").write_text("x")
        return [*ctx.prompt, {{"role": "assistant", "content": "4"}}]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)
"""


@pytest.fixture
def planted_run(
    pytester: pytest.Pytester,
    model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, pytest.RunResult]:
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    outside = outside_dir(tmp_path_factory.mktemp("host"))
    monkeypatch.setenv("OUTSIDE_DIR", str(outside))
    write_workspace(
        pytester.path,
        rows=calc_rows([("What is 2 + 2?", "4"), ("What is 1 + 3?", "4")]),
        rollout_source=PLANTING_ROLLOUT,
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "art")
    return pytester.path / ".osmosis" / "evals" / "art", outside, result


def test_a_run_whose_rollout_planted_links_stays_safe_and_uploadable(
    planted_run: tuple[Path, Path, pytest.RunResult],
) -> None:
    run_dir, outside, result = planted_run
    result.assert_outcomes(passed=2)
    for row in read_index(run_dir):
        projected = run_dir / "artifacts" / f"row_{row['row_index']}_run_0"
        files = sorted(p.relative_to(projected).as_posix() for p in projected.rglob("*"))
        assert files == ["answer.txt", "logs", "logs/trace.json"]
    # No byte of the host file was copied anywhere in the run directory.
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert HOST_SECRET.encode() not in path.read_bytes(), path
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict
    uploaded = [f for f in verdict["files"] if "/artifacts/" in f]
    assert sorted(f.split("/artifacts/")[1] for f in uploaded) == [
        "answer.txt",
        "answer.txt",
        "logs/trace.json",
        "logs/trace.json",
    ]


def test_each_refused_artifact_is_named_in_logs_txt(
    planted_run: tuple[Path, Path, pytest.RunResult],
) -> None:
    run_dir, _, _ = planted_run
    logs = (run_dir / "logs.txt").read_text()
    for row in read_index(run_dir):
        for name in ["abs-link", "logs/up-link", "dir-link", "back\\\\slash.txt", DEEP[0]]:
            assert f"artifact '{name}" in logs and row["rollout_id"] in logs, name
