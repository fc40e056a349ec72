"""Each rollout runs its own code (issue 12.1), and nothing runs that is not a LocalBackend
or that would serve (issue 12.2).

The official workspace template ships several rollouts with a package of the same name
(``multiply_rollout/``); the workspaces here do the same, with answers and rewards that say
whose code ran, imports at module level, imports inside the workflow and grader bodies (run
time, while the other rollout's rows share the event loop) and ``"module:attr"`` strings.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import read_index, toml_text

from pytest_osmosis.results import source_digest
from pytest_osmosis.workspace import loader

pytest_plugins = ["pytester"]

ROWS = [{"user_prompt": f"row {i}", "ground_truth": "x"} for i in range(4)]

MAIN = """
import asyncio

from multiply_rollout.identity import NAME
from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(0.01)  # let the other rollout's rows run in between
        from multiply_rollout.helpers import who  # first imported here, at run time

        answer = f"{{NAME}}:{{who()}}"
        return AgentWorkflowOutput(messages=[*ctx.prompt, {{"role": "assistant", "content": answer}}])


class Scorer(Grader):
    async def grade(self, ctx):
        import multiply_rollout.scoring

        ctx.set_reward(multiply_rollout.scoring.reward(list(ctx.sample.messages)[-1]["content"]))


{backend}
"""

PACKAGE = {
    "__init__.py": "",
    "identity.py": 'NAME = "{name}"\n',
    "helpers.py": 'def who():\n    return "{name}"\n',
    "scoring.py": (
        'def reward(answer):\n    return {reward} if answer == "{name}:{name}" else 0.0\n'
    ),
}


def write_rollout(root: Path, name: str, reward: float, backend: str) -> Path:
    directory = root / "rollouts" / name
    (directory / "multiply_rollout").mkdir(parents=True)
    (directory / "main.py").write_text(MAIN.format(backend=backend))
    for file, text in PACKAGE.items():
        (directory / "multiply_rollout" / file).write_text(text.format(name=name, reward=reward))
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
        '[tool.setuptools]\npackages = ["multiply_rollout"]\n'
    )
    return directory


def write_config(root: Path, name: str, rollout: str) -> None:
    config = root / "configs" / "eval" / f"{name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        toml_text(rollout=rollout, dataset="rows", evaluation={"pass_threshold": 0.5})
    )


def two_rollout_workspace(root: Path) -> None:
    """alpha builds its backend from classes, beta from ``module:attr`` strings."""
    write_rollout(root, "alpha", 1.0, "backend = LocalBackend(workflow=Workflow, grader=Scorer)")
    write_rollout(
        root,
        "beta",
        0.5,
        'def main():\n    LocalBackend(workflow="main:Workflow", grader="main:Scorer")\n',
    )
    data = root / "data" / "rows.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    write_config(root, "alpha", "alpha")
    write_config(root, "beta", "beta")


def run_dirs(root: Path) -> dict[str, Path]:
    runs = [p for p in (root / ".osmosis" / "evals").iterdir() if not p.name.startswith(".")]
    by_rollout = {}
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        by_rollout[manifest["inputs"]["rollout"]["name"]] = run
    return by_rollout


# --------------------------------------------------------------------------- point 1


@pytest.mark.parametrize(
    ("xdist", "installed"),
    [((), False), (("-n", "2"), False), ((), True)],
    ids=["single", "xdist", "alpha-pip-installed"],
)
def test_same_named_packages_each_rollout_runs_its_own_code(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    xdist: tuple[str, ...],
    installed: bool,
) -> None:
    two_rollout_workspace(pytester.path)
    if installed:
        # ``pip install -e rollouts/alpha`` (flat layout) puts the project dir on the path:
        # ``multiply_rollout`` then resolves to alpha's for any importer but beta's own code.
        alpha = str(pytester.path / "rollouts" / "alpha")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([alpha, os.environ.get("PYTHONPATH", "")]))

    result = pytester.runpytest_subprocess(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-concurrency", "8", *xdist
    )

    result.assert_outcomes(passed=8)
    runs = run_dirs(pytester.path)
    for name, reward in (("alpha", 1.0), ("beta", 0.5)):
        run = runs[name]
        assert [r["reward"] for r in read_index(run)] == [reward] * 4, name
        for record in read_index(run):
            trajectory = json.loads(
                (run / "rollout_trials" / record["rollout_id"] / "trajectory.json").read_text()
            )
            assert json.dumps(trajectory).count(f"{name}:{name}") >= 1, name
        manifest = json.loads((run / "manifest.json").read_text())
        rollout_dir = pytester.path / "rollouts" / name
        assert manifest["inputs"]["rollout"]["source_digest"] == source_digest(rollout_dir)
    # The SDK's own planner accepts each run, each under its own rollout and digest.
    digests = set()
    for run in runs.values():
        verdict = sdk_judge(run)
        assert verdict["accepted"], verdict
        digests.add(
            json.loads((run / "manifest.json").read_text())["inputs"]["rollout"]["source_digest"]
        )
    assert len(digests) == 2


@pytest.mark.parametrize(
    "selection", [("--osmosis-eval",), ("configs/eval/b.toml",)], ids=["both", "b-alone"]
)
def test_a_package_installed_from_another_rollout_is_refused(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    selection: tuple[str, ...],
) -> None:
    """``pip install -e rollouts/a`` (src layout) makes ``multiply_rollout`` resolve to a's
    copy for every importer: b would run a's code under b's digest. Running b's config
    alone is refused too, so the line advises what helps (it once said "run their configs
    in separate sessions", which a session of b alone had already done)."""
    for name in ("a", "b"):
        package = pytester.path / "rollouts" / name / "src" / "multiply_rollout"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f'NAME = "{name}"\n')
        (package.parent.parent / "main.py").write_text(
            "from multiply_rollout import NAME\n"
            "from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend\n"
            "class W(AgentWorkflow):\n"
            "    async def run(self, ctx):\n"
            "        return [*ctx.prompt, {'role': 'assistant', 'content': NAME}]\n"
            "class G(Grader):\n"
            "    async def grade(self, ctx):\n"
            "        ctx.set_reward(1.0)\n"
            "backend = LocalBackend(workflow=W, grader=G)\n"
        )
        write_config(pytester.path, name, name)
    data = pytester.path / "data" / "rows.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps(ROWS[0]) + "\n")
    # What an editable install of rollout a puts on the path (a .pth line).
    monkeypatch.syspath_prepend(str(pytester.path / "rollouts" / "a" / "src"))

    result = pytester.runpytest(*selection, "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    installed = pytester.path / "rollouts" / "a" / "src" / "multiply_rollout" / "__init__.py"
    assert (
        f"{pytester.path / 'rollouts' / 'b' / 'main.py'}: rollouts 'b' and 'a': package "
        f"'multiply_rollout' imported by rollout 'b' resolves to {installed} (installed from "
        "rollout 'a'), so rollout 'b' would run code of rollout 'a' under its own source "
        "digest: ship a copy of the package inside rollouts/b/, or move the shared package "
        "out of rollouts/ and install it from there"
    ) in result.stdout.str()
    assert "separate sessions" not in result.stdout.str()


def test_lazy_import_at_run_time_resolves_to_the_importing_rollout(tmp_path: Path) -> None:
    """Unit level: two loaded rollouts, then the first run-time imports in either order."""
    for name in ("one", "two"):
        package = tmp_path / "rollouts" / name / "multiply_rollout"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "late.py").write_text(f'NAME = "{name}"\n')
        (package.parent / "main.py").write_text(
            "import importlib\n"
            "def statement():\n"
            "    from multiply_rollout.late import NAME\n"
            "    return NAME\n"
            "def by_importlib():\n"
            "    return importlib.import_module('multiply_rollout.late').NAME\n"
        )
    from pytest_osmosis.workspace import isolation

    modules = {}
    for name in ("one", "two"):
        rollout = isolation.register((tmp_path / "rollouts" / name).resolve())
        with isolation.loading(rollout):
            modules[name] = isolation.import_module(rollout, Path("main.py"))
    assert modules["two"].statement() == "two"
    assert modules["one"].statement() == "one"
    assert "multiply_rollout" not in sys.modules
    # A bare importlib name two rollouts ship is refused rather than shared.
    with pytest.raises(Exception, match="ambiguous"):
        modules["one"].by_importlib()


# --------------------------------------------------------------------------- point 2


def backend_workspace(root: Path, source: str, ini: str = "") -> None:
    """A workspace whose rollout ``r`` is ``source``, run in process: these tests are about
    the loader's own refusals (``auto`` runs a refused rollout on its server instead,
    tests/test_server_mode.py)."""
    directory = root / "rollouts" / "r"
    directory.mkdir(parents=True)
    (directory / "main.py").write_text(textwrap.dedent(source))
    write_config(root, "eval", "r")
    data = root / "data" / "rows.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(ROWS[0]) + "\n")
    (root / "pytest.ini").write_text(f"[pytest]\nosmosis_execution = in-process\n{ini}\n")


CLASSES = """
    import threading
    from pytest_osmosis.rollout import AgentWorkflow, ExecutionBackend, Grader, LocalBackend

    RAN = []

    class W(AgentWorkflow):
        async def run(self, ctx):
            RAN.append("host")
            return [*ctx.prompt, {"role": "assistant", "content": "x"}]

    class G(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)

    class SandboxBackend(ExecutionBackend):
        def __init__(self, workflow, grader):
            RAN.append("constructed")

        async def execute(self, request):
            raise AssertionError("sandboxed code ran in process")
"""


@pytest.mark.parametrize(
    "where",
    [
        "def main():\n    SandboxBackend(W, G)\n    raise SystemExit(0)\n",
        "backend = SandboxBackend(W, G)\n",
    ],
    ids=["main", "module"],
)
def test_a_backend_that_is_not_local_is_refused_at_collection(
    pytester: pytest.Pytester, model_env: ModelServer, where: str
) -> None:
    backend_workspace(pytester.path, CLASSES + textwrap.indent(where, "    "))

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*main.py: it builds SandboxBackend (*), an ExecutionBackend that is not a "
            "LocalBackend at *main.py:*; in process pytest-osmosis runs only LocalBackend "
            "rollouts: run it as the SDK does, with `--osmosis-execution server` or "
            "`osmosis eval run`"
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_main_that_blocks_is_bounded_and_names_the_rollout(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    backend_workspace(
        pytester.path,
        CLASSES + "    def main():\n        threading.Event().wait()\n",
        ini="osmosis_main_timeout = 0.2",
    )

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=120)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*main.py: main() of rollout 'r' did not build its backend within 0.2s*"]
    )


def test_a_bad_main_timeout_is_a_usage_error(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    backend_workspace(pytester.path, CLASSES, ini="osmosis_main_timeout = soon")

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*osmosis_main_timeout: must be a positive number of seconds, got 'soon'*"]
    )


def test_main_starting_a_loopback_server_is_refused(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """A fake server start: without the guard, main() would serve forever."""
    backend_workspace(
        pytester.path,
        CLASSES
        + "    def main():\n"
        + "        import socket\n"
        + "        server = socket.create_server(('127.0.0.1', 0))\n"
        + "        server.accept()\n",
    )

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=120)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*main.py: main() listens on 127.0.0.1:* at *main.py:* before building its "
            "LocalBackend; build the LocalBackend first*"
        ]
    )
    assert "eval run" not in result.stdout.str()  # a LocalBackend rollout: no SDK advice


def test_main_calling_uvicorn_run_is_refused(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    pytest.importorskip("uvicorn")
    port = _free_port()
    backend_workspace(
        pytester.path,
        CLASSES
        + "    import uvicorn\n"
        + "    def main():\n"
        + f"        uvicorn.run(lambda scope, receive, send: None, host='127.0.0.1', port={port})\n",
    )

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=120)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*main.py: main() starts a server (uvicorn.run) at *r/main.py:* before building "
            "its LocalBackend; build the LocalBackend first*"
        ]
    )


def test_sdk_execution_backend_subclass_is_refused(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    pytest.importorskip("osmosis_ai")
    backend_workspace(
        pytester.path,
        CLASSES.replace("pytest_osmosis.rollout", "osmosis_ai.rollout")
        + "    def main():\n        SandboxBackend(W, G)\n",
    )

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*it builds SandboxBackend (*), an ExecutionBackend*"])


def test_harbor_backend_is_refused(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    pytest.importorskip("osmosis_ai.rollout.backend.harbor.backend")
    backend_workspace(
        pytester.path,
        CLASSES
        + "    from osmosis_ai.rollout.backend.harbor import HarborBackend\n"
        + "    def main():\n"
        + "        HarborBackend(orchestrator=None, tasks_dir='tasks', grader=G)\n",
    )

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*it builds HarborBackend (*)*`--osmosis-execution server` or `osmosis eval run`"]
    )


def test_non_loopback_bind_in_any_thread_is_refused_while_a_rollout_loads() -> None:
    """The guard answers before the bind happens: nothing is ever bound to 0.0.0.0."""
    caught: list[BaseException] = []

    def other_thread() -> None:
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", 0))
            except BaseException as exc:  # the guard's refusal is a BaseException
                caught.append(exc)

    with loader._guard.watch() as load:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert [refusal.what for refusal in load.refusals] == ["binds 0.0.0.0:0"]
    assert len(caught) == 1
    with socket.socket() as sock:  # idle again: a loopback bind outside a load is normal
        sock.bind(("127.0.0.1", 0))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: Any = sock.getsockname()[1]
        return int(port)


# ------------------------------------------------- what serves, what does not (issue 24)

PROBE = """
    import socket

    # urllib3's IPv6 probe, run when it is first imported (util/connection.py, HAS_IPV6).
    for family, host in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
        probe = None
        try:
            probe = socket.socket(family)
            probe.bind((host, 0))
        except Exception:
            pass
        if probe:
            probe.close()
    backend = LocalBackend(workflow=W, grader=G)
"""


def test_a_loopback_bind_on_port_zero_while_importing_is_no_server(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """In a fresh interpreter, as a user's run: refused before ("binds ::1:0")."""
    backend_workspace(pytester.path, CLASSES + PROBE)

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=120)

    result.assert_outcomes(passed=1)


def test_a_library_serving_at_import_is_refused_naming_its_line_and_the_rollouts(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    library = pytester.path / "site"
    library.mkdir()
    (library / "metrics_server.py").write_text(
        f"import socket\n\nSERVER = socket.socket()\nSERVER.bind(('127.0.0.1', {port}))\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{library}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    backend_workspace(pytester.path, "import metrics_server\n" + textwrap.dedent(CLASSES))

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=120)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*r/main.py: it binds 127.0.0.1:{port} at metrics_server.py:4, reached from "
            "*r/main.py:1 while being imported; pytest-osmosis imports the rollout, as "
            "`osmosis eval submit` does, and nothing may serve then: start the server in "
            'main() or under `if __name__ == "__main__":`'
        ]
    )
    assert "eval run" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


SERVING_MAIN = """
    import os
    import socket

    def main():
        backend = LocalBackend(workflow=W, grader=G)
        {serve}
"""
RIGHT_PORT = "socket.create_server(('127.0.0.1', int(os.environ['_OSMOSIS_ROLLOUT_PORT'])))"
OWN_PORT = "socket.create_server(('127.0.0.1', int(os.environ.get('ROLLOUT_PORT', 8000))))"


@pytest.mark.parametrize(
    ("serve", "warning"),
    [
        (RIGHT_PORT, None),
        (
            OWN_PORT,
            "osmosis: warning: *r/main.py: main() serves on port 8000, not on the one "
            "_OSMOSIS_ROLLOUT_PORT names: `osmosis eval run` will not reach it (serve on "
            "int(os.environ?*_OSMOSIS_ROLLOUT_PORT*))",
        ),
        (
            "return backend",
            "osmosis: warning: *r/main.py: main() builds its LocalBackend but returned "
            "without serving it: `osmosis eval run` will not reach it*",
        ),
    ],
    ids=["osmosis-port", "own-port", "never-serves"],
)
def test_main_that_osmosis_eval_run_cannot_reach_runs_with_a_warning(
    pytester: pytest.Pytester, model_env: ModelServer, serve: str, warning: str | None
) -> None:
    """main() runs until it serves; the port it would serve on is the one osmosis eval run
    waits on, or one line says it never will be. Nothing is ever bound (the guard answers
    before the bind)."""
    backend_workspace(pytester.path, CLASSES + SERVING_MAIN.format(serve=serve))
    (pytester.path / "configs" / "training").mkdir()

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
    if warning is None:
        assert "osmosis: warning" not in result.stdout.str()
    else:
        result.stdout.fnmatch_lines([warning])
        assert result.stdout.str().count("osmosis: warning") == 1


def test_a_workspace_without_configs_training_runs_with_a_warning(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    backend_workspace(pytester.path, CLASSES + "    backend = LocalBackend(workflow=W, grader=G)\n")

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            f"osmosis: warning: {pytester.path}: no configs/training/ directory: "
            "`osmosis eval run` refuses a workspace without one (an empty configs/training/ "
            "will do)"
        ]
    )
