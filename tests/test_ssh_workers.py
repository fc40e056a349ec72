"""xdist workers on other hosts (``--tx ssh=…``, execution/remote.py), through a real sshd.

Debian's openssh-server listens on 127.0.0.1 (tests/sshd.py). Its sessions see the plugin
and offline LiteLLM but none of the test's environment: the provider key and the
``[secrets]`` value reach the remote workers only over xdist's channel. The remote workers
run in a copy of the workspace at another path (``--osmosis-remote-root``), so anything
they wrote to their own disk would show there or in their TMPDIR.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sshd
from sdk_planner import sdk_judge
from test_shard import _comparable, _summary_bytes
from workspaces import CALC_ROLLOUT, calc_rows, read_index, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")
TOKEN = "calc-token-8c1f0d2e9b"  # the [secrets] value; only its digest is in the workspace
PROVIDER_KEY = "sk-test-model-server"  # model_env's OPENAI_API_KEY

#: The calc rollout, which also needs CALC_TOKEN (a row fails without it), says where it
#: ran (a line in GATE/where), and with metadata do=block waits for GATE/release.
ROLLOUT = CALC_ROLLOUT.replace(
    "        rollout = get_rollout_context()\n",
    """        import hashlib, os, pathlib
        token = os.environ.get("CALC_TOKEN", "")
        if hashlib.sha256(token.encode()).hexdigest() != TOKEN_DIGEST:
            raise RuntimeError("CALC_TOKEN did not reach this worker")
        gate = pathlib.Path(GATE)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        where = "ssh" if os.environ.get("SSH_CONNECTION") else "local"
        with open(gate / "where", "a") as log:
            log.write(f"{worker} {where} {os.getpid()}\\n")
        if do == "block":
            (gate / f"started-{worker}-{where}-{os.getpid()}").touch()
            while not (gate / "release").exists():
                await asyncio.sleep(0.05)
        rollout = get_rollout_context()
""",
)
assert ROLLOUT != CALC_ROLLOUT


@dataclass
class Remote:
    """The sshd, the remote host's copy of the workspace and its temporary directory."""

    server: sshd.Sshd
    root: Path
    tmp: Path
    gate: Path

    def tx(self) -> list[str]:
        """Two workers on the remote host, one here."""
        spec = self.server.tx(sys.executable)
        return ["-d", "--tx", spec, "--tx", spec, "--tx", "popen"]


@pytest.fixture
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    reason = sshd.missing()
    if reason is not None:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("ssh")
    tmp = base / "remote-tmp"
    tmp.mkdir()
    environ = {  # what the remote host has of its own: the plugin, offline LiteLLM
        name: os.environ[name]
        for name in (
            "PYTHONPATH",
            "LITELLM_LOCAL_MODEL_COST_MAP",
            "LITELLM_OFFLINE_MODE",
            "HF_HUB_OFFLINE",
            "PYTHONDONTWRITEBYTECODE",
        )
        if os.environ.get(name)
    }
    try:
        server = sshd.start(base / "sshd", {**environ, "TMPDIR": str(tmp)})
    except PermissionError as exc:  # not root: no /run/sshd
        pytest.skip(f"sshd cannot start here: {exc}")
    gate = base / "gate"
    gate.mkdir()
    yield Remote(server, base / "remote-workspace", tmp, gate)
    server.stop()


def _workspace(root: Path, gate: Path, rows: list[dict[str, Any]]) -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    source = ROLLOUT + f"\nTOKEN_DIGEST = {digest!r}\nGATE = {str(gate)!r}\n"
    write_workspace(root, rows=rows, rollout_source=source, secrets=["CALC_TOKEN"])


def _copy_workspace(source: Path, target: Path) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".osmosis", "*.env"))


def _args(
    pytester: pytest.Pytester,
    remote: Remote,
    name: str,
    tx: list[str] | None = None,
    root: Path | None = None,
) -> list[str]:
    secrets = pytester.path / "secrets.env"
    secrets.write_text(f"CALC_TOKEN={TOKEN}\n")
    return [
        "--osmosis-eval",
        "--osmosis-name",
        name,
        f"--osmosis-secrets-file={secrets}",
        f"--osmosis-remote-root={root or remote.root}",
        *(tx or remote.tx()),
        *PLAIN,
    ]


def _pytest(pytester: pytest.Pytester, args: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "CALC_TOKEN"}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _where(remote: Remote) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in (remote.gate / "where").read_text().splitlines():
        worker, where, _pid = line.split()
        found.setdefault(where, set()).add(worker)
    return found


def _files_holding(directory: Path, *values: str) -> list[str]:
    needles = [value.encode() for value in values]
    return [
        str(path)
        for path in directory.rglob("*")
        if path.is_file() and any(needle in path.read_bytes() for needle in needles)
    ]


def _asked(model_env: Any) -> list[str]:
    return [
        body["messages"][-1]["content"]
        for _, body in model_env.requests
        if body.get("messages") and body["messages"][-1]["content"].startswith("What is")
    ]


ROWS = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(9)])


def test_remote_workers_write_what_a_local_run_writes(
    pytester: pytest.Pytester, model_env: Any, remote: Remote
) -> None:
    _workspace(pytester.path, remote.gate, ROWS)
    _copy_workspace(pytester.path, remote.root)
    (pytester.path / "secrets.env").write_text(f"CALC_TOKEN={TOKEN}\n")
    local = pytester.runpytest(
        "--osmosis-eval",
        "--osmosis-name",
        "local",
        "--osmosis-secrets-file=secrets.env",
        "--junitxml=local.xml",
        *PLAIN,
    )
    assert local.ret == pytest.ExitCode.OK, local.stdout.str()
    (remote.gate / "where").unlink()

    process = _pytest(pytester, [*_args(pytester, remote, "ssh"), "--junitxml=ssh.xml"])
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out
    assert "9 work items pending, 4 in flight, on 3 xdist workers" in out, out
    where = _where(remote)
    assert where.get("ssh") == {"gw0", "gw1"} and where.get("local", set()) <= {"gw2"}, where

    runs = pytester.path / ".osmosis" / "evals"
    assert _comparable(runs / "ssh") == _comparable(runs / "local")
    assert _summary_bytes(runs / "ssh") == _summary_bytes(runs / "local")
    for row in read_index(runs / "ssh"):
        trial = runs / "ssh" / "rollout_trials" / row["rollout_id"]
        assert (trial / "trajectory.json").is_file()
    answers = sorted(p.read_text() for p in (runs / "ssh" / "rollout_trials").rglob("answer.txt"))
    assert answers == sorted(
        p.read_text() for p in (runs / "local" / "rollout_trials").rglob("answer.txt")
    )
    assert len(answers) == len(ROWS)
    assert sdk_judge(runs / "ssh")["accepted"]
    # JUnit: each remote row has the properties a local row has, its trajectory the file
    # the controller wrote from what the remote worker sent back.
    local_cases, ssh_cases = (_junit(pytester.path / f"{name}.xml") for name in ("local", "ssh"))
    assert sorted(ssh_cases) == sorted(local_cases) == sorted(f"row_{i}_run_0" for i in range(9))
    for name, properties in ssh_cases.items():
        assert sorted(properties) == sorted(local_cases[name]), name
        trajectory = Path(properties["osmosis_trajectory"])
        assert trajectory.parent.parent == runs / "ssh" / "rollout_trials", trajectory
        assert trajectory.name == "trajectory.json" and trajectory.is_file()
    # Only the controller wrote a run directory, and the remote host kept nothing secret.
    assert not (remote.root / ".osmosis").exists()
    assert list(remote.tmp.iterdir()) == []  # the workers' scratch directories are gone
    assert _files_holding(remote.root, TOKEN, PROVIDER_KEY) == []
    assert not (Path.home() / "pyexecnetcache").exists()
    assert TOKEN not in out and PROVIDER_KEY not in out


def _junit(path: Path) -> dict[str, dict[str, str]]:
    """Each JUnit test case's name -> its properties."""
    return {
        str(case.get("name")): {
            str(prop.get("name")): str(prop.get("value")) for prop in case.iter("property")
        }
        for case in ET.parse(path).iter("testcase")
    }


def test_a_killed_remote_worker_s_rows_run_elsewhere_once(
    pytester: pytest.Pytester, model_env: Any, remote: Remote
) -> None:
    rows = calc_rows([(f"What is {i} + 2?", str(i + 2), "block") for i in range(12)])
    _workspace(pytester.path, remote.gate, rows)
    _copy_workspace(pytester.path, remote.root)
    process = _pytest(pytester, _args(pytester, remote, "killed"))
    try:
        started = _wait_for(remote.gate, "started-gw0-ssh-", process)
        pid = int(started.name.rsplit("-", 1)[1])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert TOKEN.encode() not in cmdline and PROVIDER_KEY.encode() not in cmdline
        os.kill(pid, signal.SIGKILL)
        (remote.gate / "release").touch()
        out, _ = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, out
    assert "gw0" in out  # xdist said it lost the worker
    index = read_index(pytester.path / ".osmosis" / "evals" / "killed")
    assert sorted(r["row_index"] for r in index) == list(range(12))
    assert {r["status"] for r in index} == {"success"}, index
    asked = _asked(model_env)
    assert sorted(asked) == sorted(f"What is {i} + 2?" for i in range(12))  # none paid twice
    assert _files_holding(remote.root, TOKEN, PROVIDER_KEY) == []
    assert _files_holding(remote.tmp, TOKEN, PROVIDER_KEY) == []


def _wait_for(directory: Path, prefix: str, process: subprocess.Popen[str]) -> Path:
    """The first file named *prefix*… (the rollout's event), or fail if pytest ended first."""
    import time

    while process.poll() is None:
        found = sorted(directory.glob(prefix + "*"))
        if found:
            return found[0]
        time.sleep(0.05)
    out, _ = process.communicate()
    raise AssertionError(f"pytest ended before {prefix}*:\n{out}")


def test_a_differing_remote_workspace_is_one_line_before_any_row(
    pytester: pytest.Pytester, model_env: Any, remote: Remote
) -> None:
    _workspace(pytester.path, remote.gate, ROWS)
    _copy_workspace(pytester.path, remote.root)
    main = remote.root / "rollouts" / "calc" / "main.py"
    main.write_text(main.read_text() + "\n# edited there\n")
    (remote.root / "data" / "calc.jsonl").unlink()
    process = _pytest(pytester, _args(pytester, remote, "differs"))
    out, _ = process.communicate(timeout=900)
    assert process.returncode == pytest.ExitCode.USAGE_ERROR, out
    line = (
        f"osmosis: the workspace at {remote.root} on {sshd.HOST} differs from this one: "
        "data/calc.jsonl (missing), rollouts/calc/main.py (changed)"
    )
    assert line in out, out
    assert "Traceback" not in out
    assert _asked(model_env) == [] and not (remote.gate / "where").exists()
    assert not (pytester.path / ".osmosis" / "evals" / "differs").exists()


@pytest.mark.parametrize("why", ["refused", "no-plugin", "no-workspace"])
def test_a_remote_workspace_that_cannot_be_checked_is_one_line_before_any_row(
    pytester: pytest.Pytester, model_env: Any, remote: Remote, why: str
) -> None:
    """ssh refused (nothing listens on its port), the plugin not importable by the remote
    Python, the workspace not there: exit 4 with one line, and no run directory left."""
    _workspace(pytester.path, remote.gate, ROWS)
    _copy_workspace(pytester.path, remote.root)
    ssh_config, python, root = remote.server.ssh_config, sys.executable, remote.root
    if why == "refused":
        ssh_config = ssh_config.with_name("ssh_config_refused")
        port = f"Port {remote.server.port}\n"
        ssh_config.write_text(
            remote.server.ssh_config.read_text().replace(port, f"Port {sshd._free_port()}\n")
        )
    elif why == "no-plugin":  # the interpreter under the venv, isolated: no pytest_osmosis
        python = f"{os.path.realpath(sys.executable)} -I"
        if subprocess.run([*python.split(), "-c", "import pytest_osmosis"]).returncode == 0:
            pytest.skip(f"{python} imports pytest_osmosis: no Python here lacks it")
    else:
        root = remote.root.with_name("no-such-workspace")
    spec = f"ssh={sshd.HOST}//ssh_config={ssh_config}//python={python}"
    tx = ["-d", "--tx", spec, "--tx", "popen"]
    process = _pytest(pytester, _args(pytester, remote, why, tx=tx, root=root))
    out, _ = process.communicate(timeout=900)
    assert process.returncode == pytest.ExitCode.USAGE_ERROR, out
    where = f"the workspace at {root} on {sshd.HOST}"
    line = {
        "refused": f"cannot check {where}: ssh could not start {python} there (see above)",
        "no-plugin": f"cannot check {where}: ModuleNotFoundError: No module named 'pytest_osmosis'",
        "no-workspace": f"{where} does not exist (--osmosis-remote-root names it)",
    }[why]
    assert f"ERROR: osmosis: {line}\n" in out, out
    if why == "refused":  # what ssh said, before our line
        assert "Connection refused" in out.partition(line)[0], out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    assert _asked(model_env) == [] and not (remote.gate / "where").exists()
    runs = pytester.path / ".osmosis" / "evals"
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []  # (.locks)
    assert not (remote.root / ".osmosis").exists() and list(remote.tmp.iterdir()) == []
    assert root.exists() == (why != "no-workspace")  # checking it made no directory there


def test_paths_on_the_command_line_are_one_line_with_remote_workers(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """xdist maps paths to other hosts only under --rsyncdir (else a traceback): refused
    before any connection is made (the host named here does not exist)."""
    write_workspace(pytester.path, rows=ROWS)
    result = pytester.runpytest_subprocess(
        "configs/eval/calc.toml", "-d", "--tx", "ssh=osmosis-no-such-host//python=python", *PLAIN
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: osmosis: workers on other hosts (--tx ssh=...) cannot be given paths "
            "(configs/eval/calc.toml): select configs with --osmosis-eval and -k"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    runs = pytester.path / ".osmosis" / "evals"
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []  # (.locks)
