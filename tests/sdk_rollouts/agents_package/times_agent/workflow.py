from __future__ import annotations

from agents import Runner, set_tracing_disabled
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.context import AgentWorkflowContext
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.rollout.types import AgentWorkflowConfig

from times_agent.tools import multiply

set_tracing_disabled(True)  # its exporter would post to the internet at exit


class TimesConfig(AgentWorkflowConfig):
    instructions: str = "Multiply with the multiply tool, then give the product."


class TimesWorkflow(AgentWorkflow[TimesConfig]):
    async def run(self, ctx: AgentWorkflowContext[TimesConfig]) -> None:
        assert ctx.config is not None
        agent = OsmosisAgent(
            name="times",
            instructions=ctx.config.instructions,
            model=OsmosisRolloutModel(),
            tools=[multiply],
        )
        await Runner.run(agent, input=ctx.prompt, session=OsmosisMemorySession())
