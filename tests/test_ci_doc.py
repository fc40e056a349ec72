"""docs/ci.md's GitHub Actions workflow, run step by step: its shell commands for real (the
matrix's four shards, the merge, the comment, the gate), its actions as GitHub would do
them (artifacts copied, the checkout is the workspace), ``gh`` recorded instead of called;
and ``pytest-osmosis gate`` against the session's own gate."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from test_shard import ROWS
from workspaces import write_workspace

DOC = Path(__file__).resolve().parents[1] / "docs" / "ci.md"
RUN_ID, PR = "4242", "7"


@dataclass
class Step:
    job: str
    uses: str | None = None
    run: str | None = None
    with_: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def workflow_steps(text: str) -> tuple[list[Step], list[str]]:
    """The steps of the doc's one workflow, in order, and the shard job's matrix.

    A reader of the YAML subset the doc uses (block maps, ``run: |`` blocks), so the test
    needs no YAML library on every Python.
    """
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None, "docs/ci.md has no yaml block"
    lines = block.group(1).splitlines()
    steps: list[Step] = []
    matrix: list[str] = []
    job = ""
    at = 0
    while at < len(lines):
        line = lines[at]
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        at += 1
        if indent == 2 and body.endswith(":"):
            job = body[:-1]
        elif body.startswith("shard: ["):
            matrix = [part.strip() for part in body[len("shard: [") : -1].split(",")]
        elif body.startswith("- ") and job:
            steps.append(Step(job))
            body = body[2:]
            indent += 2
        if not steps or indent < 6 or not job:
            continue
        step = steps[-1]
        key, _, value = body.partition(":")
        value = value.strip()
        if key in ("with", "env"):
            target = step.with_ if key == "with" else step.env
            while at < len(lines) and len(lines[at]) - len(lines[at].lstrip()) > indent:
                inner_key, _, inner = lines[at].strip().partition(":")
                target[inner_key] = inner.strip().strip('"')
                at += 1
        elif key == "uses":
            step.uses = value
        elif key == "run" and value == "|":
            script = []
            while at < len(lines) and (
                not lines[at].strip() or len(lines[at]) - len(lines[at].lstrip()) > indent
            ):
                script.append(lines[at].strip())
                at += 1
            step.run = "\n".join(script)
        elif key == "run":
            step.run = value
    return steps, matrix


def _expand(text: str, shard: str, env: dict[str, str]) -> str:
    values = {
        "github.run_id": RUN_ID,
        "matrix.shard": shard,
        "github.event.pull_request.number": PR,
        "github.token": "gh-token",
        "secrets.OPENAI_API_KEY": env.get("OPENAI_API_KEY", ""),
    }

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in values, f"the test knows no value for {match.group(0)}"
        return values[match.group(1)]

    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", value, text)


def _fake_gh(bin_dir: Path, record: Path) -> None:
    gh = bin_dir / "gh"
    gh.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$@" > {record}\ncat "$(eval echo \\${{$#}})" >> {record}\n'
    )
    gh.chmod(gh.stat().st_mode | stat.S_IEXEC)


def test_the_documented_workflow_runs(pytester: pytest.Pytester, model_env: ModelServer, tmp_path: Path) -> None:
    steps, matrix = workflow_steps(DOC.read_text())
    assert matrix == ["1", "2", "3", "4"]
    assert {step.job for step in steps} == {"shard", "merge"}
    write_workspace(pytester.path, rows=ROWS, evaluation={"n": 2})
    artifacts = tmp_path / "artifacts"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh_record = tmp_path / "gh.txt"
    _fake_gh(bin_dir, gh_record)
    summary = tmp_path / "step-summary.md"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
        + os.environ["PATH"],
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    ran: list[str] = []

    def run_job(job: str, shard: str, checkout: Path) -> None:
        for step in (s for s in steps if s.job == job):
            if step.uses is not None:
                _act(step, shard, checkout, artifacts, env)
                continue
            assert step.run is not None
            if step.run == "pip install pytest-osmosis":
                continue  # installed: this is its own checkout
            step_env = {**env, **{k: _expand(v, shard, env) for k, v in step.env.items()}}
            step_env["GITHUB_WORKSPACE"] = str(checkout)
            done = subprocess.run(
                ["bash", "-e", "-c", _expand(step.run, shard, env)],
                cwd=checkout,
                env=step_env,
                capture_output=True,
                text=True,
                check=False,
            )
            ran.append(step.run.split()[0])
            if not step.run.startswith("pytest-osmosis gate "):
                assert done.returncode == 0, (step.run, done.stdout, done.stderr)
                continue
            # 6 of 9 scored attempts pass: below 0.8, so the gate fails the workflow.
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert done.stdout.startswith("osmosis gate FAILED\n"), done.stdout
            assert "::error file=data/calc.jsonl,line=" in done.stdout

    for shard in matrix:  # each job on a checkout of its own
        checkout = tmp_path / f"job-{shard}"
        shutil.copytree(pytester.path, checkout)
        run_job("shard", shard, checkout)
    merge_checkout = tmp_path / "merge-job"
    shutil.copytree(pytester.path, merge_checkout)
    shutil.rmtree(merge_checkout / ".osmosis", ignore_errors=True)
    run_job("merge", "", merge_checkout)

    merged = merge_checkout / ".osmosis" / "evals" / f"pr-{RUN_ID}"
    assert sdk_judge(merged)["accepted"]
    uploaded = artifacts / "eval-run"
    assert (uploaded / "index.jsonl").read_bytes() == (merged / "index.jsonl").read_bytes()
    index = [json.loads(line) for line in (merged / "index.jsonl").read_text().splitlines()]
    assert len(index) == 20
    assert gh_record.read_text().startswith(f"pr\ncomment\n{PR}\n--body-file\ncomment.md\n")
    assert "pr-" + RUN_ID in gh_record.read_text()  # the report of the merged run
    assert "### Gate: FAILED" in summary.read_text()
    assert ran == ["status=0"] * 4 + ["pytest-osmosis"] * 3


def _act(step: Step, shard: str, checkout: Path, artifacts: Path, env: dict[str, str]) -> None:
    """What an action does, as far as the next steps can tell."""
    action = step.uses or ""
    if action.startswith(("actions/checkout@", "actions/setup-python@")):
        return  # the job's checkout is a copy of the workspace; this Python runs it
    if action.startswith("actions/upload-artifact@"):
        name = _expand(step.with_["name"], shard, env)
        source = checkout / _expand(step.with_["path"], shard, env)
        assert step.with_.get("include-hidden-files") == "true" or name == "eval-run"
        shutil.copytree(source, artifacts / name)
        return
    if action.startswith("actions/download-artifact@"):
        pattern = step.with_["pattern"]
        target = checkout / step.with_["path"]
        for found in sorted(artifacts.glob(pattern)):
            shutil.copytree(found, target / found.name)  # one directory per artifact
        return
    raise AssertionError(f"the test cannot play {action}")


def test_the_gate_command_judges_as_the_session_did(
    pytester: pytest.Pytester, model_env: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib
    import io

    from pytest_osmosis.cli import main

    write_workspace(pytester.path, rows=ROWS, evaluation={"n": 2})
    gate = ("--osmosis-min-pass-rate", "0.6", "--osmosis-row-pass", "1/2")
    session = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "r", *gate, "-p", "no:randomly"
    )
    lines = session.stdout.lines
    at = next(i for i, line in enumerate(lines) if "osmosis gate" in line)
    reasons = [line for line in lines[at + 1 :] if line.startswith("r: ")]
    assert reasons
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.chdir(pytester.path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["gate", "r", *gate])
    word = "PASSED" if session.ret == 0 else "FAILED"
    assert code == session.ret
    printed = out.getvalue().splitlines()
    assert printed[0] == f"osmosis gate {word}"
    assert printed[1 : 1 + len(reasons)] == reasons
    assert f"### Gate: {word}" in summary.read_text()
    # No rule, or a run that is not finished: one line, exit 2 / 1.
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["gate", "r"]) == 2
    assert "no gate rule given" in err.getvalue()
    metrics = pytester.path / ".osmosis" / "evals" / "r" / "metrics.json"
    doc = json.loads(metrics.read_text())
    doc["eval_run"]["status"] = "incomplete"
    metrics.write_text(json.dumps(doc))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["gate", "r", *gate]) == 1
    assert "not finished" in err.getvalue() and err.getvalue().count("\n") == 1
