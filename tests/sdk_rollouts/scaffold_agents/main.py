"""calc-agent: rollout server created by `osmosis rollout init`, filled in with an
OpenAI Agents workflow that calls a tool and a grader that reads the sample.

Kept in the scaffold's exact shape: classes and configs in main.py, and main()
building the LocalBackend, the FastAPI app and uvicorn (which pytest-osmosis must
never start).
"""

from __future__ import annotations

import os

import uvicorn
from agents import Runner, function_tool
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext, get_rollout_context
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.types import AgentWorkflowConfig, GraderConfig


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return str(a + b)


class CalcWorkflowConfig(AgentWorkflowConfig):
    instructions: str = "Use the add tool for arithmetic, then state the result."


class MyAgentWorkflow(AgentWorkflow[CalcWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[CalcWorkflowConfig]) -> None:
        rollout = get_rollout_context()
        assert rollout is not None
        assert ctx.config is not None
        # Evidence for the test that these are the SDK's own objects.
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "workflow_seen.txt").write_text(
                f"{type(ctx).__module__}.{type(ctx).__qualname__}\n"
                f"{type(rollout).__module__}.{type(rollout).__qualname__}\n"
                f"{rollout.rollout_id}\n{rollout.chat_completions_url}\n"
            )
        agent = OsmosisAgent(
            name="calc",
            instructions=ctx.config.instructions,
            model=OsmosisRolloutModel(),
            tools=[add],
        )
        await Runner.run(agent, input=ctx.prompt, session=OsmosisMemorySession())


class MyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        items = list(ctx.sample.messages)
        calls = [i for i in items if i.get("type") == "function_call"]
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        final = [i for i in items if i.get("role") == "assistant" and i.get("type") == "message"]
        answer = ""
        if final:
            answer = "".join(
                part.get("text", "") for part in final[-1].get("content", [])
            ).strip()
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "grader_seen.txt").write_text(
                f"{type(ctx).__module__}.{type(ctx).__qualname__}\n"
                f"{type(ctx.sample).__module__}.{type(ctx.sample).__qualname__}\n"
                f"calls={[c.get('name') for c in calls]}\n"
                f"outputs={[o.get('output') for o in outputs]}\n"
                f"answer={answer}\n"
            )
        used_tool = any(c.get("name") == "add" for c in calls) and bool(outputs)
        ctx.set_reward(1.0 if used_tool and answer == ctx.label else 0.0)


workflow_config = CalcWorkflowConfig(name="calc-agent")
grader_config = GraderConfig(name="calc-grader")


def main() -> None:
    backend = LocalBackend(
        workflow=MyAgentWorkflow,
        workflow_config=workflow_config,
        grader=MyGrader,
        grader_config=grader_config,
    )
    app = create_rollout_server(backend=backend)
    uvicorn.run(
        app,
        host="0.0.0.0",
        port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")),
        # Outlive the Osmosis platform load balancer's 2100s idle timeout.
        timeout_keep_alive=2160,
    )


if __name__ == "__main__":
    main()
