"""Capitals: ask the model for a country's capital; reward 1.0 when the answer names it.

Written the way an Osmosis rollout is written. With ``osmosis-ai`` installed, the same
classes import from ``osmosis_ai.rollout`` and run under ``osmosis eval run`` too.
"""

from __future__ import annotations

from pytest_osmosis.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    bridge_client,
)


class CapitalsWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        # This attempt's model endpoint and bearer, over one connection pool per process:
        # never a new client (and its CA certificates) per call.
        response = await bridge_client().post(
            "chat/completions",
            json={"model": "osmosis-rollout", "messages": ctx.prompt, "max_tokens": 24},
        )
        response.raise_for_status()
        body = response.json()
        answer = body["choices"][0]["message"].get("content") or ""
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "answer.txt").write_text(answer)
        reply = {"role": "assistant", "content": answer, "usage": body.get("usage")}
        return AgentWorkflowOutput(messages=[*ctx.prompt, reply])


class CapitalsGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        final = str(list(ctx.sample.messages)[-1].get("content") or "")
        ctx.set_reward(1.0 if ctx.label and ctx.label.lower() in final.lower() else 0.0)


backend = LocalBackend(workflow=CapitalsWorkflow, grader=CapitalsGrader)
