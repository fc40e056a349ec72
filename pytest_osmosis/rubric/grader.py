"""`RubricGrader`: grade a rollout's final answer against a rubric with an LLM judge.

It asks the judge exactly what ``pytest-osmosis rubric`` asks (same prompt, answer
format and score rules, `pytest_osmosis.rubric.judge`). Inside a run the call goes through the
plugin's loopback bridge, as any model call of a rollout does, so the judge's tokens are
counted in the row and no provider key reaches the rollout; the bridge sends it to
``judge_model`` (named in the ``X-Osmosis-Judge-Model`` header) instead of the run's model.
Outside a run (no rollout context) it calls LiteLLM directly.

Configure it with class attributes, with fields of its ``GraderConfig`` (``extra`` fields
are allowed), or with keyword arguments; `RubricGrader.configured(...)` makes a subclass,
which is what ``LocalBackend(grader=...)`` takes::

    backend = LocalBackend(
        workflow=MyWorkflow,
        grader=RubricGrader.configured(rubric="Names the capital correctly.", pass_threshold=0.5),
    )
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from pytest_osmosis.core.errors import ConfigError
from pytest_osmosis.model.bridge import JUDGE_MODEL_HEADER
from pytest_osmosis.model.routes import (
    EMBEDDED_MODEL_PATH,
    JUDGE_MISSING_API_KEY,
    JUDGE_MODEL_NOT_FOUND,
    JUDGE_PROVIDER_ERROR,
)
from pytest_osmosis.rubric.judge import (
    _EMBEDDED_EXPLANATION_CHARS,
    _EMBEDDED_MAX_TOKENS,
    JudgeError,
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderRequestError,
    RubricJudge,
    Verdict,
    message_text,
    one_line,
)
from pytest_osmosis.workspace.rollout_api import Grader, GraderContext, get_rollout_context

__all__ = ["ARTIFACT_NAME", "JUDGE_MODEL_HEADER", "RubricGrader"]

ARTIFACT_NAME = "rubric_judgement.json"

# The bridge's own one-line message for a judge it cannot call, as the rubric command's types.
_BRIDGE_ERRORS: Mapping[str, type[JudgeError]] = {
    JUDGE_MISSING_API_KEY: MissingAPIKeyError,
    JUDGE_MODEL_NOT_FOUND: ModelNotFoundError,
    JUDGE_PROVIDER_ERROR: ProviderRequestError,
}

_BRIDGE_PLACEHOLDER_MODEL = "openai/osmosis-rollout"


def _configured(cls: type[Any], config: Any, name: str, settings: Mapping[str, Any]) -> Any:
    """Keyword argument, else a field of the grader config, else the class attribute."""
    if settings.get(name) is not None:
        return settings[name]
    from_config = getattr(config, name, None) if config is not None else None
    if from_config is not None:
        return from_config
    return getattr(cls, name)


def declared_judge_model(grader_cls: type[Any] | None, grader_config: Any) -> str | None:
    """The judge a rollout's `RubricGrader` names (its config, else its class): the session
    lets the bridge reach only declared judges. A judge passed as a keyword is not seen here."""
    if not isinstance(grader_cls, type) or not issubclass(grader_cls, RubricGrader):
        return None
    model = _configured(grader_cls, grader_config, "judge_model", {})
    return model.strip() if isinstance(model, str) and model.strip() else None


_SETTINGS = (
    "rubric",
    "judge_model",
    "score_min",
    "score_max",
    "pass_threshold",
    "timeout",
    "system_prompt",
)


def _final_exchange(messages: Sequence[Any]) -> tuple[str, str | None]:
    """The last assistant text and the user text that asked for it (if any)."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        answer = message_text(message.get("content"))
        if not answer:
            continue
        for earlier in reversed(messages[:position]):
            if isinstance(earlier, Mapping) and earlier.get("role") == "user":
                question = message_text(earlier.get("content"))
                return answer, question or None
        return answer, None
    return "", None


class RubricGrader(Grader):
    """Sets the reward from an LLM judge's rubric score.

    The reward is the judge's score (clamped to ``[score_min, score_max]``); with a
    ``pass_threshold`` it is 1.0 when the score reaches the threshold and 0.0 otherwise.
    ``judge_model`` names the judge (any LiteLLM id, or ``osmosis/embedded``); left unset,
    the run's own model judges. Inside a run the plugin's bridge routes the call to it
    (``X-Osmosis-Judge-Model`` header) and counts its tokens in the row; a missing key or
    an unknown model fails the row as a one-line grader error. The SDK's bridge ignores
    the header, so there the run's model judges. The judge's explanation is written to
    ``rubric_judgement.json`` in the rollout's artifacts.
    """

    rubric: ClassVar[str | None] = None
    judge_model: ClassVar[str | None] = None
    score_min: ClassVar[float] = 0.0
    score_max: ClassVar[float] = 1.0
    pass_threshold: ClassVar[float | None] = None
    timeout: ClassVar[float | None] = None
    system_prompt: ClassVar[str | None] = None

    def __init__(self, config: Any = None, **settings: Any) -> None:
        super().__init__(config)
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise ConfigError(
                f"RubricGrader: unknown setting(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(_SETTINGS)}"
            )
        values = {name: self._setting(name, settings) for name in _SETTINGS}
        rubric = values["rubric"]
        if not isinstance(rubric, str) or not rubric.strip():
            raise ConfigError("RubricGrader: 'rubric' must be non-empty text")
        threshold = values["pass_threshold"]
        if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not math.isfinite(threshold)
        ):
            raise ConfigError(
                f"RubricGrader: 'pass_threshold' must be a finite number, got {threshold!r}"
            )
        model = values["judge_model"]
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ConfigError(
                f"RubricGrader: 'judge_model' must be a LiteLLM model id, got {model!r}"
            )
        try:
            self.judge = RubricJudge(
                rubric,
                model or _BRIDGE_PLACEHOLDER_MODEL,
                score_min=values["score_min"],
                score_max=values["score_max"],
                timeout=values["timeout"],
                system_prompt=values["system_prompt"],
            )
        except ConfigError as exc:
            raise ConfigError(f"RubricGrader: {exc}") from None
        self.judge_model_id: str | None = model.strip() if model else None
        self.threshold: float | None = float(threshold) if threshold is not None else None

    def _setting(self, name: str, settings: Mapping[str, Any]) -> Any:
        return _configured(type(self), self.config, name, settings)

    @classmethod
    def configured(cls, **settings: Any) -> type[RubricGrader]:
        """A subclass with these settings as class attributes (for ``LocalBackend(grader=...)``)."""
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise ConfigError(
                f"RubricGrader.configured: unknown setting(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(_SETTINGS)}"
            )
        namespace = {**settings, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        subclass = cast("type[RubricGrader]", type(cls.__name__, (cls,), namespace))
        if subclass.rubric is not None:
            subclass()  # report a bad setting here, where it was written, not on every row
        return subclass

    async def grade(self, ctx: GraderContext) -> None:
        sample = ctx.sample
        if sample is None:
            raise JudgeError("RubricGrader: the rollout produced no sample to grade")
        answer, question = _final_exchange(list(sample.messages))
        if not answer:
            raise JudgeError("RubricGrader: the sample has no assistant message with text to judge")
        artifact = ctx.artifacts_dir
        try:
            verdict = await self._ask(
                answer, ground_truth=ctx.label, original_input=question, metadata=ctx.metadata
            )
        except JudgeError as exc:
            self._write_artifact(artifact, None, None, str(exc))
            raise
        reward = verdict.score
        if self.threshold is not None:
            reward = 1.0 if verdict.score >= self.threshold else 0.0
        self._write_artifact(artifact, verdict, reward, None)
        ctx.set_reward(reward)

    async def _ask(
        self,
        answer: str,
        *,
        ground_truth: str | None,
        original_input: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> Verdict:
        rollout = get_rollout_context()
        url = getattr(rollout, "chat_completions_url", "") if rollout is not None else ""
        if not url:
            if self.judge_model_id is None:
                raise JudgeError(
                    "RubricGrader: no judge_model is set and there is no run whose model "
                    "could judge (no rollout context)"
                )
            return await self.judge.judge(
                answer, ground_truth=ground_truth, original_input=original_input, metadata=metadata
            )
        messages = self.judge.messages(
            answer, ground_truth=ground_truth, original_input=original_input, metadata=metadata
        )
        content = await self._post(url, getattr(rollout, "api_key", None), messages)
        return self.judge.parse(content)

    async def _post(self, url: str, api_key: str | None, messages: list[dict[str, str]]) -> Any:
        """One chat completion through the bridge; returns the answer's content."""
        import aiohttp

        embedded = self.judge_model_id == EMBEDDED_MODEL_PATH
        body: dict[str, Any] = {
            "model": self.judge_model_id or _BRIDGE_PLACEHOLDER_MODEL,
            "messages": messages,
            "temperature": 0,
            "response_format": self.judge.response_format(
                True, max_explanation=_EMBEDDED_EXPLANATION_CHARS if embedded else None
            ),
        }
        if embedded:  # bounded as the rubric command bounds it: a 135M model rambles
            body["max_tokens"] = _EMBEDDED_MAX_TOKENS
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if self.judge_model_id:
            headers[JUDGE_MODEL_HEADER] = self.judge_model_id
        timeout = aiohttp.ClientTimeout(total=self.judge.timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(
                    url.rstrip("/") + "/chat/completions", data=json.dumps(body), headers=headers
                ) as response:
                    text = await response.text()
                    status = response.status
        except TimeoutError:
            raise ProviderRequestError(
                f"judge call through the osmosis bridge gave no answer within "
                f"{self.judge.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise ProviderRequestError(
                f"judge call through the osmosis bridge failed: {type(exc).__name__}: "
                f"{one_line(str(exc))}"
            ) from None
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        if status != 200:
            detail = payload.get("detail") if isinstance(payload, dict) else None
            error = payload.get("error") if isinstance(payload, dict) else None
            kind = error.get("type") if isinstance(error, dict) else None
            if isinstance(kind, str) and kind in _BRIDGE_ERRORS and detail:
                raise _BRIDGE_ERRORS[kind](one_line(str(detail)))
            raise ProviderRequestError(
                f"judge call through the osmosis bridge failed (HTTP {status}): "
                f"{one_line(str(detail or text))}"
            )
        try:
            return payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ProviderRequestError(
                "judge call through the osmosis bridge returned no chat completion"
            ) from None

    def _write_artifact(
        self,
        directory: Path | None,
        verdict: Verdict | None,
        reward: float | None,
        error: str | None,
    ) -> None:
        if not directory:
            return
        document = {
            "judge_model": self.judge_model_id,
            "rubric": self.judge.rubric,
            "score_min": self.judge.score_min,
            "score_max": self.judge.score_max,
            "pass_threshold": self.threshold,
            "score": verdict.score if verdict else None,
            "explanation": verdict.explanation if verdict else None,
            "reward": reward,
            "error": error,
        }
        path = Path(directory) / ARTIFACT_NAME
        path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
