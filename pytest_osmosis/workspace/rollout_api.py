"""The rollout API this process uses: the SDK's own objects when ``osmosis-ai`` is
importable, else ours (``_sdk_api``), with the same names and behaviour.

The libraries (the loader, the rubric grader, the bridge client) take the names from here;
``pytest_osmosis.rollout`` is the public face that re-exports them for rollouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "ExecutionBackend",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "LocalBackend",
    "RolloutContext",
    "RolloutSample",
    "SampleSource",
    "USING_OSMOSIS_SDK",
    "get_rollout_context",
]

if TYPE_CHECKING:
    from pytest_osmosis.workspace._sdk_api import (
        AgentWorkflow,
        AgentWorkflowConfig,
        AgentWorkflowContext,
        AgentWorkflowOutput,
        ExecutionBackend,
        Grader,
        GraderConfig,
        GraderContext,
        LocalBackend,
        RolloutContext,
        RolloutSample,
        SampleSource,
        get_rollout_context,
    )

    USING_OSMOSIS_SDK: bool
else:
    try:
        from osmosis_ai.rollout import (
            AgentWorkflow,
            AgentWorkflowConfig,
            AgentWorkflowContext,
            AgentWorkflowOutput,
            ExecutionBackend,
            Grader,
            GraderConfig,
            GraderContext,
            LocalBackend,
            RolloutContext,
            RolloutSample,
            SampleSource,
            get_rollout_context,
        )
    except ImportError:
        from pytest_osmosis.workspace._sdk_api import (
            AgentWorkflow,
            AgentWorkflowConfig,
            AgentWorkflowContext,
            AgentWorkflowOutput,
            ExecutionBackend,
            Grader,
            GraderConfig,
            GraderContext,
            LocalBackend,
            RolloutContext,
            RolloutSample,
            SampleSource,
            get_rollout_context,
        )

        USING_OSMOSIS_SDK = False
    else:
        USING_OSMOSIS_SDK = True
