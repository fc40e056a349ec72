"""square-strands: a Strands agent with one tool, through the SDK's Strands integration
(its model is LiteLLM pointed at the rollout's chat completions URL). Importing the
integration imports urllib3, whose IPv6 probe binds ``::1`` port 0."""

from __future__ import annotations

import os

import uvicorn
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
from osmosis_ai.rollout.server import create_rollout_server
from strands import tool


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class SquareWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        *history, last = list(ctx.prompt)
        agent = OsmosisStrandsAgent(
            model=OsmosisRolloutModel(),
            messages=history,
            tools=[multiply],
            system_prompt="Multiply with the multiply tool, then give the product.",
            callback_handler=None,
        )
        await agent.invoke_async(last["content"])


class SquareGrader(Grader):
    """1.0 when the tool ran and the last assistant text is the label."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        messages = list(ctx.sample.messages)
        used = any(
            "toolResult" in block
            for message in messages
            for block in message.get("content", [])
            if isinstance(block, dict)
        )
        final = [m for m in messages if m.get("role") == "assistant"][-1]
        text = "".join(b.get("text", "") for b in final["content"] if isinstance(b, dict))
        ctx.set_reward(1.0 if used and text.strip() == ctx.label else 0.0)


def main() -> None:
    backend = LocalBackend(workflow=SquareWorkflow, grader=SquareGrader)
    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
    )


if __name__ == "__main__":
    main()
