"""A hand-written tool loop on the OpenAI client: call the model, run its tool calls, repeat."""

from openai import AsyncOpenAI
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    get_rollout_context,
)

from my_rollout import tools
from my_rollout.config import ToolCalcConfig


class ToolCalcWorkflow(AgentWorkflow[ToolCalcConfig]):
    async def run(self, ctx: AgentWorkflowContext[ToolCalcConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        assert rollout is not None and ctx.config is not None
        client = AsyncOpenAI(base_url=rollout.chat_completions_url, api_key=rollout.api_key)
        messages = list(ctx.prompt)
        for _ in range(ctx.config.max_turns):
            response = await client.chat.completions.create(
                model="osmosis-rollout", messages=messages, tools=[tools.MULTIPLY]
            )
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": tools.call(call.function.name, call.function.arguments),
                    }
                )
        return AgentWorkflowOutput(messages=messages)
