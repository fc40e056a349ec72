"""Each rollout's own modules live under names private to it: two rollouts never share code.

Rollouts import the packages beside their entrypoint by absolute name (``from
multiply_rollout.tools import ...``), and the rollouts of one workspace often ship the same
name. Putting every rollout directory on ``sys.path`` would make the first one imported win
for all of them. Instead every module loaded from a rollout directory is registered as
``_osmosis_rollout_<sha>.<relative.path>`` (the SDK's submit-preflight package) and executes
with builtins of its own whose ``__import__`` maps the rollout's top-level names to that
package. A top-level name is looked up as the SDK's server bootstrap puts the rollout on
``sys.path``: the entrypoint's own directory first (``agent/main.py`` imports
``agent/helpers.py`` as ``helpers``), then the rollout directory (where its project's
packages live, as ``osmosis eval submit``'s preflight and an installed project see them).
The mapping belongs to the importing module, not to a moment: an import inside a workflow
body resolves to its own rollout whichever rollout's task the event loop is running.

``importlib.import_module`` skips ``__import__``; a meta-path finder answers bare names of
the rollout being loaded (LocalBackend's ``"module:attr"`` strings) or, at run time, of the
rollout whose code is on the calling stack. Third-party packages stay shared and normal.
A module that resolves into *another* rollout's directory (a package pip-installed from it)
cannot be isolated, so the import is refused in one line naming both rollouts.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import RolloutLoadError

PREFIX = "_osmosis_rollout_"


@dataclass
class Rollout:
    """One rollout directory, seen from one entrypoint directory inside it, and the private
    package its modules live in."""

    directory: Path
    package: str
    entry_directory: Path | None = None  # None: the rollout directory itself
    builtins: dict[str, Any] = field(default_factory=dict)
    owned: dict[str, str | None] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def search_path(self) -> list[str]:
        """Where top-level names are looked up, first first (the SDK bootstrap's order)."""
        first = self.entry_directory or self.directory
        return list(dict.fromkeys((str(first), str(self.directory))))

    def owns(self, top: str) -> bool:
        """Whether ``import <top>`` means a module of this rollout."""
        return self.private(top) is not None

    def private(self, top: str) -> str | None:
        """The private name ``import <top>`` means in this rollout, if it means one of its
        modules (as if ``search_path`` led ``sys.path``).

        A regular module or package found there wins over everything but built-in modules;
        a bare directory (namespace portion) only when nothing else provides it.
        """
        if top not in self.owned:
            private = None
            if top and top not in sys.builtin_module_names and not top.startswith(PREFIX):
                spec = importlib.machinery.PathFinder.find_spec(top, self.search_path)
                if spec is not None:
                    if spec.loader is not None and spec.origin is not None:
                        found = Path(spec.origin).parent
                        if spec.submodule_search_locations is not None:
                            found = found.parent  # a package: origin is its __init__.py
                        private = self._private_name(found, top)
                    elif importlib.machinery.PathFinder.find_spec(top) is None:
                        locations = list(spec.submodule_search_locations or ())
                        if locations:
                            private = self._private_name(Path(locations[0]).parent, top)
            self.owned[top] = private
        return self.owned[top]

    def _private_name(self, found_in: Path, top: str) -> str:
        parts = found_in.relative_to(self.directory).parts
        return ".".join((self.package, *parts, top))


_rollouts: dict[str, Rollout] = {}
_state = threading.local()
_install_lock = threading.Lock()


def package_name(rollout_dir: Path, entry_dir: Path | None = None) -> str:
    """One private package per rollout directory and entrypoint directory: entrypoints in
    two folders of one rollout see different modules as ``helpers``, as the SDK's two
    servers would."""
    key = str(rollout_dir)
    if entry_dir is not None and entry_dir != rollout_dir:
        key += "\0" + str(entry_dir)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return f"{PREFIX}{digest}"


def register(rollout_dir: Path, entry_dir: Path | None = None) -> Rollout:
    """The private package of ``rollout_dir`` seen from ``entry_dir`` (once per process)."""
    _install()
    if entry_dir is not None:
        entry_dir = entry_dir.resolve()
        if entry_dir == rollout_dir:
            entry_dir = None
    package = package_name(rollout_dir, entry_dir)
    rollout = _rollouts.get(package)
    if rollout is None:
        rollout = Rollout(directory=rollout_dir, package=package, entry_directory=entry_dir)
        rollout.builtins = {**vars(builtins), "__import__": _importer(rollout)}
        _rollouts[package] = rollout
    return rollout


@contextmanager
def loading(rollout: Rollout) -> Iterator[None]:
    """Bare names this thread imports by ``importlib`` resolve to ``rollout`` meanwhile.

    The aliases this creates under bare names in ``sys.modules`` are removed at the end,
    so nothing of one rollout stays visible to the next one loaded.
    """
    previous = getattr(_state, "rollout", None)
    _state.rollout = rollout
    try:
        yield
    finally:
        _state.rollout = previous
        forget_aliases(rollout)


def forget_aliases(rollout: Rollout) -> None:
    while rollout.aliases:
        name = rollout.aliases.pop()
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__name__", name) != name:
            del sys.modules[name]


def import_module(rollout: Rollout, relative: Path) -> types.ModuleType:
    """Import ``relative`` (a ``.py`` path inside the rollout) under the private package."""
    parts = relative.with_suffix("").parts
    return importlib.import_module(".".join((rollout.package, *parts)))


def _package_spec(rollout: Rollout) -> importlib.machinery.ModuleSpec | None:
    init_py = rollout.directory / "__init__.py"
    locations = [str(rollout.directory)]
    if init_py.is_file():
        return importlib.util.spec_from_file_location(
            rollout.package,
            init_py,
            loader=_RolloutLoader(rollout.package, str(init_py), rollout),
            submodule_search_locations=locations,
        )
    spec = importlib.machinery.ModuleSpec(rollout.package, None, is_package=True)
    spec.submodule_search_locations = locations
    return spec


class _RolloutLoader(importlib.machinery.SourceFileLoader):
    """Source loader whose modules import through their rollout's own ``__import__``."""

    def __init__(self, fullname: str, path: str, rollout: Rollout) -> None:
        super().__init__(fullname, path)
        self.rollout = rollout

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self.rollout.builtins
        super().exec_module(module)


class _AliasLoader(importlib.abc.Loader):
    """A bare name answered with the rollout's private module (never a second copy)."""

    def __init__(self, target: str, rollout: Rollout) -> None:
        self.target = target
        self.rollout = rollout
        self.spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        self.rollout.aliases.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # module_from_spec put the alias's spec there


class _Finder(importlib.abc.MetaPathFinder):
    """Loads private modules with their rollout's builtins; aliases bare names."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        root, dot, rest = fullname.partition(".")
        rollout = _rollouts.get(root)
        if rollout is not None:
            if not dot:
                return _package_spec(rollout)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
                spec.loader = _RolloutLoader(fullname, str(spec.origin), rollout)
            return spec
        parent = sys.modules.get(root) if dot else None
        if parent is not None:
            private = getattr(parent, "__name__", root)
            owner = _rollouts.get(private.partition(".")[0])
            if owner is None or private == root:
                return None
            return importlib.machinery.ModuleSpec(
                fullname, _AliasLoader(f"{private}.{rest}", owner)
            )
        if dot:
            return None
        owner = _owner_of(fullname)
        aliased = owner.private(fullname) if owner is not None else None
        if owner is None or aliased is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(aliased, owner))


def _owner_of(top: str) -> Rollout | None:
    owners = [r for r in _rollouts.values() if r.owns(top)]
    if not owners:
        return None
    current: Rollout | None = getattr(_state, "rollout", None)
    if current is not None:
        return current if current in owners else None
    caller = _calling_rollout()
    if caller is None or caller not in owners:
        return None
    if len(owners) > 1:
        # The alias would stay in sys.modules and answer the other rollouts' lookups.
        others = ", ".join(repr(r.name) for r in owners if r is not caller)
        raise RolloutLoadError(
            f"rollout {caller.name!r}: importlib.import_module({top!r}) at run time is "
            f"ambiguous, rollout(s) {others} ship {top!r} too; use an import statement "
            f"(import {top}), which resolves to the rollout's own copy"
        )
    return caller


def _calling_rollout() -> Rollout | None:
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(PREFIX):
            return _rollouts.get(name.partition(".")[0])
        frame = frame.f_back
    return None


def _importer(rollout: Rollout) -> Any:
    def __import__(
        name: str,
        globals: dict[str, Any] | None = None,
        locals: Any = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        real = builtins.__import__
        top, _, rest = name.partition(".")
        private = rollout.private(top) if level == 0 else None
        if private is not None:
            module = real(f"{private}.{rest}" if rest else private, globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[private]
        module = real(name, globals, locals, fromlist, level)
        if level == 0 and name not in rollout.checked:
            _refuse_foreign(rollout, name)
            rollout.checked.add(name)
        return module

    return __import__


def _refuse_foreign(rollout: Rollout, name: str) -> None:
    """Refuse a module of another rollout's directory: its code is not this rollout's."""
    file = getattr(sys.modules.get(name), "__file__", None)
    if not file:
        return
    path = Path(os.path.realpath(file))
    rollouts_root = rollout.directory.parent
    if not path.is_relative_to(rollouts_root) or path.is_relative_to(rollout.directory):
        return
    other = path.relative_to(rollouts_root).parts[0]
    top = name.partition(".")[0]
    raise RolloutLoadError(
        f"rollouts {rollout.name!r} and {other!r}: package {top!r} imported by rollout "
        f"{rollout.name!r} resolves to {path} (installed from rollout {other!r}), so "
        f"rollout {rollout.name!r} would run code of rollout {other!r} under its own source "
        f"digest: ship a copy of the package inside rollouts/{rollout.name}/, or move the "
        "shared package out of rollouts/ and install it from there"
    )


def _install() -> None:
    with _install_lock:
        if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
