"""calc-tools: placeholder rollout server created by `osmosis rollout init`."""

from __future__ import annotations

import os

import uvicorn
from calc_tools import ask, score
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server


class MyAgentWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        reply = await ask(ctx.prompt)
        return [*ctx.prompt, reply]


class MyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        ctx.set_reward(score(str(list(ctx.sample.messages)[-1]["content"]), ctx.label))


def main() -> None:
    backend = LocalBackend(workflow=MyAgentWorkflow, grader=MyGrader)
    app = create_rollout_server(backend=backend)
    uvicorn.run(
        app,
        host="0.0.0.0",
        port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")),
        timeout_keep_alive=2160,
    )


if __name__ == "__main__":
    main()
