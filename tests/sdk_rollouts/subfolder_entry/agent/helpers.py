"""Beside the entrypoint: ``import helpers`` must find this file, not another rollout's."""

FLAVOUR = "plain"


def grade_answer(answer: str, label: str | None) -> float:
    return 1.0 if answer.strip() == label else 0.0
