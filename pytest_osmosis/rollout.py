"""The rollout API: ``from pytest_osmosis.rollout import AgentWorkflow, Grader, ...``.

When ``osmosis-ai`` is importable these are the SDK's own objects, so one rollout runs
the same under ``osmosis eval run`` and under pytest; otherwise they are our own
implementations with the same names and behaviour (``pytest_osmosis.workspace._sdk_api``).
``bridge_client()`` is ours alone: a ready, cheap HTTP client for the attempt's model
endpoint (``pytest_osmosis.model.client``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_osmosis.workspace import rollout_api
from pytest_osmosis.workspace.rollout_api import *  # noqa: F403 - the names rollout_api chose

__all__ = [*rollout_api.__all__, "RubricGrader", "bridge_client"]

if TYPE_CHECKING:
    from pytest_osmosis.model.client import bridge_client
    from pytest_osmosis.rubric.grader import RubricGrader


def __getattr__(name: str) -> Any:
    if name == "RubricGrader":  # lazy: rubric_grader subclasses this module's Grader
        from pytest_osmosis.rubric.grader import RubricGrader

        return RubricGrader
    if name == "bridge_client":  # lazy: httpx is imported only by rollouts that use it
        from pytest_osmosis.model.client import bridge_client

        return bridge_client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
