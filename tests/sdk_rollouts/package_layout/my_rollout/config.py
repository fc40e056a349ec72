from osmosis_ai.rollout import AgentWorkflowConfig, GraderConfig


class ToolCalcConfig(AgentWorkflowConfig):
    max_turns: int = 4


workflow_config = ToolCalcConfig(name="tool-calc", max_turns=3)
grader_config = GraderConfig(name="tool-calc-grader", tolerance=0.0)
