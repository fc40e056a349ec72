"""echo-calc: a rollout whose backend and app are built at module level.

The workflow drives the model with the OpenAI client against the rollout context's
chat endpoint (the scaffold's "raw HTTP" option); running this file starts the server.
"""

from __future__ import annotations

import os

from openai import AsyncOpenAI
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class EchoCalcWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        assert rollout is not None
        client = AsyncOpenAI(base_url=rollout.chat_completions_url, api_key=rollout.api_key)
        response = await client.chat.completions.create(model="osmosis-rollout", messages=ctx.prompt)
        message = response.choices[0].message
        assistant = {"role": "assistant", "content": message.content}
        return AgentWorkflowOutput(
            messages=[*ctx.prompt, assistant],
            metrics={"completion_tokens": float(response.usage.completion_tokens)},
        )


class ExactGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = str(list(ctx.sample.messages)[-1]["content"]).strip()
        ctx.set_reward(1.0 if answer == ctx.label else 0.0)


backend = LocalBackend(workflow=EchoCalcWorkflow, grader=ExactGrader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="0.0.0.0", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
