from osmosis_ai.rollout import Grader, GraderContext


class ToolCalcGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None and self.config is not None
        messages = list(ctx.sample.messages)
        used_tool = any(m.get("role") == "tool" for m in messages)
        answer = str(messages[-1].get("content") or "").strip()
        ctx.set_reward(1.0 if used_tool and answer == ctx.label else 0.0)
