"""Server mode: run a rollout as ``osmosis eval run`` 0.3.8 does, over loopback HTTP.

The second implementation of the dispatch seam (``execution/dispatch.py``): instead of
importing the rollout, the session syncs the rollout's own environment, starts its
entrypoint through the SDK's bootstrap in its own process group (``_OSMOSIS_ROLLOUT_PORT``,
``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, an instance id checked on ``/health``), and drives each
work item over the rollout protocol the SDK's supervisor speaks (``LocalEvalRunner``):
``POST /rollout`` (202, or 429 and ``Retry-After``), then the long-polled
``GET /rollout/{id}/result`` with the polling lease. The model calls reach our own bridge
at ``/v1/rollouts/{id}/chat/completions``; the server writes the trajectory into the run
directory itself. Outcomes are classified as the SDK's ``_classify_outcome`` does.

A server that cannot start is the config's one-line error; one that dies mid-run, or a
protocol answer that says nothing about the row, stops the session with the rows pending
(the SDK halts dispatch the same way); a 4xx to ``POST /rollout`` is the row's
``rollout_protocol_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osmosis.core.errors import ResourceExhaustedError, RolloutLoadError, SessionFaultError
from pytest_osmosis.core.outcome import RowResult
from pytest_osmosis.core.words import one_line
from pytest_osmosis.execution.runner import BridgeLike, Budgets, WorkItem
from pytest_osmosis.execution.serve_child import LIFELINE_ENV
from pytest_osmosis.workspace import environment
from pytest_osmosis.workspace.loader import SERVE_ADVICE

if TYPE_CHECKING:
    import aiohttp

    from pytest_osmosis.model.cache import CachedAttempt
    from pytest_osmosis.results.redact import Redactor
    from pytest_osmosis.results.run_log import RunLog

CHILD = str(Path(__file__).with_name("serve_child.py"))
INSTANCE_HEADER = "x-osmosis-rollout-instance-id"
LEASE_HEADER = "X-Osmosis-Rollout-Lease"
HEALTH_TIMEOUT_S = 90.0  # the SDK's _HEALTH_TIMEOUT_SEC
_HEALTH_POLL_S = 0.2
_PORT_ATTEMPTS = 2
_TERM_GRACE_S = 5.0
_EXIT_GRACE_S = 10.0  # a reset connection to a dying server, until its exit is seen
_TRAJECTORY_GRACE_S = 30.0
_RESULT_GRACE_S = 60.0  # beyond both budgets before the supervisor gives up on a row
_DEFAULT_DEADLINE_S = 3600.0
_FINAL = frozenset({"success", "failure", "cancelled"})

_lifeline: tuple[int, int] | None = None


def lifeline() -> int:
    """The read end every server inherits; its write end dies with this process."""
    global _lifeline
    if _lifeline is None:
        read, write = os.pipe()  # both close-on-exec; the read end is passed explicitly
        _lifeline = (read, write)
    return _lifeline[0]


class ServerStartError(RolloutLoadError):
    """The rollout server could not be started (the config's one-line error)."""


@dataclass
class RolloutServer:
    """One rollout's server in this process: started once, serving every row of it.

    ``interpreter``: run the entrypoint on that Python instead of a synced environment
    (the SDK's ``server_interpreter``). Without it a rollout with a ``pyproject.toml`` gets
    ``uv sync`` and ``uv run``; one without runs on this session's interpreter.
    """

    rollout_dir: Path
    entrypoint: Path
    run_dir: Path
    log_redactor: Redactor
    """Redacts ``logs.txt`` lines (every ``[secrets]`` value, as the SDK's)."""
    redactor: Redactor
    """Redacts what else we write (trajectories, messages)."""
    interpreter: str | None = None
    start_timeout: float = HEALTH_TIMEOUT_S
    why: str = ""
    mode: str = "server"
    capacity: int | None = None
    judge_model: str | None = None  # a server's grader is not ours to inspect
    base_url: str = ""
    _log: RunLog | None = None
    _child: asyncio.subprocess.Process | None = None
    _tee: asyncio.Task[None] | None = None
    _last_line: str = ""
    _http: aiohttp.ClientSession | None = None
    _started: asyncio.Lock = field(default_factory=asyncio.Lock)
    _stopping: bool = False
    _slots: asyncio.Semaphore | None = None
    _failed: ServerStartError | None = None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def log(self) -> RunLog:
        """The run's ``logs.txt``, opened (append-only) once the run directory exists."""
        if self._log is None:
            from pytest_osmosis.results.run_log import RunLog

            self._log = RunLog(self.run_dir / "logs.txt", self.log_redactor)
        return self._log

    async def start(self) -> None:
        """Sync, spawn, wait for ``/health``; raises :class:`ServerStartError` in one line."""
        async with self._started:
            if self._child is not None:
                return
            if self._failed is not None:  # one start per session: its error stays the answer
                raise self._failed
            try:
                await self._start()
            except ServerStartError as exc:
                self._failed = exc
                raise

    async def _start(self) -> None:
        import aiohttp

        if not self.entrypoint.is_file():
            raise ServerStartError(f"{self.entrypoint}: the rollout entrypoint does not exist")
        argv = await self._command()
        self._http = aiohttp.ClientSession()
        error: ServerStartError | None = None
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = _free_port()
            instance = uuid.uuid4().hex
            self._stage(f"starting rollout server ({self.entrypoint.name})", port=port)
            self._child = await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(self.rollout_dir),
                env=self._env(port, instance),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(lifeline(),),
            )
            if self._stopping:  # the session ended while this one started
                await self._terminate()
                raise ServerStartError(f"{self.entrypoint}: the session ended before it served")
            self._tee = asyncio.ensure_future(self._copy_output(self._child, "rollout-server"))
            self.base_url = f"http://127.0.0.1:{port}"
            try:
                health = await self._wait_healthy(instance)
            except ServerStartError as exc:
                error = exc
                await self._terminate()
                if attempt < _PORT_ATTEMPTS and "another process" in str(exc):
                    continue
                break
            self.capacity = health_capacity(health)
            # The SDK never has more rows at the server than it advertises (its worker
            # pool); a LocalBackend would queue the rest and charge their wait to the
            # workflow's budget.
            self._slots = asyncio.Semaphore(self.capacity) if self.capacity else None
            self._stage(f"rollout server healthy on port {port}", port=port)
            return
        await self._close_http()
        assert error is not None
        raise error

    async def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after a grace)."""
        self._stopping = True
        await self._terminate()
        await self._close_http()
        log, self._log = self._log, None
        if log is not None:
            log.close()

    async def _command(self) -> list[str]:
        bootstrap = environment.sdk_bootstrap() or "-"
        if self.interpreter is not None:
            # The SDK runs the entrypoint itself on a given interpreter (no bootstrap).
            return [self.interpreter, CHILD, "-", str(self.entrypoint)]
        if not environment.has_own_environment(self.rollout_dir):
            return [sys.executable, CHILD, bootstrap, str(self.entrypoint)]
        try:
            uv = environment.find_uv()
        except RolloutLoadError as exc:  # name the rollout, and why it is not in process
            raise ServerStartError(
                f"{self.rollout_dir}: runs on a server of its own ({self.why}), and {exc}"
            ) from None
        sync = [uv, "sync", "--project", str(self.rollout_dir)]
        python = environment.pick_interpreter(self.rollout_dir)
        if python is not None:
            sync += ["--python", python]
        self._stage(f"syncing rollout dependencies ({self.rollout_dir.name})", step="deps")
        child = await asyncio.create_subprocess_exec(
            *sync,
            cwd=str(self.rollout_dir),
            env=_uv_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            await self._copy_output(child, "deps")
            code = await child.wait()
        except asyncio.CancelledError:
            _kill_group(child.pid)
            raise
        if code != 0:
            raise ServerStartError(
                f"{self.rollout_dir}: uv sync failed with exit code {code}"
                f"{self._last()}; see {self.log.path}"
            )
        return [
            uv,
            "run",
            "--no-sync",
            "--project",
            str(self.rollout_dir),
            CHILD,
            bootstrap,
            str(self.entrypoint),
        ]

    def _env(self, port: int, instance: str) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"}
        env.update(
            {
                "_OSMOSIS_ROLLOUT_PORT": str(port),
                "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(self.run_dir / "rollout_trials"),
                "_OSMOSIS_ROLLOUT_INSTANCE_ID": instance,
                "PYTHONUNBUFFERED": "1",
                LIFELINE_ENV: str(lifeline()),
            }
        )
        return env

    async def _wait_healthy(self, instance: str) -> dict[str, Any]:
        import aiohttp

        assert self._child is not None and self._http is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._child.returncode is not None:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._tee), 2.0)  # type: ignore[arg-type]
                code = self._child.returncode
                if code == 0:  # the entrypoint ran to its end: nothing in it serves
                    raise ServerStartError(
                        f"{self.entrypoint}: the rollout server ended (exit code 0) without "
                        f"serving: `osmosis eval run` runs the entrypoint as __main__ and "
                        f"needs it to {SERVE_ADVICE}; see {self.log.path}"
                    )
                raise ServerStartError(
                    f"{self.entrypoint}: the rollout server exited with code "
                    f"{code} before becoming healthy{self._last()}; see {self.log.path}"
                )
            try:
                async with self._http.get(
                    f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=5)
                ) as response:
                    payload = await response.json() if response.status < 400 else None
                    reported = response.headers.get(INSTANCE_HEADER)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                payload = None
            if isinstance(payload, dict):
                reported = reported or payload.get("instance_id")
                if reported != instance:
                    raise ServerStartError(
                        f"{self.entrypoint}: another process is already listening on "
                        f"{self.base_url} (its /health reports instance_id={reported!r})"
                    )
                return payload
            if self._stopping:
                raise ServerStartError(f"{self.entrypoint}: the session ended before it served")
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.entrypoint}: the rollout server did not become healthy within "
                    f"{self.start_timeout:g} s (`osmosis eval run` needs it to {SERVE_ADVICE})"
                    f"{self._last()}; see {self.log.path}"
                )
            await asyncio.sleep(_HEALTH_POLL_S)

    async def _copy_output(self, child: asyncio.subprocess.Process, step: str) -> None:
        """The child's output, line by line, into ``logs.txt`` (redacted by the RunLog)."""
        stream = child.stdout
        if stream is None:
            return
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line over the stream's limit: take what is there
                raw = await stream.read(65536)
            if not raw:
                return
            text = raw.decode(errors="replace").rstrip()
            if text:
                self._last_line = text
                with contextlib.suppress(OSError, ValueError):
                    self.log.write("info", step, text)

    def _last(self) -> str:
        if not self._last_line:
            return ""
        return f": {one_line(self.redactor.redact(self._last_line), 200)}"

    def _stage(self, message: str, step: str = "server", **details: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.log.write("info", step, message, **details)

    async def _terminate(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.returncode is None:
            await asyncio.get_running_loop().run_in_executor(None, _kill_group, child.pid)
        with contextlib.suppress(Exception):
            await child.wait()
        tee, self._tee = self._tee, None
        if tee is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(tee, 2.0)

    async def _close_http(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    # -- one work item ---------------------------------------------------------------

    async def run(
        self,
        work: WorkItem,
        *,
        bridge: BridgeLike,
        budgets: Budgets,
        pass_threshold: float,
        cache: CachedAttempt | None = None,
        **_unused: Any,
    ) -> dict[str, Any]:
        """One work item over the rollout protocol; the result as the runner builds it."""
        if self._child is None:  # collection started it; here only if it never did
            try:
                await self.start()
            except ServerStartError as exc:
                raise SessionFaultError(str(exc)) from None
        async with self._slots or contextlib.nullcontext():
            return await self._run_one(work, bridge, budgets, pass_threshold, cache)

    async def _run_one(
        self,
        work: WorkItem,
        bridge: BridgeLike,
        budgets: Budgets,
        pass_threshold: float,
        cache: CachedAttempt | None,
    ) -> dict[str, Any]:
        rollout_id = uuid.uuid4().hex
        started = time.monotonic()
        exhaustions = bridge.exhaustions
        url, api_key = bridge.open_rollout(rollout_id, cache)
        request = {
            "initial_messages": work.prompt,
            "label": work.label,
            "metadata": dict(work.metadata) if work.metadata else None,
            "rollout_id": rollout_id,
            "chat_completions_url": url,
            "llm_api_key": api_key,
            "grade": True,
            "agent_timeout_sec": budgets.workflow_s,
            "grader_timeout_sec": budgets.grader_s,
            "extra_fields": {"row_index": work.row_index, "run_index": work.run_index},
        }
        try:
            answer = await self._watching(self._dispatch(request, budgets))
        except BaseException:
            with contextlib.suppress(ResourceExhaustedError):  # a bridge process gone: as raised
                bridge.close_rollout(rollout_id)
            raise
        status, reward, error_type, message = classify(answer)
        if cache is not None and cache.failure is not None:  # replay had no answer: as in process
            status, reward = "failed", None
            error_type, message = cache.failure
        tokens = bridge.close_rollout(rollout_id)
        if status == "failed" and bridge.exhaustions != exhaustions:
            raise ResourceExhaustedError(
                f"{bridge.last_exhaustion}; row {work.source_row_index} run {work.run_index} "
                "was left pending (resume the run to finish it, with fewer rows in flight)"
            )
        has_trajectory = False
        if answer.get("sample") is not None:
            has_trajectory = await self._settle_trajectory(rollout_id)
        return RowResult(
            row_index=work.row_index,
            run_index=work.run_index,
            source_row_index=work.source_row_index,
            rollout_id=rollout_id,
            status=status,
            pass_threshold=pass_threshold,
            reward=reward,
            tokens=tokens,
            duration_ms=(time.monotonic() - started) * 1000.0,
            error_type=error_type,
            message=message,
            extra={
                "has_trajectory": has_trajectory,
                "trajectory_problem": None,
                "rate_limited": bridge.pop_rate_limited(rollout_id),
                "cost_usd": bridge.pop_cost(rollout_id),
                "cache_calls": cache.calls if cache is not None else 0,
                "cache_hits": cache.hits if cache is not None else 0,
                "provider_errors": bridge.pop_provider_errors(rollout_id),
                "exception": None,
            },
        ).as_dict()

    async def _watching(self, step: Any) -> dict[str, Any]:
        """``step``, unless the server dies first: then the session stops, rows pending."""
        child = self._child
        assert child is not None
        task = asyncio.ensure_future(step)
        died = asyncio.ensure_future(child.wait())
        try:
            await asyncio.wait({task, died}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            died.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise self._died()
        answer: dict[str, Any] = task.result()
        return answer

    async def _exited(self) -> bool:
        """Whether the server has exited. A connection its death reset can arrive before
        the exit is seen, so this waits for the exit event (bounded: a live server that
        resets connections is "cannot be reached")."""
        child = self._child
        if child is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(child.wait()), _EXIT_GRACE_S)
        return child.returncode is not None

    def _died(self) -> SessionFaultError:
        code = self._child.returncode if self._child is not None else None
        return SessionFaultError(
            f"the rollout server of {self.rollout_dir.name} exited with code "
            f"{code}{self._last()}; see {self.log.path}"
        )

    async def _dispatch(self, request: dict[str, Any], budgets: Budgets) -> dict[str, Any]:
        """Admit the row, then wait for its terminal result within the supervisor deadline."""
        import aiohttp

        rollout_id = request["rollout_id"]
        try:
            admission = await self._admit(request)
            if admission.get("status") == "failure":  # a 4xx: the row's protocol error
                return admission
            result: dict[str, Any] = await asyncio.wait_for(
                self._poll(rollout_id, admission), _deadline(budgets)
            )
            return result
        except asyncio.TimeoutError:
            assert self._http is not None
            with contextlib.suppress(Exception):
                async with self._http.post(
                    f"{self.base_url}/rollout/cancel", json={"ids": [rollout_id]}
                ):
                    pass
            return {
                "status": "failure",
                "err_category": "callback_timeout",
                "err_message": f"no result within {_deadline(budgets):g} s of dispatch",
            }
        except (aiohttp.ClientError, ValueError, KeyError) as exc:
            if self._stopping:
                raise
            if await self._exited():  # its death reset the connection: say it died
                raise self._died() from None
            raise SessionFaultError(
                f"the rollout server of {self.rollout_dir.name} cannot be reached: "
                f"{type(exc).__name__}: {one_line(str(exc), 200)}"
            ) from None

    async def _admit(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /rollout`` until admitted: a 429 waits its ``Retry-After`` and asks again."""
        assert self._http is not None
        while True:
            async with self._http.post(f"{self.base_url}/rollout", json=request) as response:
                body = await response.text()
                if response.status == 202:
                    return dict(json.loads(body))
                retry = response.headers.get("Retry-After")
            if response.status == 429:
                await asyncio.sleep(_retry_after(retry))
                continue
            if 400 <= response.status < 500:
                return {
                    "status": "failure",
                    "err_category": "rollout_protocol_error",
                    "err_message": (
                        f"POST /rollout returned {response.status}: {one_line(body, 200)}"
                    ),
                }
            raise SessionFaultError(
                f"the rollout server of {self.rollout_dir.name} answered POST /rollout with "
                f"{response.status}: {one_line(body, 200)}"
            )

    async def _poll(self, rollout_id: str, admission: dict[str, Any]) -> dict[str, Any]:
        """The long-polled ``GET /rollout/{id}/result`` (with the lease) until it is final."""
        import aiohttp

        assert self._http is not None
        lease = str(admission["polling_lease_token"])
        wait = float(admission.get("result_wait_timeout_sec", 30.0))
        while True:
            async with self._http.get(
                f"{self.base_url}/rollout/{rollout_id}/result",
                headers={LEASE_HEADER: lease},
                timeout=aiohttp.ClientTimeout(total=wait + 10.0),
            ) as response:
                body = await response.text()
            if response.status != 200:
                raise SessionFaultError(
                    f"the rollout server of {self.rollout_dir.name} answered GET "
                    f"/rollout/{rollout_id}/result with {response.status}: {one_line(body, 200)}"
                )
            result = json.loads(body)
            if result.get("status") in _FINAL:
                return dict(result)

    async def _settle_trajectory(self, rollout_id: str) -> bool:
        """Wait (as the SDK does, up to 30 s) for the server's trajectory; redact it in place."""
        from pytest_osmosis.results.redact import redact_trajectory
        from pytest_osmosis.results.trajectory import write_trajectory

        trial = self.run_dir / "rollout_trials" / rollout_id
        path = trial / "trajectory.json"
        deadline = time.monotonic() + _TRAJECTORY_GRACE_S
        while True:
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
                break
            except (OSError, ValueError):
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.05)
        redacted = redact_trajectory(document, self.redactor)
        if redacted != document:
            write_trajectory(trial, redacted)
        return True


def classify(answer: dict[str, Any]) -> tuple[str, float | None, str | None, str]:
    """status, reward, error_type, message of a terminal result (the SDK's
    ``_classify_outcome``: ``err_category`` or ``err_message`` or ``rollout_failed``)."""
    sample = answer.get("sample") or None
    reward = sample.get("reward") if isinstance(sample, dict) else None
    message = str(answer.get("err_message") or "")
    if answer.get("status") != "success":
        error = answer.get("err_category") or answer.get("err_message") or "rollout_failed"
        return "failed", None, str(error), one_line(message, 300)
    if isinstance(sample, dict) and sample.get("remove_sample"):
        return "skipped", None, None, "the rollout removed this sample (remove_sample)"
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        reward = math.nan
    if not math.isfinite(reward):
        return "failed", None, "validation_error", "the rollout's result carries no reward"
    return "success", float(reward), None, ""


def health_capacity(health: dict[str, Any]) -> int | None:
    """The in-flight cap ``/health`` advertises (the SDK's ``health_capacity``)."""
    nested = health.get("concurrency")
    for value in (
        health.get("max_queue_depth"),
        nested.get("max_concurrent") if isinstance(nested, dict) else None,
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _deadline(budgets: Budgets) -> float:
    """The supervisor's per-row deadline: both budgets plus 60 s, else an hour."""
    if budgets.workflow_s is None or budgets.grader_s is None:
        return _DEFAULT_DEADLINE_S
    return max(budgets.workflow_s, 0.0) + max(budgets.grader_s, 0.0) + _RESULT_GRACE_S


def _retry_after(raw: str | None) -> float:
    try:
        value = float(raw) if raw is not None else 1.0
    except ValueError:
        return 1.0
    return min(max(0.05, value), 60.0) if math.isfinite(value) else 1.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _uv_env() -> dict[str, str]:
    """uv never downloads a Python of its own, and never sees an activated venv."""
    env = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def _kill_group(pid: int, grace: float = _TERM_GRACE_S) -> None:
    """SIGTERM the process group led by ``pid``, SIGKILL what is left after ``grace``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except OSError:
            return
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
