"""Our own copy of the ``osmosis_ai.rollout`` user API, for when the SDK is not installed.

The names, fields and behaviour follow the SDK (contract §4.5) so that one rollout runs
unchanged with or without ``osmosis-ai``; ``pytest_osmosis.rollout`` picks the SDK's
objects whenever they are importable and these otherwise.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pytest_osmosis.core.copying import deep_copy

MessageDict = dict[str, Any]
Messages = list[dict[str, Any]]


class ConcurrencyConfig(BaseModel):
    max_concurrent: int | None = Field(default=None, ge=1)


class BaseConfig(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="allow", validate_assignment=True, arbitrary_types_allowed=True
    )

    name: str
    description: str | None = None


class AgentWorkflowConfig(BaseConfig):
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


class GraderConfig(BaseConfig):
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


class RolloutSample(BaseModel):
    """One rollout's conversation and grade; ``reward`` must stay finite."""

    model_config: ClassVar[ConfigDict] = ConfigDict(allow_inf_nan=False, validate_assignment=True)

    messages: Sequence[Mapping[str, Any]] = Field(default_factory=list)
    trajectory_messages: Sequence[Mapping[str, Any]] | None = None
    label: str | None = None
    reward: float | None = None
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _default_trajectory_messages(self) -> RolloutSample:
        # An explicit None disables trajectory persistence, as in the SDK.
        if "trajectory_messages" not in self.model_fields_set:
            self.trajectory_messages = deep_copy(list(self.messages))
        return self


class AgentWorkflowOutput(BaseModel):
    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid", allow_inf_nan=False, revalidate_instances="always"
    )

    messages: Messages | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)


class SampleSource(ABC):
    """Produces the rollout's sample when the workflow returns ``None``."""

    @abstractmethod
    async def get_sample(self) -> RolloutSample:
        """Return the rollout's current sample."""


_rollout_contextvar: ContextVar[RolloutContext | None] = ContextVar(
    "pytest_osmosis_rollout_context", default=None
)


@dataclass
class RolloutContext:
    """Ambient per-rollout context: where the model is and who collects the sample."""

    chat_completions_url: str = ""
    api_key: str | None = None
    rollout_id: str = ""
    sample_source: SampleSource | None = None

    def __post_init__(self) -> None:
        if not self.chat_completions_url:
            self.chat_completions_url = os.environ.get("OSMOSIS_CHAT_COMPLETIONS_URL", "")
        if not self.api_key:
            self.api_key = os.environ.get("OSMOSIS_API_KEY")
        if not self.rollout_id:
            self.rollout_id = os.environ.get("OSMOSIS_ROLLOUT_ID", "")

    def __enter__(self) -> RolloutContext:
        _rollout_contextvar.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        _rollout_contextvar.set(None)

    def set_sample_source(self, source: SampleSource) -> None:
        if self.sample_source is not None:
            raise ValueError(
                "RolloutContext already has a sample source registered. A rollout "
                "produces one sample; construct a single agent/session per rollout."
            )
        self.sample_source = source

    async def get_sample(self) -> RolloutSample | None:
        if self.sample_source is None:
            return None
        return await self.sample_source.get_sample()


def get_rollout_context() -> RolloutContext | None:
    return _rollout_contextvar.get()


TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig)


@dataclass
class AgentWorkflowContext(Generic[TConfig]):
    """What a workflow sees: never the label."""

    prompt: list[dict[str, Any]]
    config: TConfig | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: Path | None = None


@dataclass
class GraderContext:
    label: str | None = None
    sample: RolloutSample | None = None
    project_path: str | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: Path | None = None

    def set_reward(self, reward: float) -> None:
        if self.sample is None:
            raise ValueError("GraderContext has no sample to reward")
        self.sample.reward = reward


class AgentWorkflow(ABC, Generic[TConfig]):
    def __init__(self, config: TConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def run(
        self, ctx: AgentWorkflowContext[TConfig]
    ) -> AgentWorkflowOutput | Messages | None:
        """Run one rollout; return the messages, an output, or None for the sample source."""
        raise NotImplementedError


class Grader(ABC):
    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def grade(self, ctx: GraderContext) -> Any:
        """Set the reward on ``ctx`` (``ctx.set_reward``)."""
        raise NotImplementedError


def resolve_object(value: Any) -> Any:
    """Turn a ``"module.path:attr"`` string into the object, as the SDK's LocalBackend does."""
    if not isinstance(value, str):
        return value
    module_name, sep, attr = value.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module.path:attr', got {value!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


class ExecutionBackend(ABC):
    """What a rollout server runs; only ``LocalBackend`` is run in process by pytest-osmosis.

    The SDK's other backends (``HarborBackend``: a Docker sandbox) run under ``osmosis
    eval run``; building one while a rollout loads is refused (loader.py).
    """

    @abstractmethod
    async def execute(self, request: Any) -> Any:
        """Run one rollout request."""
        raise NotImplementedError

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}


class LocalBackend(ExecutionBackend):
    """Holds the workflow, grader and their configs; pytest-osmosis runs them in process."""

    def __init__(
        self,
        *,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader] | str | None = None,
        grader_config: GraderConfig | str | None = None,
    ) -> None:
        self.workflow_cls: type[AgentWorkflow[Any]] = resolve_object(workflow)
        self.workflow_config: AgentWorkflowConfig | None = (
            resolve_object(workflow_config) if workflow_config else None
        )
        self.grader_cls: type[Grader] | None = resolve_object(grader) if grader else None
        self.grader_config: GraderConfig | None = (
            resolve_object(grader_config) if grader_config else None
        )

    async def execute(self, request: Any) -> Any:
        raise NotImplementedError("pytest-osmosis runs the workflow and grader itself")

    def health(self) -> dict[str, Any]:
        limit = self.workflow_config.concurrency.max_concurrent if self.workflow_config else 4
        return {"status": "ok", "concurrency": {"max_concurrent": limit, "queued": 0, "running": 0}}
