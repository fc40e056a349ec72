"""Real osmosis-ai 0.3.8 rollouts run unchanged under ``pytest --osmosis-eval`` (issue 5).

Every rollout here is written the way ``osmosis rollout init`` and the SDK's integrations
write them (tests/sdk_rollouts/), imports only ``osmosis_ai``, and is run in process
against the loopback model server. The SDK itself is the oracle: its own ``LocalBackend``
and its server's per-rollout handler run the same rows directly in the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import re
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("osmosis_ai")

# Imported once for the whole module: in-process pytester runs restore sys.modules, and a
# class first imported inside one run would be a different object in the next.
import osmosis_ai.rollout as sdk  # noqa: E402
import osmosis_ai.rollout.server  # noqa: E402, F401
import uvicorn  # noqa: E402
from model_server import ModelServer, ToolRule, count_tokens  # noqa: E402
from osmosis_ai.eval.local.dataset import select_rows  # noqa: E402
from osmosis_ai.eval.local.runner import _classify_outcome  # noqa: E402
from osmosis_ai.rollout.server.app import _handle_rollout  # noqa: E402
from workspaces import free_port, only_run_dir, read_index, toml_text  # noqa: E402

from pytest_osmosis.execution.runner import Budgets, WorkItem, execute  # noqa: E402
from pytest_osmosis.model.bridge import Bridge  # noqa: E402
from pytest_osmosis.model.routes import ModelRoute  # noqa: E402
from pytest_osmosis.results import build_trajectory  # noqa: E402
from pytest_osmosis.workspace.loader import LoadedRollout  # noqa: E402

try:
    import agents
    import osmosis_ai.rollout.integrations.agents.openai_agents  # noqa: F401
except ImportError:  # the OpenAI Agents rows skip; everything else still runs
    agents = None
else:
    # Its tracer would post to api.openai.com at exit; rollouts that use it turn it off too.
    agents.set_tracing_disabled(True)

pytest_plugins = ["pytester"]

ROLLOUTS = Path(__file__).resolve().parent / "sdk_rollouts"
MODEL = "openai/test-model"


# --------------------------------------------------------------------------- helpers


def make_workspace(
    root: Path,
    source: str,
    rows: list[dict[str, Any]],
    *,
    rollout: str,
    name: str = "eval",
    evaluation: dict[str, Any] | None = None,
) -> Path:
    """A workspace whose rollout is a copy of ``tests/sdk_rollouts/<source>``."""
    config = root / "configs" / "eval" / f"{name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        toml_text(rollout=rollout, model_path=MODEL, dataset=name, evaluation=evaluation)
    )
    data = root / "data" / f"{name}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shutil.copytree(
        ROLLOUTS / source,
        root / "rollouts" / rollout,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return config


def row(question: str, label: str | None, do: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"user_prompt": question}
    if label is not None:
        out["ground_truth"] = label
    if do is not None:
        out["metadata"] = {"do": do}
    return out


def outcomes(run_dir: Path) -> list[tuple[int, str, float | None, str | None]]:
    return [
        (r["row_index"], r["status"], r.get("reward"), r.get("error_type"))
        for r in read_index(run_dir)
    ]


def trial_file(run_dir: Path, rollout_id: str, name: str) -> str:
    return (run_dir / "rollout_trials" / rollout_id / "artifacts" / name).read_text()



def port_is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def uvicorn_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every call of ``uvicorn.run`` (answered without serving), for in-process runs."""
    calls: list[Any] = []

    def spy(app: Any, *args: Any, **kwargs: Any) -> None:
        calls.append((app, args, kwargs))

    monkeypatch.setattr(uvicorn, "run", spy)
    return calls


@contextlib.contextmanager
def import_file(path: Path, name: str) -> Iterator[ModuleType]:
    """Import ``path`` as module ``name`` with its directory importable; undone afterwards."""
    before_modules = set(sys.modules)
    before_path = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = before_path
        for added in set(sys.modules) - before_modules:
            sys.modules.pop(added, None)


# --------------------------------------------------------------------------- shapes


AGENT_ROWS = [
    row("Use the calculator: what is 2 plus 3?", "The sum is 5"),
    # No trigger: the model answers without the tool, and the grader wants the tool used.
    row("What is 6 * 7?", "42"),
]


@pytest.mark.skipif(agents is None, reason="needs openai-agents")
def test_scaffold_with_openai_agents_calls_a_tool_and_is_graded_on_the_sample(
    pytester: pytest.Pytester, model_env: ModelServer, uvicorn_calls: list[Any]
) -> None:
    model_env.tool_rules = [ToolRule("Use the calculator", "add", {"a": 2, "b": 3})]
    model_env.tool_answer = "The sum is {result}"
    make_workspace(pytester.path, "scaffold_agents", AGENT_ROWS, rollout="calc-agent")

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=1)
    assert uvicorn_calls == []  # main() was stopped once its LocalBackend existed
    run_dir = only_run_dir(pytester.path)
    assert outcomes(run_dir) == [(0, "success", 1.0, None), (1, "success", 0.0, None)]
    first = read_index(run_dir)[0]
    rollout_id = first["rollout_id"]

    # The workflow ran with the SDK's own contexts, pointed at our bridge for this rollout.
    ctx_type, rollout_type, seen_id, url = trial_file(
        run_dir, rollout_id, "workflow_seen.txt"
    ).splitlines()
    assert ctx_type == "osmosis_ai.rollout.context.AgentWorkflowContext"
    assert rollout_type == "osmosis_ai.rollout.context.RolloutContext"
    assert seen_id == rollout_id
    assert url.startswith("http://127.0.0.1:") and url.endswith(f"/v1/rollouts/{rollout_id}")

    # The grader read the SDK sample collected from OsmosisMemorySession: a real tool round.
    grader_seen = trial_file(run_dir, rollout_id, "grader_seen.txt").splitlines()
    assert grader_seen == [
        "osmosis_ai.rollout.context.GraderContext",
        "osmosis_ai.rollout.types.sample.RolloutSample",
        "calls=['add']",
        "outputs=['5']",
        "answer=The sum is 5",
    ]
    # The second model call of row 0 carried the tool's own result back to the model.
    tool_turns = [
        body for body in model_env.bodies if any(m.get("role") == "tool" for m in body["messages"])
    ]
    assert len(tool_turns) == 1
    assert tool_turns[0]["messages"][-1]["content"] == "5"
    assert {t["function"]["name"] for t in tool_turns[0]["tools"]} == {"add"}

    # The trajectory is the converted conversation: the call, its observation, the answer.
    trajectory = json.loads(
        (run_dir / "rollout_trials" / rollout_id / "trajectory.json").read_text()
    )
    steps = trajectory["steps"]
    assert [s["source"] for s in steps] == ["user", "agent", "agent"]
    assert steps[1]["tool_calls"][0]["function_name"] == "add"
    assert steps[1]["tool_calls"][0]["arguments"] == {"a": 2, "b": 3}
    assert steps[1]["observation"]["results"][0]["content"] == "5"
    assert steps[2]["message"] == "The sum is 5"
    assert trajectory["agent"]["version"] == sdk_version()


def sdk_version() -> str:
    from importlib.metadata import version

    return version("osmosis-ai")


def test_scaffold_main_never_starts_uvicorn_in_a_real_pytest_process(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spy here: if main() ran past its backend, uvicorn would bind the port and serve
    forever, and this run would never finish."""
    port = free_port()
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_PORT", str(port))
    make_workspace(
        pytester.path,
        "own_project",
        [row("What is 2 + 2?", "4"), row("What is 9 - 3?", "6")],
        rollout="calc-tools",
    )

    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", timeout=240)

    result.assert_outcomes(passed=2)
    assert "Uvicorn running" not in result.stdout.str() + result.stderr.str()
    assert not port_is_listening(port)
    assert outcomes(only_run_dir(pytester.path)) == [
        (0, "success", 1.0, None),
        (1, "success", 1.0, None),
    ]


def test_module_level_backend_and_app(
    pytester: pytest.Pytester, model_env: ModelServer, uvicorn_calls: list[Any]
) -> None:
    root_handlers = list(logging.getLogger().handlers)
    make_workspace(
        pytester.path,
        "module_backend",
        [row("What is 6 * 7?", "42"), row("What is 2 + 2?", "5")],
        rollout="echo-calc",
    )

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "-rA")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*reward 0.00 < pass_threshold 1.00 (row 1, run 0)*"])
    assert uvicorn_calls == []
    # create_rollout_server() at import configures logging only when nothing else has.
    assert logging.getLogger().handlers == root_handlers
    run_dir = only_run_dir(pytester.path)
    assert outcomes(run_dir) == [(0, "success", 1.0, None), (1, "success", 0.0, None)]
    # AgentWorkflowOutput.metrics became the sample's metrics, as LocalBackend does it.
    first = read_index(run_dir)[0]
    trajectory = json.loads(
        (run_dir / "rollout_trials" / first["rollout_id"] / "trajectory.json").read_text()
    )
    assert trajectory["extra"]["osmosis"]["sample_metrics"] == {"completion_tokens": 1.0}


def test_package_beside_main_with_absolute_imports_and_dotted_strings(
    pytester: pytest.Pytester, model_env: ModelServer, uvicorn_calls: list[Any]
) -> None:
    model_env.tool_rules = [ToolRule("multiply", "multiply", {"a": 6, "b": 7})]
    make_workspace(
        pytester.path,
        "package_layout",
        [
            row("Please multiply 6 by 7.", "42"),
            # Answered without the tool: the grader gives 0 for that.
            row("What is 6 * 7?", "42"),
        ],
        rollout="tool-calc",
    )

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=1)
    assert uvicorn_calls == []
    run_dir = only_run_dir(pytester.path)
    assert outcomes(run_dir) == [(0, "success", 1.0, None), (1, "success", 0.0, None)]
    # The tool ran in the rollout's package and its result went back to the model.
    tool_turns = [b for b in model_env.bodies if b["messages"][-1].get("role") == "tool"]
    assert [t["messages"][-1]["content"] for t in tool_turns] == ["42"]
    trajectory = json.loads(
        (
            run_dir / "rollout_trials" / read_index(run_dir)[0]["rollout_id"] / "trajectory.json"
        ).read_text()
    )
    assert trajectory["steps"][1]["tool_calls"][0]["function_name"] == "multiply"
    assert trajectory["steps"][1]["observation"]["results"][0]["content"] == "42"


def test_module_level_backend_naming_main_by_string(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """``"main:Workflow"`` makes LocalBackend import main.py again as ``main``, whose own
    module-level backend is built inside the first one's constructor: still one rollout."""
    make_workspace(pytester.path, "module_backend", [row("What is 1 + 2?", "3")], rollout="s")
    main = pytester.path / "rollouts" / "s" / "main.py"
    main.write_text(
        main.read_text().replace(
            "LocalBackend(workflow=EchoCalcWorkflow, grader=ExactGrader)",
            'LocalBackend(workflow="main:EchoCalcWorkflow", grader="main:ExactGrader")',
        )
    )
    assert '"main:EchoCalcWorkflow"' in main.read_text()

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)


def test_rollout_that_is_its_own_project(
    pytester: pytest.Pytester, model_env: ModelServer, uvicorn_calls: list[Any]
) -> None:
    make_workspace(
        pytester.path,
        "own_project",
        [row("What is 2 + 2?", "4"), row("What is 10 / 4?", "3")],
        rollout="calc-tools",
    )
    assert (pytester.path / "rollouts" / "calc-tools" / "pyproject.toml").is_file()

    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=1)
    assert uvicorn_calls == []
    assert outcomes(only_run_dir(pytester.path)) == [
        (0, "success", 1.0, None),
        (1, "success", 0.0, None),
    ]


# --------------------------------------------------------------------------- same answers

BUDGET_S = 2.0
MIXED_ROWS = [
    row("What is 2 + 2?", "4"),
    row("What is 3 * 5?", "16"),  # graded low
    row("What is 1 + 1?", "2", "workflow_raise"),
    row("What is 1 + 1?", "2", "workflow_own_timeout"),  # a TimeoutError of its own
    row("What is 1 + 1?", "2", "workflow_garbage"),
    row("What is 1 + 1?", "2", "no_messages"),
    row("What is 1 + 1?", "2", "empty_messages"),  # graded, but no trajectory can be formed
    row("What is 2 + 5?", "7", "source"),  # sample from a registered SampleSource
    # The grader registers a source of its own (an agent session built while grading).
    row("What is 2 + 5?", "7", "grader_builds_session"),
    row("What is 2 + 3?", "5", "grader_raise"),
    row("What is 2 + 3?", "5", "grader_value_error"),
    row("What is 2 + 3?", "5", "reward_then_raise"),
    row("What is 4 + 4?", "8", "skip"),
    row("What is 4 + 4?", "8", "no_reward"),
    row("What is 4 + 4?", "8", "nan"),
    {"user_prompt": "What is 1 + 2?", "metadata": {}},  # no label, no metadata: no grading
    row("What is 1 + 1?", "2", "workflow_sleep:30"),
    row("What is 2 + 3?", "5", "grader_sleep:30"),
]
# Our budget errors name the phase; the SDK's wire category is one shared "timeout".
OURS_TO_SDK = {"workflow_timeout": "timeout", "grader_timeout": "timeout"}


def test_every_row_ends_as_the_sdks_own_local_backend_ends_it(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    budgets = {"agent_workflow_timeout_s": BUDGET_S, "grader_timeout_s": BUDGET_S}
    config = make_workspace(pytester.path, "mixed", MIXED_ROWS, rollout="mixed", evaluation=budgets)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    run_dir = only_run_dir(pytester.path)
    ours = [
        (index, status, reward, OURS_TO_SDK.get(error, error))
        for index, status, reward, error in outcomes(run_dir)
    ]
    ours_trajectories = [bool(r.get("trajectory_filename")) for r in read_index(run_dir)]

    # The SDK: its dataset reader, its LocalBackend, its server's per-rollout handler (which
    # enters the RolloutContext, calls execute(ExecutionRequest) and nulls failed rewards),
    # and 0.3.8's runner classification. The model endpoint is the same model server.
    artifact_root = tmp_path / "sdk-trials"
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(artifact_root))
    entrypoint = config.parents[2] / "rollouts" / "mixed" / "main.py"
    sdk_rows = select_rows(config.parents[2] / "data" / "eval.jsonl").rows
    theirs: list[tuple[int, str, float | None, str | None]] = []
    their_trajectories: list[bool] = []
    their_ids: list[str] = []
    with import_file(entrypoint, f"sdk_mixed_{uuid.uuid4().hex}") as module:
        assert isinstance(module.backend, sdk.LocalBackend)

        async def run_all() -> None:
            for data in sdk_rows:
                rollout_id = uuid.uuid4().hex
                response = await _handle_rollout(
                    module.backend,
                    sdk.RolloutInitRequest(
                        initial_messages=data.initial_messages,
                        label=data.label,
                        metadata=data.metadata,
                        rollout_id=rollout_id,
                        chat_completions_url=model_env.url,
                        llm_api_key="sdk-key",
                        agent_timeout_sec=BUDGET_S,
                        grader_timeout_sec=BUDGET_S,
                        extra_fields={"row_index": data.row_index, "run_index": 0},
                    ),
                )
                status, reward, error = _classify_outcome(response)
                theirs.append((data.row_index, status, reward, error and str(error)))
                their_trajectories.append(
                    (artifact_root / rollout_id / "trajectory.json").is_file()
                )
                their_ids.append(rollout_id)

        asyncio.run(run_all())

    assert ours == theirs
    assert ours_trajectories == their_trajectories
    # And the trajectories are the SDK's documents, up to the rollout id.
    for record, their_id in zip(read_index(run_dir), their_ids, strict=True):
        if record.get("trajectory_filename"):
            mine = run_dir / "rollout_trials" / record["rollout_id"] / "trajectory.json"
            theirs_doc = artifact_root / their_id / "trajectory.json"
            assert comparable(mine, record["rollout_id"]) == comparable(theirs_doc, their_id), (
                record["row_index"]
            )
    # The workspace really covers every kind of ending.
    assert {status for _, status, _, _ in theirs} == {"success", "failed", "skipped"}
    assert {error for *_, error in theirs} == {
        None,
        "agent_error",
        "timeout",
        "validation_error",
        "rollout_failed",
    }
    statuses = [status for _, status, _, _ in ours]  # an error is a pytest error, not a failure
    result.assert_outcomes(
        passed=3, failed=statuses.count("success") - 3, errors=statuses.count("failed"), skipped=1
    )


def comparable(path: Path, rollout_id: str) -> dict[str, Any]:
    """A trajectory without what legitimately differs between the two runs.

    Per-call metrics: the SDK's local run passes no controller report, ours may add the
    bridge's. ``extra.osmosis.label``: the SDK falls back to the row's label when the
    sample has none (a SampleSource sample); pytest-osmosis's writer passes the sample's.
    """
    doc = json.loads(path.read_text().replace(rollout_id, "<rollout-id>"))
    for step in doc["steps"]:
        step.pop("metrics", None)
        step.pop("llm_call_count", None)
    doc["final_metrics"] = {"total_steps": doc["final_metrics"]["total_steps"]}
    doc["extra"]["osmosis"].pop("label", None)
    return dict(doc)


# --------------------------------------------------------------------------- usage per call


@pytest.mark.skipif(agents is None, reason="needs openai-agents")
def test_each_model_call_lands_on_its_agent_step(
    model_loop: Any, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The bridge records every call of a rollout; the runner hands the workflow's calls to
    the trajectory writer, which puts one on each agent step as the SDK's report does."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    model_server.tool_rules = [ToolRule("Use the calculator", "add", {"a": 2, "b": 3})]
    model_server.tool_answer = "The sum is {result}"
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-bridge"})
    bridge = Bridge(route)
    model_loop.run(bridge.start())
    written: dict[str, Any] = {}

    def write(rollout_id: str, sample: Any, work: WorkItem, step_usage: Any) -> bool:
        written["usage"] = step_usage
        written["doc"] = build_trajectory(
            rollout_id=rollout_id,
            messages=list(sample.trajectory_messages),
            label=work.label,
            reward=sample.reward,
            sample_metrics=dict(sample.metrics),
            sample_extra_fields=dict(sample.extra_fields),
            request_metadata=work.metadata,
            request_extra_fields={"row_index": 0, "run_index": 0},
            sdk_version=sdk_version(),
            step_usage=step_usage,
        )
        return True

    try:
        with import_file(ROLLOUTS / "scaffold_agents" / "main.py", "sdk_agents_main") as main:
            loaded = LoadedRollout(
                entrypoint=ROLLOUTS / "scaffold_agents" / "main.py",
                workflow_cls=main.MyAgentWorkflow,
                workflow_config=main.workflow_config,
                grader_cls=main.MyGrader,
                grader_config=main.grader_config,
                found_by="test",
            )
            work = WorkItem(
                row_index=0,
                run_index=0,
                source_row_index=0,
                prompt=[{"role": "user", "content": AGENT_ROWS[0]["user_prompt"]}],
                label=AGENT_ROWS[0]["ground_truth"],
                metadata=None,
            )
            result = model_loop.run(
                execute(
                    work,
                    loaded,
                    bridge=bridge,
                    budgets=Budgets(None, None),
                    pass_threshold=1.0,
                    prepare_artifacts=lambda rid: None,
                    write_trajectory=write,
                )
            )
    finally:
        model_loop.run(bridge.close())

    assert (result["status"], result["reward"]) == ("success", 1.0)
    doc = written["doc"]
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert len(agent_steps) == len(model_server.bodies) == 2
    for step, body in zip(agent_steps, model_server.bodies, strict=True):
        prompt = count_tokens(" ".join(str(m.get("content") or "") for m in body["messages"]))
        assert step["metrics"]["prompt_tokens"] == max(1, prompt)
        assert step["metrics"]["completion_tokens"] >= 1
        assert step["llm_call_count"] == 1
    totals = doc["final_metrics"]
    assert totals["total_prompt_tokens"] + totals["total_completion_tokens"] == result["tokens"]
    assert "unmatched_llm_call_metrics" not in doc["extra"]["osmosis"]


# --------------------------------------------------------------------------- bridge


@pytest.fixture
def bridge(model_loop: Any, model_server: ModelServer) -> Iterator[Bridge]:
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-bridge"})
    started = Bridge(route)
    model_loop.run(started.start())
    yield started
    model_loop.run(started.close())


def test_bridge_keeps_each_calls_usage_per_rollout_in_order(
    model_loop: Any, bridge: Bridge
) -> None:
    import openai

    def client(rollout_id: str) -> openai.AsyncOpenAI:
        url, key = bridge.open_rollout(rollout_id)
        return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)

    first, other = client("first"), client("other")

    async def calls() -> list[Any]:
        usages = []
        plain = await first.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is 2 + 2?"}]
        )
        usages.append(plain.usage)
        stream = await first.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "say the words one two three"}],
            stream=True,
        )
        usages.append([chunk.usage async for chunk in stream][-1])
        await other.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is 1 + 1?"}]
        )
        return usages

    usages = model_loop.run(calls())

    assert bridge.call_usage("first") == [
        {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
        for u in usages
    ]
    assert len(bridge.call_usage("other")) == 1
    total = sum(u.total_tokens for u in usages)
    assert bridge.close_rollout("first") == total
    assert bridge.call_usage("first") == []  # closed rollouts keep nothing
    assert bridge.call_usage("never-opened") == []


def test_bridge_forwards_the_inference_fields_agent_integrations_send(
    model_loop: Any, bridge: Bridge, model_server: ModelServer
) -> None:
    """Structured output (an Agent's ``output_type``), stop words and newer token limits
    reach the provider, as osmosis-ai 0.3.8's bridge forwards them."""
    import openai

    url, key = bridge.open_rollout("fields")
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    fields = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Answer", "schema": schema},
        },
        "stop": ["STOP"],
        "max_completion_tokens": 64,
    }

    model_loop.run(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], **fields
        )
    )

    sent = model_server.bodies[-1]
    for name, value in fields.items():
        assert sent[name] == value


# --------------------------------------------------------------------------- the sample


class _Uncopyable:
    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("cannot be copied")


@pytest.mark.parametrize("kind", ["json", "objects", "uncopyable"])
def test_the_grader_gets_the_sample_the_sdks_local_backend_builds(
    kind: str,
    model_loop: Any,
    bridge: Bridge,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The runner builds the workflow output's sample itself (runner._sample, passing the
    trajectory messages it copied); the SDK's class gets the same values and set fields
    as from its own LocalBackend, down to the SDK's fallback for messages it cannot copy."""
    shared = {"role": "assistant", "content": "4"}
    content: Any = {
        "json": "What is 2 + 2?",
        "objects": ("a tuple", 2.5),
        "uncopyable": _Uncopyable(),
    }[kind]
    seen: list[Any] = []

    class Workflow(sdk.AgentWorkflow[Any]):
        async def run(self, ctx: Any) -> Any:
            messages = [{"role": "user", "content": content}, shared, shared]
            return sdk.AgentWorkflowOutput(messages=messages, metrics={"steps": 3})

    class Grader(sdk.Grader):
        async def grade(self, ctx: Any) -> None:
            seen.append(
                (type(ctx.sample), ctx.sample.model_dump(), set(ctx.sample.model_fields_set))
            )
            ctx.set_reward(1.0)

    loaded = LoadedRollout(
        entrypoint=tmp_path / "main.py",
        workflow_cls=Workflow,
        workflow_config=None,
        grader_cls=Grader,
        grader_config=None,
        found_by="test",
    )
    work = WorkItem(0, 0, 0, [{"role": "user", "content": "q"}], "4", None)
    result = model_loop.run(
        execute(
            work,
            loaded,
            bridge=bridge,
            budgets=Budgets(None, None),
            pass_threshold=1.0,
            prepare_artifacts=lambda rid: None,
            write_trajectory=lambda *args: True,
        )
    )
    assert result["status"] == "success"

    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(tmp_path / "sdk-trials"))
    backend = sdk.LocalBackend(workflow=Workflow, grader=Grader)
    request = sdk.ExecutionRequest(id=uuid.uuid4().hex, prompt=work.prompt, label=work.label)
    outcome = asyncio.run(backend.execute(request))
    assert outcome.result.status is sdk.RolloutStatus.SUCCESS

    ours, theirs = seen
    assert ours[0] is theirs[0] is sdk.RolloutSample
    assert ours[2] == theirs[2]
    # Equal values (an object without equality compares by its repr, less its address).
    assert re.sub(" at 0x[0-9a-f]+", "", repr(ours[1])) == re.sub(
        " at 0x[0-9a-f]+", "", repr(theirs[1])
    )
    assert (ours[1]["trajectory_messages"] is None) == (kind == "uncopyable")
