"""Build Osmosis workspaces on disk for the plugin's tests.

``write_workspace`` lays out ``configs/eval/<name>.toml``, ``data/<dataset>.jsonl`` and
``rollouts/<rollout>/main.py``. The default rollout asks the model through the bridge and
grades by exact match; a row's metadata can make it misbehave on purpose
(``{"do": "workflow_raise"}`` etc.) so one workspace covers every outcome.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# In-process pytester runs restore sys.modules afterwards, so anything first imported
# inside one is imported again by the next. Import LiteLLM once here: it costs 3 s a time,
# and its importlib_metadata backport deletes the stdlib finder's find_distributions, so a
# copy first imported inside a run would leave later runs unable to find pytest11 plugins.
import importlib_metadata  # noqa: F401
import litellm  # noqa: F401
import pytest

CALC_ROLLOUT = """
import asyncio
import json
import math

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, get_rollout_context,
)


class CalcWorkflow(AgentWorkflow):
    async def run(self, ctx):
        do = (ctx.metadata or {}).get("do", "")
        if do == "workflow_raise":
            raise RuntimeError("workflow exploded on purpose")
        if do.startswith("workflow_sleep:"):
            await asyncio.sleep(float(do.split(":")[1]))
        if do == "workflow_garbage":
            return 42
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "anything", "messages": ctx.prompt},
            )
            response.raise_for_status()
            body = response.json()
        answer = body["choices"][0]["message"]["content"]
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "answer.txt").write_text(answer)
        return AgentWorkflowOutput(
            messages=[*ctx.prompt, {"role": "assistant", "content": answer, "usage": body["usage"]}]
        )


class ExactGrader(Grader):
    async def grade(self, ctx):
        do = (ctx.metadata or {}).get("do", "")
        if do == "skip":
            ctx.sample.remove_sample = True
            return
        if do == "grader_raise":
            raise RuntimeError("grader exploded on purpose")
        if do.startswith("grader_sleep:"):
            await asyncio.sleep(float(do.split(":")[1]))
        if do == "nan":
            ctx.set_reward(math.nan)
            return
        if do == "no_reward":
            return
        final = list(ctx.sample.messages)[-1]["content"].strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.0)


backend = LocalBackend(workflow=CalcWorkflow, grader=ExactGrader)
"""


def toml_text(
    *,
    rollout: str = "calc",
    entrypoint: str = "main.py",
    model_path: str = "openai/test-model",
    dataset: str = "calc",
    evaluation: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    lines = [
        "[experiment]",
        f'rollout = "{rollout}"',
        f'entrypoint = "{entrypoint}"',
        f'model_path = "{model_path}"',
        f'dataset = "{dataset}"',
    ]
    if evaluation:
        lines.append("[evaluation]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in evaluation.items()]
    if env:
        lines.append("[env]")
        lines += [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[secrets]", f"required = {json.dumps(list(secrets))}"]
    return "\n".join(lines) + "\n"


def calc_rows(specs: Iterable[tuple[str, str] | tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Rows from (question, label[, do]) tuples; ``do`` makes the rollout misbehave."""
    rows = []
    for spec in specs:
        question, label = spec[0], spec[1]
        row: dict[str, Any] = {"user_prompt": question, "ground_truth": label}
        if len(spec) > 2:
            row["metadata"] = {"do": spec[2]}
        rows.append(row)
    return rows


#: One of each outcome, and two errors (dataset rows 0..4): passed, below threshold, the
#: workflow raises, the grader raises, skipped.
MIXED_ROWS = calc_rows(
    [
        ("What is 2 + 2?", "4"),
        ("What is 3 * 5?", "16"),
        ("What is 1 + 1?", "2", "workflow_raise"),
        ("What is 2 + 3?", "5", "grader_raise"),
        ("What is 4 + 4?", "8", "skip"),
    ]
)


def write_workspace(
    root: Path,
    *,
    name: str = "calc",
    rows: Iterable[Mapping[str, Any]] | None = None,
    rollout_source: str = CALC_ROLLOUT,
    **toml: Any,
) -> Path:
    """Write a workspace under ``root`` (one ``osmosis eval run`` accepts: with
    ``configs/training/``) and return the config path."""
    (root / "configs" / "training").mkdir(parents=True, exist_ok=True)
    config = root / "configs" / "eval" / f"{name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(toml_text(**toml))
    dataset = toml.get("dataset", "calc")
    rollout = toml.get("rollout", "calc")
    data = root / "data" / f"{dataset}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    if rows is None:
        rows = calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")])
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main = root / "rollouts" / rollout / toml.get("entrypoint", "main.py")
    main.parent.mkdir(parents=True, exist_ok=True)
    main.write_text(rollout_source)
    return config


def read_index(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]


def only_run_dir(root: Path) -> Path:
    runs = [
        p
        for p in (root / ".osmosis" / "evals").iterdir()
        if not p.name.startswith(".") and p.is_dir()
    ]
    assert len(runs) == 1, runs
    return runs[0]


def calc_rollout(workflow_config: str | None) -> str:
    """The calc rollout whose backend gets ``workflow_config=<expression>`` (None: none).

    What its ``/health`` advertises, and so the default concurrency, depends on it: 4
    without a workflow_config, its ``concurrency.max_concurrent`` (unset: no cap) with one.
    """
    if workflow_config is None:
        return CALC_ROLLOUT
    backend = "backend = LocalBackend(workflow=CalcWorkflow, grader=ExactGrader)"
    assert backend in CALC_ROLLOUT
    return CALC_ROLLOUT.replace(
        backend,
        "from pytest_osmosis.rollout import AgentWorkflowConfig\n"
        f"{backend[:-1]}, workflow_config={workflow_config})",
    )


# -- sessions the test acts on while they run (kills, signals) -------------------------

#: A rollout whose rows note their process id (in ``pids``) and make ``calls`` model calls;
#: a row whose ``exit`` names an existing file then kills its process.
PID_ROLLOUT = r"""
import os
from pathlib import Path

import httpx

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context


class PidWorkflow(AgentWorkflow):
    async def run(self, ctx):
        meta = ctx.metadata
        Path(meta["pids"], str(os.getpid())).touch()
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=600) as client:
            for _ in range(int(meta.get("calls", 1))):
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "anything", "messages": ctx.prompt},
                )
                response.raise_for_status()
                answer = response.json()["choices"][0]["message"]["content"]
        if meta.get("exit") and Path(meta["exit"]).exists():
            os._exit(7)  # kills the interpreter, as long as the marker file is there
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class ExactGrader(Grader):
    async def grade(self, ctx):
        final = list(ctx.sample.messages)[-1]["content"].strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.0)
"""

HELD = "+ 100?"  # what every row's question contains (the model server holds them)


def pid_rows(root: Path, count: int, calls: int = 1) -> list[dict[str, Any]]:
    pids = root / "pids"
    pids.mkdir(exist_ok=True)
    return [
        {
            "user_prompt": f"What is {i} {HELD}",
            "ground_truth": str(i + 100),
            "metadata": {"pids": str(pids), "calls": calls},
        }
        for i in range(count)
    ]


def free_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A pytest session in this process, or in a fresh interpreter under xdist (``-n``):
    the workers are fresh interpreters anyway, and the controller is not run in process.
    An interpreter start costs a second or more of LiteLLM imports: where it is not what a
    test is about, the session runs here."""
    if "-n" in args or any(arg.startswith("--numprocesses") for arg in args):
        return pytester.runpytest_subprocess(*args)
    return pytester.runpytest(*args)


def wait_until(condition: Any, what: str, deadline: float = 180.0) -> None:
    """Poll for an event (a generous deadline only stops a hang: it is no budget)."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """The process has exited (a zombie its parent has not reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


class Background:
    """``runpytest_subprocess`` on a thread, so the test can act while the session runs."""

    def __init__(self, pytester: pytest.Pytester, *args: str) -> None:
        self.result: Any = None
        self._thread = threading.Thread(
            target=lambda: setattr(self, "result", pytester.runpytest_subprocess(*args)),
            daemon=True,
        )
        self._thread.start()

    def join(self) -> Any:
        self._thread.join(600)
        assert self.result is not None, "the session did not end"
        return self.result
