"""Import a rollout entrypoint in process and find its workflow, grader and their configs.

The SDK runs the entrypoint as a server script; we import it the way the SDK's submit
preflight does (a synthetic package, ``__main__`` blocks not run, the packages beside it
importable by name, each rollout's privately: isolation.py) and then find what its
``LocalBackend`` would run, without starting a server:

1. a ``LocalBackend(...)`` built while the module imports (``backend = LocalBackend(...)``);
2. else a ``main()`` that builds one (the ``osmosis rollout init`` scaffold): we call it and
   stop it at the moment the backend is constructed, before any server code runs;
3. else exactly one concrete workflow class and one grader class in the module namespace.

``osmosis_workflow`` / ``osmosis_grader`` (``module:attr``) override the search.

Any other ``ExecutionBackend`` (the SDK's ``HarborBackend`` runs the agent in a Docker
sandbox) is refused, as is any server start; ``main()`` is bounded (``_call_main``).
"""

from __future__ import annotations

import contextlib
import inspect
import socket
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osmosis.errors import NeedsServerError, RolloutLoadError
from pytest_osmosis.workspace import isolation


@dataclass(frozen=True)
class LoadedRollout:
    """What one rollout runs: classes are instantiated per work item, as the SDK does."""

    entrypoint: Path
    workflow_cls: type[Any]
    workflow_config: Any
    grader_cls: type[Any] | None
    grader_config: Any
    found_by: str


class _BackendBuilt(BaseException):
    """Raised out of ``main()`` once its backend exists, so no server starts."""


class _Refused(BaseException):
    """Raised into rollout code that builds a non-local backend or starts a server."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


DEFAULT_MAIN_TIMEOUT = 30.0  # generous: a loaded CI machine must not refuse a sound main()

_lock = threading.Lock()
_cache: dict[tuple[Path, str | None, str | None], LoadedRollout] = {}


def forget_loaded() -> None:
    """Forget the rollouts imported so far: a new session in the same process (pytester's
    in-process runs) loads each one anew, so an edited grader is the one that runs."""
    with _lock:
        _cache.clear()


def load_rollout(
    rollout_dir: Path,
    entrypoint: Path,
    *,
    workflow_override: str | None = None,
    grader_override: str | None = None,
    main_timeout: float = DEFAULT_MAIN_TIMEOUT,
) -> LoadedRollout:
    """Import ``entrypoint`` once per process and return what it would run."""
    key = (entrypoint.resolve(), workflow_override, grader_override)
    with _lock:
        if key not in _cache:
            try:
                _cache[key] = _load(
                    rollout_dir.resolve(), key[0], workflow_override, grader_override, main_timeout
                )
            except RolloutLoadError:
                raise
            except (Exception, SystemExit) as exc:
                # Code of the rollout's own outside the entrypoint (a package __init__.py)
                # failed: one error naming the file, like the entrypoint's own failures.
                raise _import_failure(exc, rollout_dir.resolve(), key[0]) from None
        return _cache[key]


def _import_failure(exc: BaseException, rollout_dir: Path, entrypoint: Path) -> RolloutLoadError:
    """One error naming the rollout file whose import failed (the entrypoint, or a package
    ``__init__.py`` it imported), with the rollout's own frames."""
    first = next(
        (
            frame.filename
            for frame in traceback.extract_tb(exc.__traceback__)
            if Path(frame.filename).resolve().is_relative_to(rollout_dir)
        ),
        str(entrypoint),
    )
    if isinstance(exc, SystemExit):
        # A script-style rollout exiting at import must not end the pytest session.
        problem = (
            f"importing the rollout called sys.exit({exc.code!r}); keep module level free "
            "of exits (the SDK imports it the same way)"
        )
    else:
        problem = f"importing the rollout failed: {type(exc).__name__}: {exc}"
    return RolloutLoadError(f"{first}: {problem}\n{_user_traceback(exc, rollout_dir)}".rstrip())


def _load(
    rollout_dir: Path,
    entrypoint: Path,
    workflow_override: str | None,
    grader_override: str | None,
    main_timeout: float,
) -> LoadedRollout:
    rollout = isolation.register(rollout_dir)
    with isolation.loading(rollout), _guard.watch() as refusals:
        try:
            loaded = _find(rollout, entrypoint, workflow_override, grader_override, main_timeout)
        except (_Refused, RolloutLoadError):
            if not refusals:  # a refusal swallowed by the rollout still wins
                raise
        if refusals:
            raise NeedsServerError(
                f"{entrypoint}: {refusals[0]}; pytest-osmosis runs only LocalBackend rollouts, "
                "in process: run this one with `osmosis eval run`"
            )
        return loaded


def _find(
    rollout: isolation.Rollout,
    entrypoint: Path,
    workflow_override: str | None,
    grader_override: str | None,
    main_timeout: float,
) -> LoadedRollout:
    import pytest_osmosis.rollout as api

    backends: list[Any] = []
    with _capture_backends(backends, stop=False):
        module = _import_entrypoint(rollout, entrypoint)
    found_by = "LocalBackend built at import"
    main = getattr(module, "main", None)
    if not backends and callable(main) and _defined_in(main, module):
        with _capture_backends(backends, stop=True):
            _call_main(main, rollout, entrypoint, main_timeout)
        found_by = "LocalBackend built by main()"
    workflow_cls: Any = None
    grader_cls: Any = None
    workflow_config: Any = None
    grader_config: Any = None
    if backends:
        if len(backends) > 1:
            raise RolloutLoadError(
                f"{entrypoint}: {len(backends)} LocalBackend objects were built; keep one, or "
                "name the classes with the ini options osmosis_workflow / osmosis_grader "
                "('module:attr')"
            )
        backend = backends[0]
        workflow_cls, grader_cls = backend.workflow_cls, backend.grader_cls
        workflow_config, grader_config = backend.workflow_config, backend.grader_config
    else:
        found_by = "classes in the module"
        if not workflow_override:
            workflow_cls = _only_subclass(module, api.AgentWorkflow, "workflow", entrypoint)
        if not grader_override:
            grader_cls = _only_subclass(module, api.Grader, "grader", entrypoint)
        workflow_config = _only_instance(module, api.AgentWorkflowConfig)
        grader_config = _only_instance(module, api.GraderConfig)
    if workflow_override:
        workflow_cls = _resolve_override(workflow_override, module, "osmosis_workflow")
        found_by = "osmosis_workflow"
    if grader_override:
        grader_cls = _resolve_override(grader_override, module, "osmosis_grader")
    if workflow_cls is None:
        raise RolloutLoadError(f"{entrypoint}: no workflow found")
    return LoadedRollout(
        entrypoint=entrypoint,
        workflow_cls=workflow_cls,
        workflow_config=workflow_config,
        grader_cls=grader_cls,
        grader_config=grader_config,
        found_by=found_by,
    )


def _import_entrypoint(rollout: isolation.Rollout, entrypoint: Path) -> types.ModuleType:
    rollout_dir = rollout.directory
    try:
        return isolation.import_module(rollout, entrypoint.relative_to(rollout_dir))
    except RolloutLoadError as exc:
        raise RolloutLoadError(f"{entrypoint}: {exc}") from None
    except _Refused:
        raise
    except BaseException as exc:
        if not isinstance(exc, (Exception, SystemExit)):
            raise
        raise _import_failure(exc, rollout_dir, entrypoint) from None


def _call_main(main: Any, rollout: isolation.Rollout, entrypoint: Path, timeout: float) -> None:
    """Run ``main()`` until it builds its backend, in a daemon thread bounded by ``timeout``.

    A ``main()`` that blocks (waits on something, serves without a backend) cannot be
    stopped from outside: its thread is abandoned, stays guarded (no server, no backend)
    and dies with the process.
    """
    outcome: list[BaseException | None] = []
    refusals = _guard.current()

    def target() -> None:
        with _guard.thread(refusals), isolation.loading(rollout):
            try:
                main()
            except BaseException as exc:  # handed to the loading thread
                outcome.append(exc)
            else:
                outcome.append(None)

    thread = threading.Thread(target=target, name=f"osmosis-main-{rollout.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise RolloutLoadError(
            f"{entrypoint}: main() of rollout {rollout.name!r} did not build its backend "
            f"within {timeout:g}s (ini osmosis_main_timeout); it is left running in a "
            "daemon thread. Build the LocalBackend before anything that blocks"
        )
    exc = outcome[0]
    if exc is None or isinstance(exc, (_BackendBuilt, SystemExit)):
        return
    if isinstance(exc, (_Refused, RolloutLoadError)) or not isinstance(exc, Exception):
        raise exc
    raise RolloutLoadError(
        f"{entrypoint}: main() raised before building its LocalBackend: "
        f"{type(exc).__name__}: {exc}\n{_user_traceback(exc, rollout.directory)}"
    ) from None


def _loopback(host: Any) -> bool:
    """``""`` (every interface) is not loopback; names other than localhost are refused."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return bool(ipaddress.ip_address(str(host).split("%")[0]).is_loopback)
    except ValueError:
        return False


class _Guard:
    """While a rollout loads, refuse what must never happen in process.

    Building an ``ExecutionBackend`` that is not a ``LocalBackend`` (its sandboxed code would
    run on the host), starting uvicorn, binding a non-loopback address (any thread), and
    binding any address in the loading threads (a server start). A ``main()`` thread its
    load gave up on stays guarded (``_call_main``), so the patches stay while it lives; what
    it does then is refused into that thread and reported to nobody.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: list[list[str]] = []  # the refusals of each load in progress
        self._threads: dict[int, list[str]] = {}  # guarded thread -> its load's refusals
        self._undo: list[Any] = []
        self._audited = False
        self._uvicorn: Any = None

    @contextlib.contextmanager
    def watch(self) -> Iterator[list[str]]:
        """Guard this thread for one load; yields the refusals, the first one first."""
        refusals: list[str] = []
        with self._lock:
            self._loads.append(refusals)
            self._install()
        try:
            with self.thread(refusals):
                yield refusals
        finally:
            with self._lock:
                self._loads.remove(refusals)
                self._uninstall_if_idle()

    @contextlib.contextmanager
    def thread(self, refusals: list[str]) -> Iterator[None]:
        ident = threading.get_ident()
        with self._lock:
            self._threads[ident] = refusals
            self._install()
        try:
            yield
        finally:
            with self._lock:
                self._threads.pop(ident, None)
                self._uninstall_if_idle()

    def current(self) -> list[str]:
        """The refusals of the load this thread runs (for a thread it starts)."""
        return self._threads[threading.get_ident()]

    def _refusals(self, *, any_thread: bool) -> list[str] | None:
        """Where a refusal by this thread is reported; None: nothing to refuse here."""
        own = self._threads.get(threading.get_ident())
        if own is not None or not any_thread:
            return own
        return self._loads[-1] if self._loads else None

    def refuse(self, what: str, *, any_thread: bool = True) -> None:
        refusals = self._refusals(any_thread=any_thread)
        if refusals is not None:
            refusals.append(what)
            raise _Refused(what)

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        original = vars(owner).get(name)
        setattr(owner, name, value)

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _install(self) -> None:
        if not self._audited:
            sys.addaudithook(self._audit)  # hooks cannot be removed; idle it is one compare
            self._audited = True
        self._patch_backends()  # each time: the SDK may have been imported since
        uvicorn = sys.modules.get("uvicorn")
        if uvicorn is not None and self._uvicorn is not uvicorn:
            self._patch_uvicorn(uvicorn)

    def _uninstall_if_idle(self) -> None:
        if self._loads or self._threads:
            return
        while self._undo:
            self._undo.pop()()
        self._uvicorn = None

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        """``socket.bind`` of every socket (C code's too): a server's first step."""
        if event != "socket.bind" or not (self._loads or self._threads):
            return
        sock, address = args
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return
        host, port = address[0], address[1]
        self.refuse(f"it starts a server (binds {host}:{port})", any_thread=False)
        if not _loopback(host):
            self.refuse(f"it binds {host}:{port}")

    def _patch_backends(self) -> None:
        """A ``__new__`` on each ``ExecutionBackend`` base, installed once and kept.

        Deleting a ``__new__`` set on a class does not give back ``object.__new__``'s own
        argument handling (CPython), so it stays: outside a load it only builds the object.
        """
        import pytest_osmosis.rollout  # noqa: F401  (imports the SDK when present)
        import pytest_osmosis.workspace._sdk_api as ours

        bases: list[type[Any]] = [ours.ExecutionBackend]
        sdk = sys.modules.get("osmosis_ai.rollout.backend.base")
        if sdk is not None and isinstance(getattr(sdk, "ExecutionBackend", None), type):
            bases.append(sdk.ExecutionBackend)
        guard = self

        def __new__(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
            if (guard._loads or guard._threads) and not issubclass(cls, tuple(_backend_classes())):
                guard.refuse(
                    f"it builds {cls.__qualname__} ({cls.__module__}), an ExecutionBackend "
                    "that is not a LocalBackend"
                )
            return object.__new__(cls)

        __new__.osmosis_guard = True  # type: ignore[attr-defined]
        for base in bases:
            existing = getattr(vars(base).get("__new__"), "__func__", None)
            if "__new__" not in vars(base) or getattr(existing, "osmosis_guard", False):
                base.__new__ = staticmethod(__new__)  # type: ignore[assignment]

    def _patch_uvicorn(self, uvicorn: Any) -> None:
        self._uvicorn = uvicorn
        guard = self
        server = getattr(uvicorn, "Server", None)
        serve = getattr(server, "serve", None)
        if isinstance(server, type) and callable(serve):

            async def guarded_serve(self: Any, *args: Any, **kwargs: Any) -> Any:
                guard.refuse("it starts a uvicorn server")
                return await serve(self, *args, **kwargs)

            self._patch(server, "serve", guarded_serve)
        run = getattr(uvicorn, "run", None)
        if callable(run):

            def guarded_run(*args: Any, **kwargs: Any) -> Any:
                guard.refuse("it starts a server (uvicorn.run)")
                return run(*args, **kwargs)

            self._patch(uvicorn, "run", guarded_run)


_guard = _Guard()


def _user_traceback(exc: BaseException, rollout_dir: Path) -> str:
    """The rollout's own frames only: what its author needs, without our import machinery."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve().is_relative_to(rollout_dir)
    ]
    if isinstance(exc, SyntaxError) and exc.filename:
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    lines = traceback.format_list(frames) if frames else []
    return ("Traceback (rollout frames):\n" + "".join(lines)).rstrip() if lines else ""


def _backend_classes() -> list[type[Any]]:
    import pytest_osmosis.workspace._sdk_api as _sdk_api

    classes: list[type[Any]] = [_sdk_api.LocalBackend]
    sdk = sys.modules.get("osmosis_ai.rollout")
    if sdk is not None and isinstance(getattr(sdk, "LocalBackend", None), type):
        classes.append(sdk.LocalBackend)
    return classes


@contextlib.contextmanager
def _capture_backends(found: list[Any], *, stop: bool) -> Iterator[None]:
    """Record every LocalBackend constructed inside the block (and stop there if asked).

    Only outermost constructions count: a ``"main:MyWorkflow"`` string makes the backend
    import ``main`` again while it is being built, and that copy's own module-level
    backend is the SDK's side effect of the re-import, not a second backend of the rollout.
    """
    import pytest_osmosis.rollout  # noqa: F401  (imports the SDK when present)

    originals: dict[type[Any], Any] = {}
    depth = threading.local()

    def wrap(cls: type[Any], original: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            level = getattr(depth, "value", 0)
            depth.value = level + 1
            try:
                original(self, *args, **kwargs)
            finally:
                depth.value = level
            if level:
                return
            found.append(self)
            if stop:
                raise _BackendBuilt

        return __init__

    for cls in _backend_classes():
        originals[cls] = cls.__dict__["__init__"]
        cls.__init__ = wrap(cls, originals[cls])
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__init__ = original


def _defined_in(obj: Any, module: types.ModuleType) -> bool:
    return getattr(obj, "__module__", None) == module.__name__


def _only_subclass(
    module: types.ModuleType, base: type[Any], what: str, entrypoint: Path
) -> type[Any] | None:
    found = sorted(
        {
            value
            for value in vars(module).values()
            if inspect.isclass(value)
            and issubclass(value, base)
            and value is not base
            and not inspect.isabstract(value)
        },
        key=lambda c: c.__qualname__,
    )
    option = f"osmosis_{what}"
    if len(found) == 1:
        return found[0]
    if not found:
        raise RolloutLoadError(
            f"{entrypoint}: no {what} found: define or import one concrete "
            f"{base.__name__} subclass, build a LocalBackend, or set the ini option "
            f"{option} = 'module:Class'"
        )
    names = ", ".join(c.__qualname__ for c in found)
    raise RolloutLoadError(
        f"{entrypoint}: several {what} classes ({names}); build a LocalBackend or set the "
        f"ini option {option} = 'module:Class'"
    )


def _only_instance(module: types.ModuleType, cls: type[Any]) -> Any:
    found = [value for value in vars(module).values() if isinstance(value, cls)]
    return found[0] if len(found) == 1 else None


def _resolve_override(spec: str, module: types.ModuleType, option: str) -> type[Any]:
    from pytest_osmosis.workspace._sdk_api import resolve_object

    try:
        if ":" not in spec:
            return getattr(module, spec)  # type: ignore[no-any-return]
        return resolve_object(spec)  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError) as exc:
        raise RolloutLoadError(f"{option} = {spec!r}: {type(exc).__name__}: {exc}") from None
