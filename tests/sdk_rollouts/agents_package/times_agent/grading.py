from __future__ import annotations

from osmosis_ai.rollout.context import GraderContext
from osmosis_ai.rollout.grader import Grader


class ProductGrader(Grader):
    """1.0 when the multiply tool ran and the final answer is the label, else 0.0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        items = list(ctx.sample.messages)
        called = any(
            i.get("type") == "function_call" and i.get("name") == "multiply" for i in items
        )
        finals = [i for i in items if i.get("role") == "assistant" and i.get("type") == "message"]
        answer = ""
        if finals:
            answer = "".join(p.get("text", "") for p in finals[-1].get("content", [])).strip()
        ctx.set_reward(1.0 if called and answer == ctx.label else 0.0)
