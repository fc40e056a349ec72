"""The model calls ``osmosis eval run`` makes are the ones we make (issue 12, points 5 and 6).

The same workspace runs twice against one loopback model server: once under osmosis-ai
0.3.8's own local runner (its LiteLLM bridge, its rollout server in a child process,
``LocalEvalOptions.server_interpreter`` so no ``uv`` is needed: offline), once under
``pytest --osmosis-eval``. The server records every provider request; both runs must have
sent the same ones (API path, model, parameters) and kept the same number in flight.
Both run in ``OSMOSIS_SDK_PYTHON`` (a rollout written for the SDK imports ``osmosis_ai``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, ToolRule
from sdk_planner import SDK_EVAL_RUN, SDK_MISSING, SDK_PYTHON, sdk_python_imports
from workspaces import toml_text

pytestmark = pytest.mark.skipif(
    not sdk_python_imports("osmosis_ai.eval.local.runner, uvicorn, httpx"),
    reason=f"osmosis-ai's local runner: {SDK_MISSING}",
)

ROLLOUT = """
import json
import os

import httpx
import uvicorn
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import get_rollout_context
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import AgentWorkflowConfig

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
FIELDS = {
    "temperature": 0.2,
    "top_p": 0.9,
    "max_tokens": 64,
    "seed": 7,
    "user": "row-user",
    "stop": ["STOP"],
    "metadata": {"suite": "routes"},
    "tool_choice": "auto",
    "extra_body": {"top_k": 3},
}


class ToolWorkflow(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        url = rollout.chat_completions_url + "/chat/completions"
        headers = {"Authorization": f"Bearer {rollout.api_key}"}
        messages = list(ctx.prompt)
        async with httpx.AsyncClient(timeout=120) as client:
            first = await client.post(
                url,
                headers=headers,
                json={"model": "openai/osmosis-rollout", "messages": messages, "tools": TOOLS, **FIELDS},
            )
            first.raise_for_status()
            message = first.json()["choices"][0]["message"]
            call = message["tool_calls"][0]
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "5"},
            ]
            second = await client.post(
                url,
                headers=headers,
                json={"model": "m", "messages": messages, "tools": TOOLS, "stream": True},
            )
            second.raise_for_status()
        chunk = next(
            line for line in second.text.splitlines() if line.startswith("data: {")
        )
        answer = json.loads(chunk[len("data: "):])["choices"][0]["delta"]["content"]
        return [*messages, {"role": "assistant", "content": answer}]


class ExactGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if list(ctx.sample.messages)[-1]["content"] == ctx.label else 0.0)


def main():
    backend = LocalBackend(workflow=ToolWorkflow, grader=ExactGrader, WORKFLOW_CONFIG)
    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")),
    )


if __name__ == "__main__":
    main()
"""


ROWS = [
    {"user_prompt": "Use the calculator: what is 2 plus 3?", "ground_truth": "The sum is 5"},
    {"user_prompt": "Use the calculator: what is 1 plus 4?", "ground_truth": "The sum is 5"},
    {"user_prompt": "Use the calculator: what is 3 plus 2?", "ground_truth": "The sum is 5"},
]


def _workspace(root: Path, workflow_config: str) -> None:
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "configs" / "eval" / "eval.toml").write_text(
        toml_text(rollout="calc", model_path="openai/test-model", dataset="eval")
    )
    (root / "data").mkdir()
    (root / "data" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "rollouts" / "calc").mkdir(parents=True)
    (root / "rollouts" / "calc" / "main.py").write_text(
        ROLLOUT.replace("WORKFLOW_CONFIG", f"workflow_config={workflow_config}")
    )


def _provider_calls(server: ModelServer) -> list[tuple[str, dict[str, Any]]]:
    """What reached the provider for the rows, in a stable order (the preflight left out)."""
    calls = [
        # Tool call ids are the server's sequence numbers: the same call in either run.
        (path, json.loads(re.sub(r"call_\d+", "call_N", json.dumps(body))))
        for path, body in server.requests
        if '"hi"' not in json.dumps(body)  # the preflight's one-word prompt
    ]
    return sorted(calls, key=lambda call: json.dumps(call, sort_keys=True))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("workflow_config", "in_flight"),
    [('AgentWorkflowConfig(name="calc")', 1), ("None", 3)],
    ids=["template-workflow-config", "no-workflow-config"],
)
def test_our_provider_calls_and_concurrency_are_osmosis_eval_runs(
    model_server: ModelServer, tmp_path: Path, workflow_config: str, in_flight: int
) -> None:
    env = {**os.environ, **model_server.env()}
    env.pop("PYTEST_ADDOPTS", None)
    peaks = []
    seen = []
    for name, argv in [
        (
            "sdk",
            [
                str(SDK_PYTHON),
                "-c",
                SDK_EVAL_RUN,
                "{root}",
                "calc",
                "main.py",
                "eval",
                "sdk",
                "python",
            ],
        ),
        ("ours", [str(SDK_PYTHON), "-m", "pytest", "--osmosis-eval", "-p", "no:cacheprovider"]),
    ]:
        root = tmp_path / name
        _workspace(root, workflow_config)
        model_server.reset()
        # Calls are held until as many rows are in flight as the SDK allows (a 1 s wait
        # when only one may be): the peak each run reaches is its bound, not a race.
        model_server.tool_rules = [ToolRule("Use the calculator", "add", {"a": 2, "b": 3})]
        model_server.tool_answer = "The sum is {result}"
        model_server.gather, model_server.gather_on = max(in_flight, 2), "calculator"
        model_server.gather_timeout = 1.0 if in_flight == 1 else 60.0
        done = _run([a.replace("{root}", str(root)) for a in argv], root, env)
        assert done.returncode == 0, f"{name}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        seen.append(_provider_calls(model_server))
        peaks.append(model_server.peak_in_flight)
    sdk, ours = seen
    assert len(sdk) == 2 * len(ROWS), sdk
    assert [path for path, _ in ours] == [path for path, _ in sdk]
    assert ours == sdk
    # Every inference field travelled, as JSON to an OpenAI-compatible endpoint.
    first = next(body for _, body in sdk if "seed" in body)
    assert (first["seed"], first["user"], first["top_k"], first["metadata"]) == (
        7,
        "row-user",
        3,
        {"suite": "routes"},
    )
    assert peaks == [in_flight, in_flight]
