"""A rollout whose entrypoint sits in a subfolder (``entrypoint = "agent/main.py"``) and
imports the module beside it by its bare name, as the SDK's server bootstrap allows (it
puts the entrypoint's own folder first on ``sys.path``)."""

from __future__ import annotations

import os

import httpx
import uvicorn
from helpers import FLAVOUR, grade_answer
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import get_rollout_context
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server


class AskWorkflow(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "m", "messages": list(ctx.prompt)},
            )
            response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        return [*ctx.prompt, {"role": "assistant", "content": f"{FLAVOUR}:{answer}"}]


class HelperGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(grade_answer(list(ctx.sample.messages)[-1]["content"], ctx.label))


def main() -> None:
    backend = LocalBackend(workflow=AskWorkflow, grader=HelperGrader)
    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
    )


if __name__ == "__main__":
    main()
