"""Run one work item (row x attempt): workflow, then grader, each under its own budget.

This mirrors what the SDK's ``LocalBackend.execute`` does for one rollout (contract §4.4)
and classifies the outcome the way ``osmosis-ai`` 0.3.8 does (Appendix A), with one
deliberate difference: an expired budget is ``workflow_timeout`` or ``grader_timeout``
rather than a shared ``timeout``, so the two are told apart in results and gates.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import sys
import sysconfig
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_osmosis.core.copying import deep_copy
from pytest_osmosis.core.errors import ResourceExhaustedError
from pytest_osmosis.core.outcome import RowResult
from pytest_osmosis.core.words import one_line
from pytest_osmosis.execution.executor import LoopStopped, stalled_by_others, start_owned
from pytest_osmosis.execution.streams import keep_streams_open
from pytest_osmosis.results.redact import scrub
from pytest_osmosis.workspace.loader import LoadedRollout

if TYPE_CHECKING:
    from pytest_osmosis.model.cache import CachedAttempt
    from pytest_osmosis.results.source_run import RecordedSample

logger = logging.getLogger(__name__)

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)  # the whole package


class BridgeLike(Protocol):
    def open_rollout(
        self, rollout_id: str, cache: CachedAttempt | None = None
    ) -> tuple[str, str]: ...

    def close_rollout(self, rollout_id: str) -> int | None: ...

    def pop_rate_limited(self, rollout_id: str) -> int: ...

    def pop_cost(self, rollout_id: str) -> float | None: ...
    def pop_provider_errors(self, rollout_id: str) -> int: ...

    def call_usage(self, rollout_id: str) -> list[dict[str, int]]: ...

    exhaustions: int
    last_exhaustion: str


@dataclass(frozen=True)
class WorkItem:
    """One (row, attempt) with the row's content, as the rollout will see it."""

    row_index: int
    run_index: int
    source_row_index: int
    prompt: list[dict[str, Any]]
    label: str | None
    metadata: dict[str, Any] | None


@dataclass(frozen=True)
class Budgets:
    workflow_s: float | None
    grader_s: float | None


class _PhaseFailed(Exception):
    """A workflow or grader phase ended without a usable result."""

    def __init__(
        self, error_type: str, message: str, detail: str = "", cause: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.detail = detail
        self.cause = cause


class _Escaped(Exception):
    """Rollout code raised what would otherwise end the loop thread or cancel our task.

    ``SystemExit`` and ``KeyboardInterrupt`` escape asyncio's tasks and stop the loop;
    a ``CancelledError`` the rollout raised itself would read as the session cancelling
    the row. Each is this row's failure, with a headline naming what happened.
    """


TrajectoryWriter = Callable[..., bool]
"""``(rollout_id, sample, work[, step_usage])``: writes the trajectory, True when written.

``step_usage`` (the workflow's model calls through the bridge, one mapping per call in
order) is passed only to writers that declare that parameter.
"""


async def execute(
    work: WorkItem,
    rollout: LoadedRollout,
    *,
    bridge: BridgeLike,
    budgets: Budgets,
    pass_threshold: float,
    prepare_artifacts: Callable[[str], Path | None],
    write_trajectory: TrajectoryWriter,
    cache: CachedAttempt | None = None,
    recorded: RecordedSample | None = None,
) -> dict[str, Any]:
    """Run ``work``; the result is a dict of builtins because it travels to the xdist controller.

    With ``cache`` (the model-call cache's view of this row and attempt) the bridge serves
    the attempt's calls through it. Given the ``recorded`` sample of an earlier run (a
    regrade), the workflow does not run: the grader step, the same one, grades that sample
    under the same rollout id.
    """
    import pytest_osmosis.rollout as api

    keep_streams_open()  # a row that closes sys.stdout would break pytest's own output
    rollout_id = recorded.rollout_id if recorded is not None else uuid.uuid4().hex
    started = time.monotonic()
    exhaustions = bridge.exhaustions
    url, api_key = bridge.open_rollout(rollout_id, cache)
    artifacts_dir = prepare_artifacts(rollout_id)
    sample: Any = None
    step_usage: list[dict[str, int]] = []
    status, reward, error_type, message, detail = "failed", None, None, "", ""
    cause: BaseException | None = None
    try:
        rollout_ctx = api.RolloutContext(
            chat_completions_url=url, api_key=api_key, rollout_id=rollout_id
        )
        if recorded is not None:
            sample = recorded.sample(api)
        else:
            with rollout_ctx:
                sample = await _workflow_phase(
                    work, rollout, rollout_ctx, artifacts_dir, budgets, api
                )
        # Taken before grading: a judge's calls are not steps of the sample's conversation.
        step_usage = bridge.call_usage(rollout_id)
        if rollout.grader_cls is None:
            raise _PhaseFailed(
                "rollout_failed", "the rollout has no grader, so no reward was given"
            )
        if work.label is None and work.metadata is None:
            raise _PhaseFailed(
                "rollout_failed",
                "the row has neither a label nor metadata, so the grader did not run",
            )
        # Graders reach the bridge too (a judge model). The context is a fresh one: the SDK's
        # LocalBackend leaves none active while grading, so a grader that builds its own
        # agent session must not collide with the workflow's registered sample source.
        with api.RolloutContext(chat_completions_url=url, api_key=api_key, rollout_id=rollout_id):
            sample = await _grader_phase(work, rollout, sample, artifacts_dir, budgets, api)
        if sample.remove_sample:
            status = "skipped"
            message = "the rollout removed this sample (remove_sample)"
        else:
            status, reward = "success", float(sample.reward)
    except _PhaseFailed as failure:
        # No reward on a failure, even one the grader set before failing: the SDK's server
        # nulls the wire reward of every non-success result (0.3.8 `_handle_rollout`).
        error_type, message, detail = failure.error_type, failure.message, failure.detail
        cause = failure.cause
        said = _bridge_said(cause, url)
        if said is not None:  # "workflow raised HTTPStatusError: <what the provider said>"
            message = f"{message.partition(': ')[0]}: {said}"
    if cache is not None and cache.failure is not None:
        # Replay had no answer for one of its calls (none recorded, or a damaged entry):
        # whatever the rollout made of the refused call, the row is that failure (a result
        # no model gave is no result).
        status, reward, cause = "failed", None, None
        (error_type, message), detail = cache.failure, ""
    tokens = bridge.close_rollout(rollout_id)
    cost_usd = bridge.pop_cost(rollout_id)
    rate_limited = bridge.pop_rate_limited(rollout_id)
    provider_errors = bridge.pop_provider_errors(rollout_id)  # 5xx: outcome.is_infrastructure
    if status == "failed" and bridge.exhaustions != exhaustions:
        # Our own exhaustion, not the rollout's failure: the row stays pending for a resume.
        raise ResourceExhaustedError(
            f"{bridge.last_exhaustion}; row {work.source_row_index} run {work.run_index} "
            "was left pending (resume the run to finish it, with fewer rows in flight)"
        )
    has_trajectory = False
    trajectory_problem = None
    if sample is not None and getattr(sample, "trajectory_messages", None) is not None:
        try:
            has_trajectory = write_trajectory(rollout_id, sample, work, step_usage)
        except (ValueError, TypeError, RecursionError) as exc:
            # No valid ATIF document (an empty conversation, a value in sample.extra_fields
            # JSON cannot hold): like the SDK's best-effort save_trajectory, the row keeps
            # its result and has no trajectory; the run's log says so for this row.
            trajectory_problem = f"no trajectory written: {_one_line(exc)}"
            logger.warning("rollout %s: %s", rollout_id, trajectory_problem)
    duration_ms = (time.monotonic() - started) * 1000.0
    if recorded is not None:  # the attempt is the recorded one, graded again (contract D40)
        duration_ms = recorded.duration_ms
        if recorded.tokens is not None:
            tokens = recorded.tokens + (tokens or 0)
    return RowResult(
        row_index=work.row_index,
        run_index=work.run_index,
        source_row_index=work.source_row_index,
        rollout_id=rollout_id,
        status=status,
        pass_threshold=pass_threshold,
        reward=reward,
        tokens=tokens,
        duration_ms=duration_ms,
        error_type=error_type,
        message=message,
        detail=detail,
        extra={
            "has_trajectory": has_trajectory,
            "trajectory_problem": trajectory_problem,
            "rate_limited": rate_limited,
            "cost_usd": cost_usd,  # dollars by LiteLLM's cost map; None: no price
            # Model calls through the model-call cache, and how many it answered.
            "cache_calls": cache.calls if cache is not None else 0,
            "cache_hits": cache.hits if cache is not None else 0,
            "provider_errors": provider_errors,
            # The exception itself, for --pdb in this process; never sent to the xdist controller.
            "exception": cause,
        },
    ).as_dict()


async def _workflow_phase(
    work: WorkItem,
    rollout: LoadedRollout,
    rollout_ctx: Any,
    artifacts_dir: Path | None,
    budgets: Budgets,
    api: Any,
) -> Any:
    config = copy.deepcopy(rollout.workflow_config)
    ctx = api.AgentWorkflowContext(
        prompt=deep_copy(work.prompt),
        config=config,
        metadata=deep_copy(work.metadata),
        artifacts_dir=artifacts_dir,
    )

    async def run() -> Any:
        workflow = rollout.workflow_cls(config)
        value = await workflow.run(ctx)
        if value is None:
            return await rollout_ctx.get_sample()
        if isinstance(value, api.AgentWorkflowOutput):
            output = api.AgentWorkflowOutput.model_validate(value)
        elif isinstance(value, list):
            output = api.AgentWorkflowOutput(messages=value)
        else:
            raise TypeError(
                "run() must return AgentWorkflowOutput, a message list, or None; "
                f"got {type(value).__name__}"
            )
        if output.messages is None:
            return None
        return _sample(api, output, work.label)

    return await _phase("workflow", run, budgets.workflow_s)


def _sample(api: Any, output: Any, label: str | None) -> Any:
    """The rollout's sample from a workflow's output, as the SDK's LocalBackend builds it.

    ``trajectory_messages`` is passed: a copy of the messages made by ``deep_copy``. The
    sample is the one the SDK's own construction gives (its validator sets the field, when
    not passed, to ``copy.deepcopy`` of the messages; validation rebuilds each message
    either way, and the set fields are the same), at about half the cost per row.
    """
    try:
        trajectory = deep_copy(list(output.messages))
    except Exception:  # noqa: BLE001 - what cannot be copied, the SDK's validator handles
        return api.RolloutSample(
            messages=output.messages, label=label, metrics=dict(output.metrics)
        )
    return api.RolloutSample(
        messages=output.messages,
        trajectory_messages=trajectory,
        label=label,
        metrics=dict(output.metrics),
    )


async def _grader_phase(
    work: WorkItem,
    rollout: LoadedRollout,
    sample: Any,
    artifacts_dir: Path | None,
    budgets: Budgets,
    api: Any,
) -> Any:
    assert rollout.grader_cls is not None
    ctx = api.GraderContext(
        label=work.label,
        sample=sample,
        metadata=deep_copy(work.metadata),
        artifacts_dir=artifacts_dir,
    )

    async def grade() -> Any:
        grader = rollout.grader_cls(rollout.grader_config)  # type: ignore[misc]
        await grader.grade(ctx)
        if ctx.sample is None:
            raise ValueError(
                "No sample to grade. The workflow must return messages or register a "
                "sample source before grading."
            )
        if not ctx.sample.remove_sample:
            if ctx.sample.reward is None:
                raise ValueError("Sample has no reward after grading")
            if not math.isfinite(ctx.sample.reward):
                raise ValueError(f"reward must be finite, got {ctx.sample.reward!r}")
        return ctx.sample

    return await _phase("grader", grade, budgets.grader_s)


async def _phase(
    name: str,
    body: Callable[[], Awaitable[Any]],
    budget: float | None,
) -> Any:
    """Run one phase in its own task so its budget can cancel it without touching ours.

    No start-up wait falls inside a phase (the session has checked the model and imported
    LiteLLM before any row starts), so its budget is elapsed time less the time other
    rows' synchronous code held the loop (see ``executor.LoopWatch``): only the blocker
    is charged for a block.
    """
    started = time.monotonic()
    owner = object()  # this phase, as the loop watch knows it

    def used() -> float:
        return time.monotonic() - started - stalled_by_others(owner, started)

    ours = False  # whether a cancel the phase sees is ours (budget, session) or its own

    async def guarded() -> Any:
        try:
            return await body()
        except asyncio.CancelledError as exc:
            if ours:
                raise
            raise _Escaped(f"{name} raised CancelledError (the session did not cancel it)") from exc
        except SystemExit as exc:
            raise _Escaped(f"{name} called sys.exit({exc.code!r})") from exc
        except KeyboardInterrupt as exc:
            # A real Ctrl-C reaches the main thread only; this one was raised by rollout code.
            raise _Escaped(f"{name} raised KeyboardInterrupt") from exc
        except LoopStopped as exc:
            raise _Escaped(f"{name} stopped the session's event loop (loop.stop())") from exc

    task = start_owned(owner, guarded())
    try:
        while not task.done():
            left = None if budget is None else budget - used()
            if left is not None and left <= 0:
                break
            await _settled(task, left)
    except asyncio.CancelledError:
        ours = True
        task.cancel()
        raise
    expired = f"{name} timeout after {_seconds(budget)} s"
    if not task.done():
        ours = True
        task.cancel()
        # Give a cooperative phase a moment to unwind; one that swallows the cancel is abandoned.
        await _settled(task, 1.0)
        raise _PhaseFailed(f"{name}_timeout", expired)
    if budget is not None and used() > budget:
        # Synchronous code blocked the loop past the budget and then returned: still a timeout.
        raise _PhaseFailed(f"{name}_timeout", f"{expired} (it blocked the event loop)")
    exc = task.exception()
    if exc is None:
        return task.result()
    if isinstance(exc, _Escaped):
        # The wrapper is the cause kept for --pdb: re-raising a SystemExit there would end
        # the session; the detail is the rollout's own traceback.
        raise _PhaseFailed("agent_error", str(exc), _user_traceback(exc.__cause__ or exc), exc)
    raise _PhaseFailed(
        _categorize(exc),
        f"{name} raised {type(exc).__name__}: {_one_line(exc)}",
        _user_traceback(exc),
        exc,
    )


async def _settled(task: asyncio.Future[Any], timeout: float | None) -> None:
    """Return when ``task`` is done or ``timeout`` seconds have passed (None: no limit).

    ``asyncio.wait({task}, timeout=...)`` for one task, without its sets, its coroutine
    checks and its done/pending split: twice a row, a third of a row's task plumbing.
    """
    if task.done():
        return
    loop = task.get_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        task.remove_done_callback(wake)


def _one_line(exc: BaseException) -> str:
    """A headline must be one line; pydantic's multi-line errors become ``loc: msg`` pairs."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and hasattr(exc, "error_count"):
        try:
            parts = [
                f"{'.'.join(str(p) for p in e.get('loc', ())) or 'value'}: {e.get('msg')}"
                for e in errors()
            ]
            return "; ".join(parts)
        except Exception:  # noqa: BLE001 - fall back to the plain text below
            pass
    return one_line(scrub(str(exc)), 300)  # scrubbed before the cut: no prefix of a value is left


def _bridge_said(exc: BaseException | None, url: str) -> str | None:
    """What the bridge answered a failed model call with (the provider's status and
    message), when ``exc`` is an HTTP client's error for that answer (httpx's
    ``raise_for_status``, the OpenAI SDK's ``APIStatusError``).

    Their own text names the bridge's port and this rollout's id, and httpx adds a link
    to MDN: noise in a headline (annotations, the step summary, ``info``). The full
    exception stays in the detail that ``logs.txt`` keeps.
    """
    seen = 0
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        request = getattr(response, "request", None) if response is not None else None
        if str(getattr(request, "url", "")).startswith(url):
            try:
                error = response.json().get("error")  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - not the bridge's JSON: keep the client's words
                return None
            text = error.get("message") if isinstance(error, dict) else None
            return f"model call failed: {one_line(scrub(text), 300)}" if text else None
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _categorize(exc: BaseException) -> str:
    """The SDK's wire vocabulary for exceptions (``categorize_exception``)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (ValueError, TypeError, AssertionError)):
        return "validation_error"
    return "agent_error"


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}"


def _user_traceback(exc: BaseException) -> str:
    """The exception with our own frames removed: the rollout author's code is what matters."""
    te = traceback.TracebackException.from_exception(exc)
    chain: list[traceback.TracebackException] = []
    current: traceback.TracebackException | None = te
    while current is not None:
        chain.append(current)
        current = current.__cause__ or current.__context__
    api = _api_dirs()
    for part in chain:
        kept = _rollout_frames(part.stack, api)
        if _CARETS_PARSE:
            for frame in kept:  # no ``^^^`` line: no ast.parse here
                for column in ("colno", "end_colno"):
                    setattr(frame, column, None)
        part.stack = traceback.StackSummary.from_list(kept)
    return "".join(te.format()).rstrip()


def _api_dirs() -> tuple[str, ...]:
    """Where the rollout API's code lives: this package, and the SDK when
    ``pytest_osmosis.rollout`` hands out its objects."""
    dirs = [_PACKAGE_DIR]
    sdk = getattr(sys.modules.get("osmosis_ai"), "__file__", None)
    if sdk:
        dirs.append(str(Path(sdk).resolve().parent))
    return tuple(dirs)


_STDLIB = tuple({sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")})
_INSTALLED = tuple({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})


def _rollout_frames(
    stack: traceback.StackSummary, api: tuple[str, ...]
) -> list[traceback.FrameSummary]:
    """The frames without the API's own; and once the rollout's code has called the API
    (``set_reward("high")``), nothing below that call, unless the API called the rollout's
    code back: pydantic validating the reward is the API's implementation, not what the
    rollout's author can act on, but a tool the API calls is the author's."""
    kept: list[traceback.FrameSummary] = []
    for index, frame in enumerate(stack):
        if frame.filename.startswith(api):
            called = any(not seen.filename.startswith(_STDLIB) for seen in kept)
            if called and not any(_authored(below, api) for below in stack[index:]):
                break  # the rest is the API's implementation and the libraries it uses
            continue
        kept.append(frame)
    return kept


def _authored(frame: traceback.FrameSummary, api: tuple[str, ...]) -> bool:
    """A frame of code the rollout's author wrote: neither the API, the standard library
    nor an installed library (a rollout installed with ``pip install -e`` stays authored)."""
    return not frame.filename.startswith((*api, *_STDLIB, *_INSTALLED))


#: Python 3.11 finds a traceback's ``^^^`` marks with ``ast.parse``, and two threads
#: parsing at once can raise SystemError in either (CPython gh-106905): this runs on the
#: rows' loop thread while pytest's main thread may parse. 3.10 draws no marks; 3.12 on
#: is not affected.
_CARETS_PARSE = sys.version_info[:2] == (3, 11)
