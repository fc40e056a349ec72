"""The session's bridge served from a process of its own (issue 30 item 2, option (a)).

On the LiteLLM route the bridge and its provider client cost ~5 ms of CPU a call; in the
pytest process they share one GIL with the rollouts' clients and pytest itself while the
second core idles. Here the same :class:`~pytest_osmosis.model.bridge.Bridge` runs in a
helper interpreter (``python -m pytest_osmosis.model.bridge_process <ctl> <log>``, started
by ``subprocess`` with two socketpair ends in ``pass_fds``: no fork, the parent has
threads), and the parent holds a :class:`RemoteBridge` with ``Bridge``'s public surface.
LiteLLM is imported in the helper only. `placement` is the one decision of where a
session's bridge runs (docs/notes/both-cores.md §4).

Only the cross-thread API crosses, as length-prefixed pickles on the control socket, one
blocking round trip at a time: ``open`` (the rollout's URL and key come back, so no request
can beat its opening), ``usage``, ``close`` (everything a row's result reads, in one
snapshot), ``judges``, ``preflight``, ``stop``. The helper's log records (already formatted
and redacted there) come back on the second socket and are re-emitted by the parent's
logger of the same name. A helper that dies is one exhaustion: every row closing after it
raises :class:`ResourceExhaustedError` naming the helper and its exit, so the runner's rule
applies (not journalled, the session stops with that line, a resume re-runs those rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osmosis.core.errors import ModelPreflightError, ResourceExhaustedError

if TYPE_CHECKING:
    from pytest_osmosis.model.cache import CachedAttempt, CallCache
    from pytest_osmosis.model.routes import ModelRoute

__all__ = ["ENV", "MIN_PENDING", "RemoteBridge", "placement"]

logger = logging.getLogger("pytest_osmosis.model.bridge")

ENV = "OSMOSIS_BRIDGE_PROCESS"
"""``0``: the bridge always runs in the pytest process; ``1``: in a process of its own
wherever that is faithful, whatever the run's size and the machine's cores."""
MIN_PENDING = 200
"""Below this many pending attempts the helper's start (~0.3 s of CPU) is not worth it."""
_HEADER = struct.Struct("!I")
HELPER_FILE = __file__


def placement(route: ModelRoute, pending: int, *, offline: bool) -> str:
    """``"process"`` or ``"in-process"``: where the session's bridge for ``route`` runs.

    A process of its own only where rows reach the model through LiteLLM (the direct route
    gains nothing, §2 of the note), where a provider is called at all (not a cache replay),
    where no code in this process has configured LiteLLM (its globals would not cross) and
    the route's settings can travel; then by ``OSMOSIS_BRIDGE_PROCESS``, else when the run
    has at least ``MIN_PENDING`` pending attempts and this process may use two CPUs.
    """
    from pytest_osmosis.model.direct import litellm_configured, rows_go_direct
    from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH

    forced = os.environ.get(ENV, "").strip()
    if forced == "0" or os.name != "posix":  # the helper inherits its sockets (pass_fds)
        return "in-process"
    if offline or route.model_path == EMBEDDED_MODEL_PATH:
        return "in-process"
    if rows_go_direct(route) or litellm_configured():
        return "in-process"
    try:
        pickle.dumps(route)
    except Exception:  # noqa: BLE001 - settings that do not pickle stay in this process
        return "in-process"
    if forced == "1":
        return "process"
    return "process" if pending >= MIN_PENDING and _cpus() >= 2 else "in-process"


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------- framing


def _send(sock: socket.socket, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    """The next message, or raises EOFError when the other end is gone."""
    try:
        header = _recv_exact(sock, _HEADER.size)
        data = _recv_exact(sock, _HEADER.unpack(header)[0]) if header is not None else None
    except OSError:
        data = None
    if data is None:
        raise EOFError
    return pickle.loads(data)


# --------------------------------------------------------------------- the parent's side


class _Dead(Exception):
    """The helper is gone (its line is `RemoteBridge.last_exhaustion`)."""


class RemoteBridge:
    """`Bridge`'s public surface, served by the helper process; one per session and model.

    `start`, `preflight` and `close` run on the caller's event loop; the per-row calls
    (`open_rollout`, `call_usage`, `close_rollout`, ...) are one blocking round trip each,
    from any thread (~30 us).
    """

    def __init__(self, route: ModelRoute, judge_models: Iterable[str] = ()) -> None:
        self.route = route
        self.offline = False
        self.calls = 0
        self.errors = 0
        self.tokens_total = 0
        self.preflight_warning: str | None = None
        self.exhaustions = 0
        self.last_exhaustion = ""
        self.max_connections = 0
        self._judges = {m.strip() for m in judge_models if m.strip()}
        self._sent_judges: set[str] = set()
        self._base = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._lock = threading.Lock()
        self._closed: dict[str, dict[str, Any]] = {}
        """Per rollout closed: what its `close` answered, until the pops take it."""
        self._attempts: dict[str, CachedAttempt] = {}
        """Per open rollout using the model-call cache: the parent's view, whose counts
        the helper's `close` fills in."""
        self._logged = 0
        self._logs_done = False
        self._log_cond = threading.Condition()
        self._log_reader: threading.Thread | None = None
        self._dead: str | None = None
        self._stopping = False

    @property
    def base_url(self) -> str:
        if not self._base:
            raise RuntimeError("RemoteBridge.start() has not run")
        return self._base

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the helper; it binds its listener and starts importing LiteLLM."""
        try:
            await asyncio.to_thread(self._spawn)
        except _Dead:
            raise ModelPreflightError(self.last_exhaustion) from None

    def _spawn(self) -> None:
        import pytest_osmosis

        ctl, ctl_child = socket.socketpair()
        log, log_child = socket.socketpair()
        env = dict(os.environ)
        here = str(Path(pytest_osmosis.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        fds = (ctl_child.fileno(), log_child.fileno())
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            ctl_child.close()
            log_child.close()
        self._ctl = ctl
        self._log_reader = threading.Thread(
            target=self._read_logs, args=(log,), name="osmosis-bridge-logs", daemon=True
        )
        self._log_reader.start()
        self._base, self.max_connections = self._call(
            "start", self.route, sorted(self._judges), logging.getLogger().getEffectiveLevel()
        )
        self._sent_judges = set(self._judges)

    async def preflight(self) -> None:
        """The model check, in the helper (LiteLLM's import and the same `check_model`)."""
        try:
            self.preflight_warning = await asyncio.to_thread(self._call, "preflight")
        except _Dead:
            raise ModelPreflightError(self.last_exhaustion) from None

    async def close(self) -> None:
        """Stop the helper: its bridge closes, its cache writes what it queued, it exits."""
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        """`close`, from a thread that may block (the session's end)."""
        proc = self._proc
        if proc is None or self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(_Dead):
            self.calls, self.errors, self.tokens_total = self._call("stop")
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._log_reader is not None:
            self._log_reader.join(timeout=5)
        if self._ctl is not None:
            self._ctl.close()

    # ----------------------------------------------------------------- per row

    def open_rollout(
        self, rollout_id: str, cache: CachedAttempt | None = None
    ) -> tuple[str, str]:
        """As `Bridge.open_rollout`; the helper makes the key and serves the URL."""
        spec = None
        if cache is not None:
            spec = (
                str(cache.cache.path),
                cache.cache.mode,
                cache.cache.max_age_s,
                cache.row,
                cache.source_row,
                cache.attempt,
            )
        try:
            url, key, self.exhaustions = self._call("open", rollout_id, spec)
        except _Dead:
            # No listener answers any more: the row's calls are refused at once.
            return f"{self.base_url}/v1/rollouts/{rollout_id}", secrets.token_urlsafe(32)
        with self._lock:
            self._closed.pop(rollout_id, None)
            if cache is not None:
                self._attempts[rollout_id] = cache
        return str(url), str(key)

    def call_usage(self, rollout_id: str) -> list[dict[str, int]]:
        try:
            usage: list[dict[str, int]] = self._call("usage", rollout_id)
        except _Dead:
            return []
        return usage

    def close_rollout(self, rollout_id: str) -> int | None:
        """As `Bridge.close_rollout`; raises :class:`ResourceExhaustedError` once the helper
        is gone: what the row spent cannot be known, so it is not recorded."""
        try:
            snapshot: dict[str, Any] = self._call("close", rollout_id)
        except _Dead:
            raise ResourceExhaustedError(
                f"{self.last_exhaustion}; rollout {rollout_id} was left pending "
                "(resume the run to finish it)"
            ) from None
        self.calls, self.errors, self.tokens_total = snapshot.pop("totals")
        self.exhaustions = snapshot["exhaustions"] + (1 if self._dead else 0)
        self.last_exhaustion = snapshot["last_exhaustion"] or self.last_exhaustion
        cache = snapshot.pop("cache")
        with self._log_cond:  # its calls' log lines come first, as in one process
            self._log_cond.wait_for(
                lambda: self._logged >= snapshot["logged"] or self._logs_done, timeout=10
            )
        with self._lock:
            self._closed[rollout_id] = snapshot
        if cache is not None:
            self._cached_counts(rollout_id, cache)
        tokens: int | None = snapshot["tokens"]
        return tokens

    def _cached_counts(self, rollout_id: str, counts: tuple[int, int]) -> None:
        with self._lock:
            attempt = self._attempts.pop(rollout_id, None)
        if attempt is not None:
            attempt.calls, attempt.hits = counts

    def _pop(self, rollout_id: str, field: str, default: Any) -> Any:
        with self._lock:
            snapshot = self._closed.get(rollout_id)
            if snapshot is None:
                return default
            value = snapshot.pop(field, default)
            if not {"cost", "rate_limited", "provider_errors"} & snapshot.keys():
                del self._closed[rollout_id]
            return value

    def pop_cost(self, rollout_id: str) -> float | None:
        cost: float | None = self._pop(rollout_id, "cost", None)
        return cost

    def pop_rate_limited(self, rollout_id: str) -> int:
        return int(self._pop(rollout_id, "rate_limited", 0))

    def pop_provider_errors(self, rollout_id: str) -> int:
        return int(self._pop(rollout_id, "provider_errors", 0))

    def allow_judge_models(self, models: Iterable[str]) -> None:
        """As `Bridge.allow_judge_models`; only ids the helper has not been told cross."""
        new = {m.strip() for m in models if m.strip()} - self._sent_judges
        if not new:
            return
        with contextlib.suppress(_Dead):
            self._call("judges", sorted(new))
            self._sent_judges |= new

    # ----------------------------------------------------------------- the wire

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            if self._dead is not None or self._ctl is None:
                raise _Dead
            try:
                _send(self._ctl, (op, args))
                ok, value = _recv(self._ctl)
            except (EOFError, OSError):
                pass
            else:
                if ok:
                    return value
                raise value
        self._died()
        raise _Dead

    def _died(self) -> None:
        """The helper is gone: one exhaustion, whose line names it and how it exited."""
        proc = self._proc
        if self._stopping or proc is None:
            return
        code = proc.wait()
        line = f"the osmosis bridge process (pid {proc.pid}) exited with code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                line += f" ({signal.Signals(-code).name})"
        with self._lock:
            if self._dead is None:
                self._dead = line
                self.exhaustions += 1
                self.last_exhaustion = line

    def _read_logs(self, sock: socket.socket) -> None:
        """Re-emit the helper's log records here, in order, until it exits."""
        try:
            while True:
                try:
                    name, level, message, exc_text = _recv(sock)
                except EOFError:
                    break
                target = logging.getLogger(name)
                if target.isEnabledFor(level):
                    if exc_text:
                        message = f"{message}\n{exc_text}"
                    # Made by the factory, whole: the session's redaction sees its text.
                    record = target.makeRecord(name, level, HELPER_FILE, 0, message, (), None)
                    target.handle(record)
                with self._log_cond:
                    self._logged += 1
                    self._log_cond.notify_all()
        finally:
            sock.close()
            with self._log_cond:
                self._logs_done = True
                self._log_cond.notify_all()
            self._died()


# --------------------------------------------------------------------- the helper's side


class _Forward(logging.Handler):
    """Sends each record, formatted here (so redacted as in one process), to the parent."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.sent = 0
        self._send_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc_text = None
            if record.exc_info:
                exc_text = logging.Formatter().formatException(record.exc_info)
            item = (record.name, record.levelno, record.getMessage(), exc_text)
            with self._send_lock:
                _send(self.sock, item)
                self.sent += 1
        except Exception:  # noqa: BLE001 - the parent is gone: nothing to tell
            pass


class _Helper:
    """The helper's state: its bridge on the main thread's loop, the control on a thread."""

    def __init__(self, ctl: socket.socket, forward: _Forward) -> None:
        self.ctl = ctl
        self.forward = forward
        self.loop = asyncio.new_event_loop()
        self.bridge: Any = None
        self.caches: dict[str, CallCache] = {}
        self.attempts: dict[str, CachedAttempt] = {}

    def on_loop(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def serve(self) -> None:
        """Answer the parent's messages, one at a time, until ``stop`` or its end."""
        try:
            while True:
                try:
                    op, args = _recv(self.ctl)
                except EOFError:
                    return  # the parent is gone
                try:
                    value = getattr(self, f"op_{op}")(*args)
                except BaseException as exc:  # noqa: BLE001 - answered, as raised
                    try:
                        pickle.dumps(exc)
                    except Exception:  # noqa: BLE001
                        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
                    _send(self.ctl, (False, exc))
                    continue
                _send(self.ctl, (True, value))
                if op == "stop":
                    return
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

    def op_start(self, route: ModelRoute, judges: list[str], level: int) -> tuple[str, int]:
        from pytest_osmosis.model.bridge import Bridge
        from pytest_osmosis.model.litellm import start_import

        logging.getLogger().setLevel(level)
        start_import()  # beside the parent's collection; the preflight waits for it
        self.bridge = Bridge(route, judges)
        self.on_loop(self.bridge.start())
        return self.bridge.base_url, self.bridge.max_connections

    def op_preflight(self) -> str | None:
        from pytest_osmosis.model.preflight import check_model

        warning: str | None = self.on_loop(check_model(self.bridge.route, in_process=True))
        return warning

    def op_open(self, rollout_id: str, spec: tuple[Any, ...] | None) -> tuple[str, str, int]:
        attempt = None
        if spec is not None:
            from pytest_osmosis.model.cache import CachedAttempt, CallCache

            path, mode, max_age, row, source_row, number = spec
            cache = self.caches.get(path)
            if cache is None:
                cache = self.caches[path] = CallCache(Path(path), mode, max_age).open()
            attempt = CachedAttempt(cache, row, source_row, number)
            self.attempts[rollout_id] = attempt
        url, key = self.bridge.open_rollout(rollout_id, attempt)
        return url, key, self.bridge.exhaustions

    def op_usage(self, rollout_id: str) -> list[dict[str, int]]:
        usage: list[dict[str, int]] = self.bridge.call_usage(rollout_id)
        return usage

    def op_close(self, rollout_id: str) -> dict[str, Any]:
        bridge = self.bridge
        attempt = self.attempts.pop(rollout_id, None)
        return {
            "tokens": bridge.close_rollout(rollout_id),
            "cost": bridge.pop_cost(rollout_id),
            "rate_limited": bridge.pop_rate_limited(rollout_id),
            "provider_errors": bridge.pop_provider_errors(rollout_id),
            "exhaustions": bridge.exhaustions,
            "last_exhaustion": bridge.last_exhaustion,
            "cache": (attempt.calls, attempt.hits) if attempt is not None else None,
            "logged": self.forward.sent,
            "totals": (bridge.calls, bridge.errors, bridge.tokens_total),
        }

    def op_judges(self, models: list[str]) -> None:
        self.bridge.allow_judge_models(models)

    def op_stop(self) -> tuple[int, int, int]:
        bridge = self.bridge
        if bridge is None:
            return 0, 0, 0
        self.on_loop(bridge.close())
        for cache in self.caches.values():
            cache.close()  # what the bridge queued is written before the parent reads on
        return bridge.calls, bridge.errors, bridge.tokens_total


def main(argv: list[str]) -> int:
    """The helper: ``<control fd> <log fd>``, both ends of the parent's socketpairs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    ctl = socket.socket(fileno=int(argv[0]))
    forward = _Forward(socket.socket(fileno=int(argv[1])))
    root = logging.getLogger()
    root.handlers[:] = [forward]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    helper = _Helper(ctl, forward)
    control = threading.Thread(target=helper.serve, name="osmosis-bridge-control", daemon=True)
    asyncio.set_event_loop(helper.loop)
    control.start()
    helper.loop.run_forever()
    control.join(timeout=5)
    for cache in helper.caches.values():
        cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
