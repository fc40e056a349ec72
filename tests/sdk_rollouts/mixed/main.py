"""mixed: one rollout that can end every way a row can end, steered by the row's metadata.

Used to compare pytest-osmosis with the SDK's own LocalBackend row by row.
"""

from __future__ import annotations

import asyncio
import math

import httpx
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutSample,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class FixedSource(SampleSource):
    def __init__(self, messages: list[dict]) -> None:
        self.messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=self.messages)


async def ask(messages: list[dict]) -> str:
    rollout = get_rollout_context()
    assert rollout is not None
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers={"Authorization": f"Bearer {rollout.api_key}"},
            json={"model": "osmosis-rollout", "messages": messages},
        )
        response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


class MixedWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext):  # type: ignore[no-untyped-def]
        do = (ctx.metadata or {}).get("do", "")
        if do == "workflow_raise":
            raise RuntimeError("workflow exploded on purpose")
        if do == "workflow_own_timeout":
            raise TimeoutError("an upstream call gave up")
        if do.startswith("workflow_sleep:"):
            await asyncio.sleep(float(do.split(":")[1]))
        if do == "workflow_garbage":
            return 42
        if do == "empty_messages":
            return []
        if do == "no_messages":
            return AgentWorkflowOutput(messages=None)
        answer = await ask(ctx.prompt)
        messages = [*ctx.prompt, {"role": "assistant", "content": answer}]
        if do in ("source", "grader_builds_session"):
            rollout = get_rollout_context()
            assert rollout is not None
            rollout.set_sample_source(FixedSource(messages))
            return None
        return messages


class MixedGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        do = (ctx.metadata or {}).get("do", "")
        if do == "grader_builds_session":
            # What an agent session or judge built inside a grader does: register with the
            # active rollout context, if there is one (under the SDK there is none).
            rollout = get_rollout_context()
            if rollout is not None:
                rollout.set_sample_source(FixedSource([]))
        if do == "skip":
            ctx.sample.remove_sample = True
            return
        if do == "grader_raise":
            raise RuntimeError("grader exploded on purpose")
        if do == "grader_value_error":
            raise ValueError("grader refused the sample")
        if do == "reward_then_raise":
            ctx.set_reward(1.0)
            raise RuntimeError("grader failed after rewarding")
        if do.startswith("grader_sleep:"):
            await asyncio.sleep(float(do.split(":")[1]))
        if do == "nan":
            ctx.set_reward(math.nan)
            return
        if do == "no_reward":
            return
        if not ctx.sample.messages:
            ctx.set_reward(0.0)
            return
        final = str(list(ctx.sample.messages)[-1]["content"]).strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.25)


backend = LocalBackend(workflow=MixedWorkflow, grader=MixedGrader)
app = create_rollout_server(backend=backend)
