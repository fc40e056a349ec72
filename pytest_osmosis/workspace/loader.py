"""Import a rollout entrypoint in process and find its workflow, grader and their configs.

The SDK runs the entrypoint as a server script; we import it the way the SDK's submit
preflight does (a synthetic package, ``__main__`` blocks not run, the packages beside it
importable by name, each rollout's privately: isolation.py) and then find what its
``LocalBackend`` would run, without starting a server:

1. a ``LocalBackend(...)`` built while the module imports (``backend = LocalBackend(...)``);
2. else a ``main()`` that builds one (the ``osmosis rollout init`` scaffold): we call it with
   ``_OSMOSIS_ROLLOUT_PORT`` set, as the SDK's server would be, and stop it where it starts
   serving (uvicorn, a listening socket, a bind to a fixed port), which tells us whether
   ``osmosis eval run`` could reach it (``LoadedRollout.warnings``);
3. else exactly one concrete workflow class and one grader class in the module namespace.

``osmosis_workflow`` / ``osmosis_grader`` (``module:attr``) override the search.

Any other ``ExecutionBackend`` (the SDK's ``HarborBackend`` runs the agent in a Docker
sandbox) is refused, as is a server started before the backend exists (at import, or by
``main()`` first); a bind to a loopback address on port 0 is no server (urllib3 probes IPv6
that way when imported). ``main()`` is bounded (``_call_main``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import secrets
import socket
import sys
import sysconfig
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import NeedsServerError, RolloutLoadError
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
    #: One line each, naming the entrypoint: what would keep ``osmosis eval run`` from
    #: reaching the rollout's server although we can run it.
    warnings: tuple[str, ...] = ()


class _Refused(BaseException):
    """Raised into rollout code that builds a non-local backend or starts a server."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Served(BaseException):
    """Raised out of ``main()`` where it starts serving its backend: no server starts."""

    def __init__(self, what: str, port: int | None) -> None:
        super().__init__(what)
        self.port = port


@dataclass(frozen=True)
class _Refusal:
    what: str  # "starts a server (uvicorn.run)"
    where: str  # "main.py:40", or "urllib3/util/connection.py:80, imported from main.py:3"
    backend: bool  # a non-local backend, else a server start
    in_main: bool  # seen in main()'s thread


@dataclass
class _Load:
    """One rollout load in progress, as the guard sees it."""

    refusals: list[_Refusal] = field(default_factory=list)
    main_thread: int | None = None  # the thread running the rollout's main()
    backend_built: bool = False  # main() built its LocalBackend: its server start ends it


#: Where ``osmosis eval run`` tells the rollout's server which port to serve on.
ROLLOUT_PORT_VARIABLE = "_OSMOSIS_ROLLOUT_PORT"
#: What ``osmosis eval run`` needs of an entrypoint it starts (its bootstrap runs the file as
#: ``__main__`` and waits for ``/health`` on this port), in the words every message uses.
SERVE_ADVICE = (
    'serve from main(), called under `if __name__ == "__main__":`, with '
    "create_rollout_server(backend=...) run by uvicorn on "
    f'int(os.environ["{ROLLOUT_PORT_VARIABLE}"])'
)
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
        problem = f"importing the rollout failed: {type(exc).__name__}: {exc}{_sdk_hint(exc)}"
    return RolloutLoadError(f"{first}: {problem}\n{_user_traceback(exc, rollout_dir)}".rstrip())


def _sdk_hint(exc: BaseException) -> str:
    """What to do about a rollout written against ``osmosis_ai`` where the SDK is absent (a
    user's own workspace, run on the Python 3.10/3.11 the SDK does not support)."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name != "osmosis_ai":
        return ""
    if sys.version_info < (3, 12):
        return (
            " (osmosis-ai, the Osmosis SDK, needs Python 3.12 or newer: import the same "
            "names from pytest_osmosis.rollout instead)"
        )
    return (
        " (pip install osmosis-ai, the Osmosis SDK, or import the same names from "
        "pytest_osmosis.rollout)"
    )


def _load(
    rollout_dir: Path,
    entrypoint: Path,
    workflow_override: str | None,
    grader_override: str | None,
    main_timeout: float,
) -> LoadedRollout:
    rollout = isolation.register(rollout_dir, entrypoint.parent)
    with _rollout_port() as port, isolation.loading(rollout), _guard.watch() as load:
        try:
            loaded = _find(
                rollout, entrypoint, workflow_override, grader_override, main_timeout, port
            )
        except (_Refused, RolloutLoadError):
            if not load.refusals:  # a refusal swallowed by the rollout still wins
                raise
        if load.refusals:
            raise NeedsServerError(_refusal_line(entrypoint, load.refusals[0]))
        return loaded


@contextlib.contextmanager
def _rollout_port() -> Iterator[int]:
    """``_OSMOSIS_ROLLOUT_PORT`` while the rollout loads, as ``osmosis eval run`` sets it for
    its server: a port no default names, so the port ``main()`` serves on tells whether it
    read this variable. Nothing ever binds it (the guard stops the server start)."""
    port = 20000 + secrets.randbelow(40000)
    before = os.environ.get(ROLLOUT_PORT_VARIABLE)
    os.environ[ROLLOUT_PORT_VARIABLE] = str(port)
    try:
        yield port
    finally:
        if before is None:
            os.environ.pop(ROLLOUT_PORT_VARIABLE, None)
        else:
            os.environ[ROLLOUT_PORT_VARIABLE] = before


def _refusal_line(entrypoint: Path, refusal: _Refusal) -> str:
    """The load's one-line error: what was seen, where, and what to do in this case."""
    seen = f"{refusal.what} at {refusal.where}"
    if refusal.backend:
        return (
            f"{entrypoint}: it {seen}; in process pytest-osmosis runs only LocalBackend "
            "rollouts: run it as the SDK does, with `--osmosis-execution server` or "
            "`osmosis eval run`"
        )
    if refusal.in_main:
        return (
            f"{entrypoint}: main() {seen} before building its LocalBackend; build the "
            "LocalBackend first: pytest-osmosis runs main() only until it starts serving"
        )
    return (
        f"{entrypoint}: it {seen} while being imported; pytest-osmosis imports the rollout, "
        "as `osmosis eval submit` does, and nothing may serve then: start the server in "
        'main() or under `if __name__ == "__main__":`'
    )


def _find(
    rollout: isolation.Rollout,
    entrypoint: Path,
    workflow_override: str | None,
    grader_override: str | None,
    main_timeout: float,
    port: int,
) -> LoadedRollout:
    from pytest_osmosis.workspace import rollout_api as api

    backends: list[Any] = []
    warnings: list[str] = []
    with _capture_backends(backends):
        module = _import_entrypoint(rollout, entrypoint)
    found_by = "LocalBackend built at import"
    main = getattr(module, "main", None)
    if not backends and callable(main) and _defined_in(main, module):
        load = _guard.current()

        def built() -> None:
            load.backend_built = True

        with _capture_backends(backends, built=built):
            warnings += _call_main(main, rollout, entrypoint, main_timeout, port)
        del backends[1:]  # what main() serves is the first one it built
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
        warnings=tuple(warnings),
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


def _call_main(
    main: Any, rollout: isolation.Rollout, entrypoint: Path, timeout: float, port: int
) -> list[str]:
    """Run ``main()`` in a daemon thread bounded by ``timeout``, until it starts serving the
    backend it built; returns the warnings about how it serves (one line each).

    ``osmosis eval run`` starts ``main()`` and waits for a server on ``_OSMOSIS_ROLLOUT_PORT``
    (``port`` here), so a ``main()`` that serves on another port, or never serves, runs here
    but never there. A ``main()`` that blocks (waits on something, serves without a backend)
    cannot be stopped from outside: its thread is abandoned, stays guarded (no server, no
    backend) and dies with the process.
    """
    outcome: list[BaseException | None] = []
    load = _guard.current()

    def target() -> None:
        with _guard.thread(load), isolation.loading(rollout):
            load.main_thread = threading.get_ident()
            try:
                main()
            except BaseException as exc:  # handed to the loading thread
                outcome.append(exc)
            else:
                outcome.append(None)

    thread = threading.Thread(target=target, name=f"osmosis-main-{rollout.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    unreachable = "`osmosis eval run` will not reach it"
    if not outcome:
        if load.backend_built:
            return [
                f"{entrypoint}: main() built its LocalBackend but did not serve it within "
                f"{timeout:g}s (ini osmosis_main_timeout): {unreachable} if it never does"
            ]
        raise RolloutLoadError(
            f"{entrypoint}: main() of rollout {rollout.name!r} did not build its backend "
            f"within {timeout:g}s (ini osmosis_main_timeout); it is left running in a "
            "daemon thread. Build the LocalBackend before anything that blocks"
        )
    exc = outcome[0]
    if isinstance(exc, _Served):
        if exc.port == port:
            return []
        return [
            f"{entrypoint}: main() serves on port {exc.port}, not on the one "
            f"{ROLLOUT_PORT_VARIABLE} names: {unreachable} (serve on "
            f'int(os.environ["{ROLLOUT_PORT_VARIABLE}"]))'
        ]
    if isinstance(exc, (_Refused, RolloutLoadError)) or not isinstance(
        exc, (Exception, SystemExit, type(None))
    ):
        raise exc
    if load.backend_built:
        ended = "returned" if exc is None else f"ended ({_exception_line(exc)})"
        return [
            f"{entrypoint}: main() builds its LocalBackend but {ended} without serving it: "
            f"{unreachable} ({SERVE_ADVICE})"
        ]
    if exc is None or isinstance(exc, SystemExit):
        return []
    raise RolloutLoadError(
        f"{entrypoint}: main() raised before building its LocalBackend: "
        f"{_exception_line(exc)}\n{_user_traceback(exc, rollout.directory)}"
    ) from None


def _exception_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _loopback(host: Any) -> bool:
    """``""`` (every interface) is not loopback; names other than localhost are refused."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return bool(ipaddress.ip_address(str(host).split("%")[0]).is_loopback)
    except ValueError:
        return False


_OURS = str(Path(__file__).resolve().parent.parent) + os.sep
_PATHS = {key: os.path.realpath(path) + os.sep for key, path in sysconfig.get_paths().items()}


def _library(real: str) -> bool:
    """A file neither ours nor the standard library's (site-packages may lie inside it)."""
    if real.startswith(_OURS):
        return False
    installed = (_PATHS["purelib"], _PATHS["platlib"])
    stdlib = (_PATHS["stdlib"], _PATHS["platstdlib"])
    return real.startswith(installed) or not real.startswith(stdlib)


def _where() -> str:
    """``file:line`` of the code that did it: the innermost frame that is neither ours nor
    the standard library's, and the rollout's own line that led there when that differs."""
    frame: types.FrameType | None = sys._getframe(1)
    seen: str | None = None
    while frame is not None:
        file = frame.f_code.co_filename
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(isolation.PREFIX):
            own = f"{file}:{frame.f_lineno}"
            return own if seen is None else f"{seen}, reached from {own}"
        if seen is None and not file.startswith("<"):
            real = os.path.realpath(file)
            if _library(real):
                seen = f"{_short(real)}:{frame.f_lineno}"
        frame = frame.f_back
    return seen or "no caller outside the standard library"


def _short(path: str) -> str:
    """A library file relative to the import-path entry it was found under."""
    roots = [os.path.realpath(p) for p in sys.path if p]
    best = max((r for r in roots if path.startswith(r + os.sep)), key=len, default=None)
    return path if best is None else path[len(best) + 1 :]


class _Guard:
    """While a rollout loads, refuse what must never happen in process.

    Building an ``ExecutionBackend`` that is not a ``LocalBackend`` (its sandboxed code would
    run on the host), and starting a server: uvicorn, a listening socket, a bind to a fixed
    port in the loading threads, a bind to a non-loopback address in any thread. A bind to a
    loopback address on port 0 is no server (urllib3's IPv6 probe at import). Once ``main()``
    has built its LocalBackend, its server start is what ends it (``_Served``), not a refusal.
    A ``main()`` thread its load gave up on stays guarded (``_call_main``), so the patches
    stay while it lives; what it does then is refused into that thread and reported to nobody.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: list[_Load] = []  # each load in progress
        self._threads: dict[int, _Load] = {}  # guarded thread -> its load
        self._undo: list[Any] = []
        self._audited = False
        self._listen = False
        self._uvicorn: Any = None

    @contextlib.contextmanager
    def watch(self) -> Iterator[_Load]:
        """Guard this thread for one load; yields it (its refusals, the first one first)."""
        load = _Load()
        with self._lock:
            self._loads.append(load)
            self._install()
        try:
            with self.thread(load):
                yield load
        finally:
            with self._lock:
                self._loads.remove(load)
                self._uninstall_if_idle()

    @contextlib.contextmanager
    def thread(self, load: _Load) -> Iterator[None]:
        ident = threading.get_ident()
        with self._lock:
            self._threads[ident] = load
            self._install()
        try:
            yield
        finally:
            with self._lock:
                self._threads.pop(ident, None)
                self._uninstall_if_idle()

    def current(self) -> _Load:
        """The load this thread runs (for a thread it starts)."""
        return self._threads[threading.get_ident()]

    def _load_of(self, *, any_thread: bool) -> _Load | None:
        """The load a refusal by this thread belongs to; None: nothing to refuse here."""
        own = self._threads.get(threading.get_ident())
        if own is not None or not any_thread:
            return own
        return self._loads[-1] if self._loads else None

    def refuse(self, what: str, *, backend: bool = False, any_thread: bool = True) -> None:
        load = self._load_of(any_thread=any_thread)
        if load is not None:
            in_main = load.main_thread == threading.get_ident()
            load.refusals.append(_Refusal(what, _where(), backend, in_main))
            raise _Refused(what)

    def serves(self, what: str, port: int | None, *, any_thread: bool) -> None:
        """A server start: the end of a ``main()`` that built its backend, else refused."""
        load = self._load_of(any_thread=any_thread)
        if load is None:
            return
        if load.backend_built and load.main_thread == threading.get_ident():
            raise _Served(what, port)
        self.refuse(what, any_thread=any_thread)

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
        if not self._listen:
            self._patch_listen()
        uvicorn = sys.modules.get("uvicorn")
        if uvicorn is not None and self._uvicorn is not uvicorn:
            self._patch_uvicorn(uvicorn)

    def _uninstall_if_idle(self) -> None:
        if self._loads or self._threads:
            return
        while self._undo:
            self._undo.pop()()
        self._uvicorn = None
        self._listen = False

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        """``socket.bind`` of every socket (C code's too): a server's first step, unless it
        is to a loopback address on port 0 (no one can be told where to connect)."""
        if event != "socket.bind" or not (self._loads or self._threads):
            return
        sock, address = args
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return
        host, port = address[0], address[1]
        if not _loopback(host):
            self.serves(f"binds {host}:{port}", port, any_thread=True)
        elif port:
            self.serves(f"binds {host}:{port}", port, any_thread=False)

    def _patch_listen(self) -> None:
        """``listen`` has no audit event: the socket class's own, while anything is guarded."""
        self._listen = True
        listen = socket.socket.listen
        guard = self

        def guarded_listen(sock: socket.socket, *args: Any) -> None:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                host, port = sock.getsockname()[:2]
                guard.serves(f"listens on {host}:{port}", port, any_thread=False)
            listen(sock, *args)

        self._patch(socket.socket, "listen", guarded_listen)

    def _patch_backends(self) -> None:
        """A ``__new__`` on each ``ExecutionBackend`` base, installed once and kept.

        Deleting a ``__new__`` set on a class does not give back ``object.__new__``'s own
        argument handling (CPython), so it stays: outside a load it only builds the object.
        """
        import pytest_osmosis.workspace._sdk_api as ours
        import pytest_osmosis.workspace.rollout_api  # noqa: F401  (imports the SDK when present)

        bases: list[type[Any]] = [ours.ExecutionBackend]
        sdk = sys.modules.get("osmosis_ai.rollout.backend.base")
        if sdk is not None and isinstance(getattr(sdk, "ExecutionBackend", None), type):
            bases.append(sdk.ExecutionBackend)
        guard = self

        def __new__(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
            if (guard._loads or guard._threads) and not issubclass(cls, tuple(_backend_classes())):
                guard.refuse(
                    f"builds {cls.__qualname__} ({cls.__module__}), an ExecutionBackend "
                    "that is not a LocalBackend",
                    backend=True,
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
                port = getattr(getattr(self, "config", None), "port", None)
                guard.serves("starts a uvicorn server", port, any_thread=True)
                return await serve(self, *args, **kwargs)

            self._patch(server, "serve", guarded_serve)
        run = getattr(uvicorn, "run", None)
        if callable(run):
            try:
                default = inspect.signature(run).parameters["port"].default
            except (KeyError, TypeError, ValueError):
                default = None

            def guarded_run(*args: Any, **kwargs: Any) -> Any:
                port = kwargs.get("port", default)
                guard.serves("starts a server (uvicorn.run)", port, any_thread=True)
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
def _capture_backends(
    found: list[Any], *, built: Callable[[], None] | None = None
) -> Iterator[None]:
    """Record every LocalBackend constructed inside the block (``built`` is told of each).

    Only outermost constructions count: a ``"main:MyWorkflow"`` string makes the backend
    import ``main`` again while it is being built, and that copy's own module-level
    backend is the SDK's side effect of the re-import, not a second backend of the rollout.
    """
    import pytest_osmosis.workspace.rollout_api  # noqa: F401  (imports the SDK when present)

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
            if built is not None:
                built()

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
