"""Import a rollout entrypoint in process and find its workflow, grader and their configs.

The SDK runs the entrypoint as a server script; we import it the way the SDK's submit
preflight does (a synthetic package, ``__main__`` blocks not run, the rollout directory on
``sys.path``) and then find what its ``LocalBackend`` would run, without starting a server:

1. a ``LocalBackend(...)`` built while the module imports (``backend = LocalBackend(...)``);
2. else a ``main()`` that builds one (the ``osmosis rollout init`` scaffold): we call it and
   stop it at the moment the backend is constructed, before any server code runs;
3. else exactly one concrete workflow class and one grader class in the module namespace.

``osmosis_workflow`` / ``osmosis_grader`` (``module:attr``) override the search.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import inspect
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osmosis.errors import RolloutLoadError


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


_lock = threading.Lock()
_cache: dict[tuple[Path, str | None, str | None], LoadedRollout] = {}


def load_rollout(
    rollout_dir: Path,
    entrypoint: Path,
    *,
    workflow_override: str | None = None,
    grader_override: str | None = None,
) -> LoadedRollout:
    """Import ``entrypoint`` once per process and return what it would run."""
    key = (entrypoint.resolve(), workflow_override, grader_override)
    with _lock:
        if key not in _cache:
            try:
                _cache[key] = _load(
                    rollout_dir.resolve(), key[0], workflow_override, grader_override
                )
            except RolloutLoadError:
                raise
            except (Exception, SystemExit) as exc:
                # Code of the rollout's own outside the entrypoint (a package __init__.py)
                # failed: one error naming the file, like the entrypoint's own failures.
                raise _import_failure(exc, rollout_dir.resolve(), key[0]) from None
        return _cache[key]


def _import_failure(exc: BaseException, rollout_dir: Path, entrypoint: Path) -> RolloutLoadError:
    first = next(
        (
            frame.filename
            for frame in traceback.extract_tb(exc.__traceback__)
            if Path(frame.filename).resolve().is_relative_to(rollout_dir)
        ),
        str(entrypoint),
    )
    if isinstance(exc, SystemExit):
        problem = f"importing the rollout called sys.exit({exc.code!r})"
    else:
        problem = f"importing the rollout failed: {type(exc).__name__}: {exc}"
    return RolloutLoadError(f"{first}: {problem}\n{_user_traceback(exc, rollout_dir)}".rstrip())


def _load(
    rollout_dir: Path, entrypoint: Path, workflow_override: str | None, grader_override: str | None
) -> LoadedRollout:
    import pytest_osmosis.rollout as api

    backends: list[Any] = []
    with _capture_backends(backends, stop=False):
        module = _import_entrypoint(rollout_dir, entrypoint)
    found_by = "LocalBackend built at import"
    main = getattr(module, "main", None)
    if not backends and callable(main) and _defined_in(main, module):
        with _capture_backends(backends, stop=True), contextlib.suppress(_BackendBuilt):
            try:
                main()
            except SystemExit:
                pass
            except Exception as exc:
                raise RolloutLoadError(
                    f"{entrypoint}: main() raised before building its LocalBackend: "
                    f"{type(exc).__name__}: {exc}\n{_user_traceback(exc, rollout_dir)}"
                ) from None
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


def _synthetic_package(rollout_dir: Path) -> str:
    digest = hashlib.sha256(str(rollout_dir).encode("utf-8")).hexdigest()[:16]
    return f"_osmosis_rollout_{digest}"


def _package(name: str, directory: Path) -> None:
    if name in sys.modules:
        return
    init_py = directory / "__init__.py"
    if init_py.is_file():
        spec = importlib.util.spec_from_file_location(
            name, init_py, submodule_search_locations=[str(directory)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return
    module = types.ModuleType(name)
    module.__path__ = [str(directory)]
    module.__package__ = name
    spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    spec.submodule_search_locations = [str(directory)]
    module.__spec__ = spec
    sys.modules[name] = module


def _import_entrypoint(rollout_dir: Path, entrypoint: Path) -> types.ModuleType:
    if str(rollout_dir) not in sys.path:
        # Rollouts use absolute imports for packages that sit beside the entrypoint.
        sys.path.insert(0, str(rollout_dir))
    package = _synthetic_package(rollout_dir)
    parts = entrypoint.relative_to(rollout_dir).with_suffix("").parts
    _package(package, rollout_dir)
    directory, name = rollout_dir, package
    for part in parts[:-1]:
        directory, name = directory / part, f"{name}.{part}"
        _package(name, directory)
    module_name = ".".join((package, *parts))
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, entrypoint)
    if spec is None or spec.loader is None:
        raise RolloutLoadError(f"{entrypoint}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if isinstance(exc, SystemExit):
            # A script-style entrypoint exiting at import must not end the pytest session.
            raise RolloutLoadError(
                f"{entrypoint}: importing the rollout called sys.exit({exc.code!r}); keep "
                f"module level free of exits (the SDK imports it the same way)\n"
                f"{_user_traceback(exc, rollout_dir)}".rstrip()
            ) from None
        if not isinstance(exc, Exception):
            raise
        raise RolloutLoadError(
            f"{entrypoint}: importing the rollout failed: {type(exc).__name__}: {exc}\n"
            f"{_user_traceback(exc, rollout_dir)}"
        ) from None
    return module


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
    import pytest_osmosis._sdk_api as _sdk_api

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
    from pytest_osmosis._sdk_api import resolve_object

    try:
        if ":" not in spec:
            return getattr(module, spec)  # type: ignore[no-any-return]
        return resolve_object(spec)  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError) as exc:
        raise RolloutLoadError(f"{option} = {spec!r}: {type(exc).__name__}: {exc}") from None
