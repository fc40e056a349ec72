"""``--osmosis-upload`` and ``pytest-osmosis upload``: the SDK's own ``osmosis eval upload``
against a stand-in for the platform on loopback (tests/platform_server.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_server import ModelServer
from platform_server import PlatformServer
from sdk_planner import SDK_PYTHON, sdk_judge
from workspaces import calc_rows, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")
TOKEN = "osm-token-4fd1c2b7a9e3"
ALL_PASS = calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")])
ONE_FAILS = calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "16")])

needs_sdk = pytest.mark.skipif(
    SDK_PYTHON is None or not (SDK_PYTHON.parent / "osmosis").exists(),
    reason="no osmosis command of an osmosis-ai install (OSMOSIS_SDK_PYTHON)",
)


@pytest.fixture
def platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[PlatformServer]:
    """The stand-in, and the SDK's environment pointing at it (its `osmosis` on PATH)."""
    server = PlatformServer().start()
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", server.url)
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", server.url)
    monkeypatch.setenv("OSMOSIS_ALLOW_INSECURE_PLATFORM_URL", "1")
    monkeypatch.setenv("OSMOSIS_TOKEN", TOKEN)
    if SDK_PYTHON is not None:
        monkeypatch.setenv("PATH", f"{SDK_PYTHON.parent}{os.pathsep}{os.environ['PATH']}")
    yield server
    server.stop()


def _git_workspace(root: Path, rows: list[dict[str, str]]) -> None:
    """A workspace as the SDK's upload wants it: a Git checkout with `origin`, scaffolded."""
    write_workspace(root, rows=rows)
    (root / "configs" / "training").mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(
        ["git", "remote", "add", "origin", "https://github.com/acme/evals.git"],
        cwd=root,
        check=True,
    )


def _received_equals_run(server: PlatformServer, run_dir: Path) -> None:
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict
    assert sorted(server.files) == verdict["files"]
    for path, data in server.files.items():
        assert (run_dir / path).read_bytes() == data, path
    assert server.finalized


@needs_sdk
def test_a_passing_session_uploads_its_run(
    pytester: pytest.Pytester, model_env: ModelServer, platform: PlatformServer
) -> None:
    _git_workspace(pytester.path, ALL_PASS)
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "r", "--osmosis-upload", "on-pass", *PLAIN
    )
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str() + result.stderr.str()
    assert f"upload     Uploaded local evaluation: imported View: {platform.url}/e/1" in out
    _received_equals_run(platform, pytester.path / ".osmosis" / "evals" / "r")
    assert TOKEN not in out
    assert all(h.get("Authorization") == f"Bearer {TOKEN}" for h in platform.headers)


@needs_sdk
def test_on_pass_does_not_upload_a_failing_session_and_always_does(
    pytester: pytest.Pytester, model_env: ModelServer, platform: PlatformServer
) -> None:
    _git_workspace(pytester.path, ONE_FAILS)
    args = ("--osmosis-eval", "--osmosis-name", "r", *PLAIN)
    result = pytester.runpytest(*args, "--osmosis-upload", "on-pass")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "upload     not uploaded: the session did not pass" in result.stdout.str()
    assert not platform.files and not platform.headers
    result = pytester.runpytest(*args, "--osmosis-upload", "always")
    assert "upload     Uploaded local evaluation" in result.stdout.str()
    _received_equals_run(platform, pytester.path / ".osmosis" / "evals" / "r")


@needs_sdk
def test_a_5xx_mid_upload_is_retried_then_one_line(
    pytester: pytest.Pytester, model_env: ModelServer, platform: PlatformServer
) -> None:
    _git_workspace(pytester.path, ALL_PASS)
    platform.fail_uploads = 2  # the SDK retries a PUT with backoff: it gets through
    args = ("--osmosis-eval", "--osmosis-name", "r", "--osmosis-upload", "always", *PLAIN)
    assert pytester.runpytest(*args).ret == pytest.ExitCode.OK
    assert platform.failed == 2
    _received_equals_run(platform, pytester.path / ".osmosis" / "evals" / "r")
    # Down for good: the SDK gives up after its retries; one line, exit 1.
    platform.fail_uploads, platform.failed, platform.files = 10**6, 0, {}
    from pytest_osmosis.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["upload", "r"])  # pytester's directory is the working directory
    assert code == 1
    line = err.getvalue()
    assert line.count("\n") == 1 and line.startswith("upload of run r failed (exit 1): ")
    assert "Upload failed after 5 attempts (last failure: HTTP 503)" in line, line
    assert platform.failed == 5 and TOKEN not in line


def test_an_unfinished_run_is_never_uploaded(
    pytester: pytest.Pytester, model_env: ModelServer, platform: PlatformServer
) -> None:
    _git_workspace(pytester.path, ALL_PASS)
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "r", "-k", "row_0_", *PLAIN)
    metrics = pytester.path / ".osmosis" / "evals" / "r" / "metrics.json"
    assert json.loads(metrics.read_text())["eval_run"]["status"] == "incomplete"
    from pytest_osmosis.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["upload", "r"]) == 1
    assert err.getvalue() == "not uploaded: run r is incomplete, not finished\n"
    assert not platform.headers


def test_without_the_sdk_it_says_how_to_install_it(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_osmosis.results.upload as upload

    monkeypatch.setattr(upload, "sdk_command", lambda: None)
    _git_workspace(pytester.path, ALL_PASS)
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "r", "--osmosis-upload", "always", *PLAIN
    )
    assert f"upload     not uploaded: {upload.INSTALL}" in result.stdout.str()
    assert result.ret == pytest.ExitCode.OK


def test_a_bad_upload_mode_is_one_line(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--osmosis-upload", "sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--osmosis-upload: must be on-pass or always, got 'sometimes'" in result.stderr.str()
