"""Server mode (issue 24): each rollout on its own server, driven over the rollout protocol
as ``osmosis eval run`` drives it, and the same rows, files and metrics as in process.

Real servers on 127.0.0.1: the SDK's bootstrap starts the rollout's own entrypoint in a
process group of its own; nothing here reaches the internet (uv runs offline). Needs
``osmosis-ai`` in this interpreter (the rollout servers run on it): .ci/run's SDK lane.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from workspaces import only_run_dir, read_index, toml_text

pytest.importorskip("osmosis_ai", reason="server mode runs osmosis-ai rollout servers")

pytest_plugins = ["pytester"]

ROLLOUTS = Path(__file__).resolve().parent / "sdk_rollouts"
MODEL = "openai/test-model"
#: The entrypoint serves its app as the SDK scaffold's main() does.
SERVE = """

if __name__ == "__main__":
    import os

    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]), log_level="info"
    )
"""


def row(question: str, label: str | None, do: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"user_prompt": question}
    if label is not None:
        out["ground_truth"] = label
    if do is not None:
        out["metadata"] = {"do": do}
    return out


ROWS = [
    row("What is 2 + 2?", "4"),
    row("What is 3 * 5?", "16"),  # graded low
    row("What is 1 + 1?", "2", "workflow_raise"),
    row("What is 1 + 1?", "2", "workflow_garbage"),
    row("What is 2 + 5?", "7", "source"),  # a sample from a registered SampleSource
    row("What is 2 + 3?", "5", "grader_raise"),
    row("What is 2 + 3?", "5", "grader_value_error"),
    row("What is 4 + 4?", "8", "skip"),
    row("What is 4 + 4?", "8", "no_reward"),
    {"user_prompt": "What is 1 + 2?", "metadata": {}},  # no label, no metadata: no grading
]


def add_config(
    root: Path,
    rows: list[dict[str, Any]],
    *,
    name: str,
    rollout: str,
    source: str = "mixed",
    serve: str = SERVE,
    evaluation: dict[str, Any] | None = None,
) -> Path:
    """``configs/eval/<name>.toml`` on ``rollouts/<rollout>``, a copy of an SDK rollout."""
    config = root / "configs" / "eval" / f"{name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        toml_text(rollout=rollout, model_path=MODEL, dataset=name, evaluation=evaluation)
    )
    (root / "configs" / "training").mkdir(parents=True, exist_ok=True)
    data = root / "data" / f"{name}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = root / "rollouts" / rollout
    if not target.exists():
        shutil.copytree(ROLLOUTS / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        main = target / "main.py"
        main.write_text(main.read_text() + serve)
    return config


def outcomes(run_dir: Path) -> list[tuple[Any, ...]]:
    return [
        (
            r["row_index"],
            r["status"],
            r.get("reward"),
            r.get("error_type"),
            r.get("tokens"),
            "trajectory_filename" in r,
        )
        for r in read_index(run_dir)
    ]


def summary(run_dir: Path) -> dict[str, Any]:
    metrics = json.loads((run_dir / "metrics.json").read_text())["summary"]
    return {k: v for k, v in metrics.items() if "duration" not in k}


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", *args)


def servers_left(root: Path) -> list[str]:
    """Processes still running code from under ``root`` (a rollout server left behind)."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in command and "serve_child.py" in command:
            left.append(command)
    return left


# --------------------------------------------------------------------------- same answers


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_server_mode_gives_the_rows_files_and_metrics_of_in_process_mode(
    pytester: pytest.Pytester, model_env: Any, xdist: tuple[str, ...]
) -> None:
    add_config(pytester.path, ROWS, name="mixed", rollout="mixed")
    inproc = run(pytester, "--osmosis-execution", "in-process", "--osmosis-name", "inproc")
    served = run(pytester, "--osmosis-execution", "server", "--osmosis-name", "served", *xdist)

    ours, theirs = pytester.path / ".osmosis/evals/inproc", pytester.path / ".osmosis/evals/served"
    assert outcomes(theirs) == outcomes(ours)
    assert summary(theirs) == summary(ours)
    assert served.parseoutcomes() == inproc.parseoutcomes()
    assert {"success", "failed", "skipped"} == {r[1] for r in outcomes(theirs)}
    for name in ("index.jsonl", "summary.jsonl", "progress.json", "metrics.json", "logs.txt"):
        assert (theirs / name).is_file(), name
    # The trajectories the server wrote are in the run directory, one per sampled attempt.
    rows = read_index(theirs)
    for record in rows:
        trajectory = theirs / "rollout_trials" / record["rollout_id"] / "trajectory.json"
        assert trajectory.is_file() == ("trajectory_filename" in record)
        if trajectory.is_file():
            extra = json.loads(trajectory.read_text())["extra"]["osmosis"]
            assert extra["request_extra_fields"] == {
                "row_index": record["row_index"],
                "run_index": 0,
            }
    # The artifacts dir is the SDK's: the rollout's writes land in the run directory.
    logs = (theirs / "logs.txt").read_text()
    assert "[rollout-server]" in logs
    # One server per process that runs rows: each xdist worker serves its own copy.
    assert logs.count("Uvicorn running on http://127.0.0.1:") == (2 if xdist else 1)
    if xdist:
        served.stdout.fnmatch_lines(["*each xdist worker starts its own server*"])
    assert servers_left(pytester.path) == []


def test_the_plan_and_the_results_table_say_where_each_config_ran(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    add_config(pytester.path, ROWS[:2], name="mixed", rollout="mixed")
    result = run(pytester, "--osmosis-execution", "server", "--osmosis-plan")
    result.stdout.fnmatch_lines(["*execution*server (--osmosis-execution server)*"])
    result = run(pytester, "--osmosis-execution", "server")
    result.stdout.fnmatch_lines(["*execution*server (--osmosis-execution server)*"])


def test_the_servers_output_reaches_logs_txt_with_its_secrets_redacted(
    pytester: pytest.Pytester, model_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "tok-" + "s3cr3t" * 4
    monkeypatch.setenv("ROLLOUT_TOKEN", token)
    chatty = SERVE.replace(
        "    import uvicorn\n",
        "    import uvicorn\n\n    print('token is', os.environ['ROLLOUT_TOKEN'], flush=True)\n",
    )
    config = add_config(pytester.path, ROWS[:1], name="chatty", rollout="chatty", serve=chatty)
    config.write_text(config.read_text().replace("required = []", 'required = ["ROLLOUT_TOKEN"]'))
    result = run(pytester, "--osmosis-execution", "server")
    result.assert_outcomes(passed=1)
    logs = (only_run_dir(pytester.path) / "logs.txt").read_text()
    assert "[rollout-server] token is [REDACTED]" in logs  # the secret reached the server
    assert token not in logs


# --------------------------------------------------------------------------- auto

PINNED = """
import os
from importlib import metadata

import uvicorn
from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


class Version(AgentWorkflow):
    async def run(self, ctx):
        answer = metadata.version("litellm")  # the LiteLLM of the environment it runs in
        return [*ctx.prompt, {"role": "assistant", "content": answer}]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


def main():
    backend = LocalBackend(workflow=Version, grader=Exact)
    port = int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    uvicorn.run(create_rollout_server(backend=backend), host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
"""

#: Below our floor (litellm>=1.108). Every real LiteLLM release below 1.108 includes
#: compromised builds, so none is ever installed: the rollout pins a wheel of this name
#: and version that the test writes itself, served to uv offline from a local folder.
OLD_LITELLM = "1.100.0"


def local_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A pure-Python wheel written by hand: uv installs it offline from find-links."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    entries = dict(files)
    entries[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    entries[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, text in entries.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    entries[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as wheel:
        for path, text in entries.items():
            wheel.writestr(path, text)


def test_auto_runs_a_rollout_pinning_an_older_litellm_on_its_own_environment_beside_one_in_process(
    pytester: pytest.Pytester, model_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session, two copies of one rollout that answers with the LiteLLM version it sees:
    ``current`` (no pyproject.toml) runs in process on the session's LiteLLM; ``old`` pins
    ``litellm==1.100.0``, which this environment does not satisfy, so auto syncs its own
    environment (uv, offline) and serves it there, while the session keeps its own. The
    ``old`` rows equal ``osmosis eval run``'s on that environment."""
    import sysconfig
    from importlib import metadata

    from sdk_planner import SDK_EVAL_RUN

    ours = metadata.version("litellm")
    assert ours != OLD_LITELLM
    root = pytester.path
    monkeypatch.setenv("UV_OFFLINE", "1")  # uv resolves from the local wheel only
    monkeypatch.setenv("UV_CACHE_DIR", str(root / "uv-cache"))
    rows = {
        "current": [row("Which LiteLLM?", ours), row("Which?", OLD_LITELLM)],
        "old": [row("Which LiteLLM?", OLD_LITELLM), row("Which?", ours)],
    }
    for name in rows:
        add_config(root, rows[name], name=name, rollout=name)
        (root / "rollouts" / name / "main.py").write_text(PINNED)
    old = root / "rollouts" / "old"
    stub = f"__version__ = {OLD_LITELLM!r}  # a stand-in: no real LiteLLM below 1.108\n"
    local_wheel(root / "wheels", "litellm", OLD_LITELLM, {"litellm/__init__.py": stub})
    (old / "pyproject.toml").write_text(
        '[project]\nname = "old-rollout"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
        f'dependencies = ["litellm=={OLD_LITELLM}"]\n\n'
        f'[tool.uv]\npackage = false\nfind-links = ["{root / "wheels"}"]\n'
    )
    # The rollout's environment gets osmosis-ai and uvicorn (which uv cannot fetch offline)
    # from this interpreter's site-packages through a .pth file, which uv sync leaves alone.
    # It comes after the environment's own site-packages: its litellm is the pinned one.
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv is not None
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(old / ".venv")], check=True)
    (site,) = (old / ".venv" / "lib").glob("python3.*/site-packages")
    (site / "_session.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    plan = run(pytester, "--osmosis-plan")
    plan.stdout.fnmatch_lines(
        ["*execution*in-process (a LocalBackend rollout this environment satisfies)*"]
    )
    plan.stdout.fnmatch_lines(
        [f"*execution*server (its pyproject.toml needs litellm=={OLD_LITELLM} (have {ours}))*"]
    )
    result = run(pytester)
    result.assert_outcomes(passed=2, failed=2)  # each config: its own version passes
    result.stdout.fnmatch_lines(
        [f"execution  server (its pyproject.toml needs litellm=={OLD_LITELLM}*"]
    )
    runs = {
        p.name.split("-")[0]: p
        for p in (root / ".osmosis" / "evals").iterdir()
        if p.is_dir() and not p.name.startswith(".")
    }
    ended = [("success", 1.0), ("success", 0.0)]
    for name in rows:
        assert [(r["status"], r["reward"]) for r in read_index(runs[name])] == ended, name
    assert f"+ litellm=={OLD_LITELLM}" in (runs["old"] / "logs.txt").read_text()  # uv sync's
    assert (old / "uv.lock").is_file()
    assert "[rollout-server]" not in (runs["current"] / "logs.txt").read_text()
    assert metadata.version("litellm") == ours  # the session's environment kept its own
    assert servers_left(root) == []

    # osmosis eval run on the rollout's environment (the SDK's bootstrap on its Python).
    python = old / ".venv" / "bin" / "python"
    args = [str(root), "old", "main.py", "old", "sdk-old", f"bootstrap={python}"]
    done = subprocess.run(
        [sys.executable, "-c", SDK_EVAL_RUN, *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert outcomes(root / "sdk-evals" / "sdk-old") == outcomes(runs["old"])


# --------------------------------------------------------------------------- failures


def test_a_server_that_never_becomes_healthy_is_the_configs_one_line_error(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    # The SDK repository's own example: serves on ROLLOUT_PORT, never on the supervisor's.
    wrong_port = SERVE.replace('os.environ["_OSMOSIS_ROLLOUT_PORT"]', "0")
    add_config(pytester.path, ROWS[:2], name="deaf", rollout="deaf", serve=wrong_port)
    add_config(pytester.path, ROWS[:2], name="fine", rollout="fine")
    pytester.makeini("[pytest]\nosmosis_server_start_timeout = 3\n")
    result = run(pytester, "--osmosis-execution", "server", "--continue-on-collection-errors")
    result.stdout.fnmatch_lines(
        ["*deaf/main.py: the rollout server did not become healthy within 3 s*"]
    )
    result.assert_outcomes(passed=1, failed=1, errors=1)
    assert servers_left(pytester.path) == []


def test_a_server_that_exits_at_start_is_the_configs_error_with_its_last_line(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    crash = SERVE.replace("    import uvicorn\n", "    raise SystemExit('no GPU here')\n")
    add_config(pytester.path, ROWS[:2], name="crash", rollout="crash", serve=crash)
    result = run(pytester, "--osmosis-execution", "server")
    result.stdout.fnmatch_lines(
        [
            "*crash/main.py: the rollout server exited with code 1 before becoming healthy: "
            "no GPU here*"
        ]
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    assert "no GPU here" in (only_run_dir(pytester.path) / "logs.txt").read_text()


@pytest.mark.parametrize(
    "serve", ["", "\n\ndef main() -> None:\n    pass\n"], ids=["no-main", "idle-main"]
)
def test_an_entrypoint_that_ends_without_serving_is_told_what_the_sdk_needs(
    pytester: pytest.Pytester, model_env: Any, serve: str
) -> None:
    """It ran to its end (exit code 0): the line says what the SDK's bootstrap expects of it
    (before: "the rollout server exited with code 0 before becoming healthy", no reason)."""
    add_config(pytester.path, ROWS[:2], name="idle", rollout="idle", serve=serve)
    result = run(pytester, "--osmosis-execution", "server")
    said = (
        f"{pytester.path / 'rollouts' / 'idle' / 'main.py'}: the rollout server ended (exit "
        "code 0) without serving: `osmosis eval run` runs the entrypoint as __main__ and "
        'needs it to serve from main(), called under `if __name__ == "__main__":`, with '
        "create_rollout_server(backend=...) run by uvicorn on "
        f'int(os.environ["_OSMOSIS_ROLLOUT_PORT"]); see {only_run_dir(pytester.path)}/logs.txt'
    )
    assert said in result.stdout.lines, result.stdout.str()
    assert "exited with code 0" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    assert servers_left(pytester.path) == []


def test_a_server_that_dies_mid_run_stops_the_session_with_the_rows_pending(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    rows = [row("What is 2 + 2?", "4"), row("die", "x", "die"), row("What is 3 * 5?", "15")]
    add_config(pytester.path, rows, name="dies", rollout="dies")
    main = pytester.path / "rollouts" / "dies" / "main.py"
    flag = pytester.path / "die-now"  # outside the rollout: its source digest stays the same
    flag.touch()
    main.write_text(
        main.read_text().replace(
            '        do = (ctx.metadata or {}).get("do", "")\n        if do == "workflow_raise"',
            '        do = (ctx.metadata or {}).get("do", "")\n'
            f'        if do == "die" and __import__("os").path.exists({str(flag)!r}):\n'
            '            __import__("os")._exit(3)\n'
            '        if do == "workflow_raise"',
            1,
        )
    )
    args = ("--osmosis-execution", "server", "--osmosis-name", "dies")
    result = run(pytester, *args, "--osmosis-concurrency", "1")
    result.stdout.fnmatch_lines(["*the rollout server of dies exited with code 3*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    run_dir = only_run_dir(pytester.path)
    recorded = [r["row_index"] for r in read_index(run_dir)]
    assert recorded == [0]  # the row the server died under, and the next, stay pending
    assert json.loads((run_dir / "metrics.json").read_text())["eval_run"]["status"] == (
        "incomplete"
    )
    assert servers_left(pytester.path) == []
    # Fixed, the same command resumes: only the pending rows run, on a new server.
    first = read_index(run_dir)[0]["rollout_id"]
    flag.unlink()
    again = run(pytester, *args)
    again.assert_outcomes(passed=2, failed=1)  # row 0 carried forward; row 1 graded low
    rows = read_index(run_dir)
    assert [r["row_index"] for r in rows] == [0, 1, 2] and rows[0]["rollout_id"] == first


def test_a_4xx_to_post_rollout_is_the_rows_rollout_protocol_error(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    # A server that refuses every rollout with 409, as the SDK's does a duplicate id.
    refusing = (
        """
from fastapi import FastAPI, HTTPException

app = FastAPI()


@app.get("/health")
async def health():
    import os

    return {"status": "ok", "instance_id": os.environ["_OSMOSIS_ROLLOUT_INSTANCE_ID"]}


@app.post("/rollout")
async def rollout():
    raise HTTPException(status_code=409, detail="rollout_id is already registered")
"""
        + SERVE
    )
    add_config(pytester.path, ROWS[:2], name="refuse", rollout="refuse")
    (pytester.path / "rollouts" / "refuse" / "main.py").write_text(refusing)
    result = run(pytester, "--osmosis-execution", "server")
    result.assert_outcomes(errors=2)
    rows = read_index(only_run_dir(pytester.path))
    assert [r["error_type"] for r in rows] == ["rollout_protocol_error"] * 2


# --------------------------------------------------------------------------- cleanup


def test_ctrl_c_and_sigterm_leave_no_rollout_server_behind(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    slow = [row("What is 1 + 1?", "2", "workflow_sleep:600")] * 4
    add_config(pytester.path, slow, name="slow", rollout="slow")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "--osmosis-eval",
                "-p",
                "no:cacheprovider",
                "--osmosis-execution",
                "server",
                "-q",
            ],
            cwd=pytester.path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(lambda: servers_left(pytester.path), f"a server before {sig.name}")
            child.send_signal(sig)
            child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
        _wait_for(lambda: not servers_left(pytester.path), f"no server after {sig.name}")


def _wait_for(condition: Any, what: str) -> None:
    """Wait on an event the test cannot be told about; the limit only guards a hang."""
    deadline = time.monotonic() + 120
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# --------------------------------------------------------------------------- the SDK's rules


def test_results_are_classified_as_the_sdks_runner_classifies_them() -> None:
    from osmosis_ai.eval.local.runner import _classify_outcome
    from osmosis_ai.rollout.types import RolloutResultResponse

    from pytest_osmosis.execution.server import classify

    sample = {"messages": [], "reward": 0.5}
    answers = [
        {"status": "success", "sample": sample},
        {"status": "success", "sample": {**sample, "remove_sample": True, "reward": None}},
        {
            "status": "failure",
            "sample": {**sample, "reward": None},
            "err_category": "timeout",
            "err_message": "workflow exceeded its 2s deadline",
        },
        {"status": "failure", "err_message": "grader exploded"},
        {"status": "failure"},
        {"status": "cancelled", "err_message": "cancelled"},
    ]
    for answer in answers:
        theirs = _classify_outcome(RolloutResultResponse(rollout_id="r", **answer))
        status, reward, error_type, _ = classify(answer)
        assert (status, reward, error_type) == (theirs[0], theirs[1], theirs[2]), answer
