"""LLM-as-judge: the verdict, the RubricGrader, and the ``rubric`` command."""
