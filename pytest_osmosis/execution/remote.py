"""Rows run by xdist workers on other hosts (``--tx ssh=…``): what they need, what comes back.

A remote worker shares no disk with the controller, so:

- the workspace must already be on its host, at the same path or under
  ``--osmosis-remote-root``; before any worker starts, the controller compares the files a
  run depends on (each config, its dataset, its rollout's source files) with the remote
  host's by SHA-256 (:func:`digests`, run on both sides) and refuses in one line naming what
  differs (:func:`differences`);
- ``[secrets]`` values and the model provider's key travel in memory over xdist's channel
  (:func:`forwarded_environment`, in ``workerinput``) into the worker's ``os.environ``:
  never into a file or onto a command line on that host;
- the journal's records travel the same way (what a resume carries forward);
- each attempt's files (its trajectory and artifacts) are written into a scratch directory
  on the worker's host, then travel back on the item's report (:func:`pack_trial`) and
  the scratch copy is removed; the controller writes them (:func:`unpack_trial`), so only
  the controller writes the run directory.

A plain library: the xdist glue is in plugin.py and session.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

#: Per-provider variables a route reads besides its key (the base URL of a gateway).
_PROVIDER_SUFFIXES = ("_API_KEY", "_API_BASE", "_BASE_URL")


def remote_path(path: Path, local_root: Path, remote_root: str) -> str:
    """*path* (under *local_root*) where it is on the remote host."""
    relative = path.resolve().relative_to(local_root.resolve())
    return str(PurePosixPath(remote_root, *relative.parts))


def workspace_parts(
    configs: Iterable[Path],
    datasets: Iterable[Path],
    rollouts: Iterable[tuple[Path, Path]],
    root: Path,
) -> tuple[list[str], list[tuple[str, str]]]:
    """What :func:`digests` compares, relative to *root*: files (configs, datasets) and
    rollout directories (each with its output root, which the traversal skips)."""

    def relative(path: Path) -> str:
        return path.resolve().relative_to(root.resolve()).as_posix()

    files = sorted({relative(path) for path in (*configs, *datasets)})
    dirs = sorted({(relative(path), _relative_or_outside(out, root)) for path, out in rollouts})
    return files, dirs


def _relative_or_outside(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return ""  # outside the workspace root: nothing of it is inside a rollout


def digests(root: str, files: Sequence[str], dirs: Sequence[Sequence[str]]) -> dict[str, str]:
    """Relative path -> SHA-256 of each of *files* and of every source file of each rollout
    directory in *dirs* (``results.manifest.source_files``); a missing file is absent."""
    from pytest_osmosis.results.manifest import source_files

    base = Path(root)
    found: dict[str, str] = {}
    for name in files:
        digest = _file_digest(base / name)
        if digest is not None:
            found[name] = digest
    for rollout, output in dirs:
        directory = base / rollout
        if not directory.is_dir():
            continue
        for parts, path in source_files(directory, base / output if output else None):
            digest = _file_digest(path)
            if digest is not None:
                found["/".join((rollout, *parts))] = digest
    return found


def _file_digest(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def differences(mine: Mapping[str, str], theirs: Mapping[str, str], limit: int = 5) -> str | None:
    """``rollouts/calc/main.py (changed), data/calc.jsonl (missing)``, or None when equal."""

    def how(name: str) -> str:
        return "missing" if name not in theirs else "only there" if name not in mine else "changed"

    names = sorted(set(mine) | set(theirs))
    found = [f"{name} ({how(name)})" for name in names if mine.get(name) != theirs.get(name)]
    if not found:
        return None
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(found[:limit]) + more


def channel_digests(channel: Any) -> None:
    """The remote end of the check (run by ``gateway.remote_exec``): receives
    ``(root, files, dirs)``, sends back :func:`digests` of the remote host's workspace."""
    root, files, dirs = channel.receive()
    channel.send(digests(root, files, dirs) if os.path.isdir(root) else None)


#: What ``gateway.remote_exec`` runs on the remote host (its own installed plugin).
REMOTE_CHECK = (
    "from pytest_osmosis.execution.remote import channel_digests\nchannel_digests(channel)\n"
)


def forwarded_environment(
    secret_names: Iterable[str], model_paths: Iterable[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The variables a remote worker gets in memory: the ``[secrets]`` names and, for each
    model's provider (``openai/…``), its key and base-URL variables, as set here."""
    from pytest_osmosis.model.routes import DEFAULT_API_KEY_ENV, provider_of

    names = set(secret_names)
    for model in model_paths:
        provider = provider_of(model)
        if not provider:
            continue
        names.add(DEFAULT_API_KEY_ENV.get(provider, f"{provider.upper()}_API_KEY"))
        names.update(provider.upper() + suffix for suffix in _PROVIDER_SUFFIXES)
    return {name: environ[name] for name in sorted(names) if environ.get(name)}


def pack_trial(trial_dir: Path) -> dict[str, bytes]:
    """An attempt's regular files (relative POSIX path -> bytes), then its directory removed."""
    files: dict[str, bytes] = {}
    if trial_dir.is_dir():
        for dirpath, _dirnames, filenames in os.walk(trial_dir):
            for name in filenames:
                path = Path(dirpath, name)
                if path.is_file() and not path.is_symlink():
                    files[path.relative_to(trial_dir).as_posix()] = path.read_bytes()
        shutil.rmtree(trial_dir, ignore_errors=True)
    return files


def unpack_trial(trial_dir: Path, files: Mapping[str, bytes]) -> None:
    """Write an attempt's files that came back from a remote worker (refusing paths that
    would leave *trial_dir*)."""
    from pytest_osmosis.results.atomic import atomic_write_bytes

    for name, data in files.items():
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"a remote worker sent a file outside its trial: {name!r}")
        target = trial_dir.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, data, durable=False)
