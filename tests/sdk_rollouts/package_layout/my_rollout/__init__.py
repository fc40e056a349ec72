ROLLOUT_NAME = "tool-calc"
