"""The user-facing copies ``trajectories/row_<r>_run_<n>.json`` and ``artifacts/row_<r>_run_<n>/``.

``rollout_trials/<id>/artifacts/`` is written by user code, so nothing in it is
trusted: symlinks (files or directories, and a symlinked root), unsafe path
parts, non-regular files and the reserved top-level ``manifest.json`` are
skipped with a warning, never copied (a symlink would otherwise exfiltrate host
files into the projection). Directories are walked without following links, so
every copied file lies inside the artifact root. Copies are independent bytes:
editing a projection never changes what ``osmosis eval upload`` sends.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from pytest_osmosis.results.atomic import atomic_write_bytes
from pytest_osmosis.results.index import TRIALS_DIRNAME

TRAJECTORIES_DIRNAME = "trajectories"
ARTIFACTS_DIRNAME = "artifacts"
#: Reserved by the platform's download layout; excluded on both sides.
_RESERVED_ARTIFACT_NAME = "manifest.json"
_UPLOAD_REFUSES = "(osmosis eval upload refuses a run that contains one)"

Warn = Callable[[str], None]


def _ignore(_message: str) -> None:
    return None


def projection_stem(row_index: int, run_index: int) -> str:
    """``row_<r>_run_<n>``: the per-work-item projection name."""
    return f"row_{row_index}_run_{run_index}"


def safe_artifact_paths(artifacts_dir: Path, *, warn: Warn = _ignore) -> list[PurePosixPath]:
    """Relative paths of the regular files under *artifacts_dir* that are safe to copy."""
    try:
        root_mode = os.lstat(artifacts_dir).st_mode
    except OSError:
        return []
    if stat.S_ISLNK(root_mode):
        warn(f"skipping symlinked artifact root {artifacts_dir} {_UPLOAD_REFUSES}")
        return []
    if not stat.S_ISDIR(root_mode):
        return []
    selected: list[PurePosixPath] = []
    pending: list[tuple[str, tuple[str, ...]]] = [(os.fspath(artifacts_dir), ())]
    while pending:
        directory, prefix = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            warn(f"cannot list artifacts in {directory}: {exc}")
            continue
        for entry in entries:
            parts = (*prefix, entry.name)
            if entry.is_symlink():
                warn(f"skipping artifact symlink {entry.path} {_UPLOAD_REFUSES}")
            elif entry.is_dir(follow_symlinks=False):
                pending.append((entry.path, parts))
            elif not entry.is_file(follow_symlinks=False):
                continue  # sockets, fifos, devices: not artifacts
            elif any(part in ("", ".", "..") or "/" in part for part in parts):
                warn(f"skipping unsafe artifact path {'/'.join(parts)!r}")
            elif parts != (_RESERVED_ARTIFACT_NAME,):
                selected.append(PurePosixPath(*parts))
    selected.sort(key=lambda path: path.parts)
    return selected


def _read_regular_file(path: str) -> bytes:
    """Read *path* without following a symlink swapped in after the safety check."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return handle.read()


def _clear(path: Path) -> None:
    """Remove a file, a symlink or a directory tree at *path*; absent is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def project_work_item(
    run_dir: Path,
    *,
    row_index: int,
    run_index: int,
    rollout_id: str,
    trajectory_filename: str | None,
    warn: Warn = _ignore,
) -> None:
    """Rewrite one work item's projections from its selected attempt.

    The old projection is cleared first: a retry whose new attempt produced no
    trajectory must not leave the superseded attempt's files attributed to it.
    """
    stem = projection_stem(row_index, run_index)
    trial_dir = run_dir / TRIALS_DIRNAME / rollout_id
    trajectory_dest = run_dir / TRAJECTORIES_DIRNAME / f"{stem}.json"
    artifacts_dest = run_dir / ARTIFACTS_DIRNAME / stem
    _clear(trajectory_dest)
    _clear(artifacts_dest)
    if trajectory_filename is not None:
        try:
            data = _read_regular_file(os.path.join(trial_dir, trajectory_filename))
        except OSError as exc:
            warn(f"cannot copy the trajectory of rollout {rollout_id}: {exc}")
        else:
            atomic_write_bytes(trajectory_dest, data, durable=False)
    artifacts_dir = trial_dir / ARTIFACTS_DIRNAME
    for relative in safe_artifact_paths(artifacts_dir, warn=warn):
        source = os.path.join(artifacts_dir, *relative.parts)
        try:
            data = _read_regular_file(source)
        except OSError as exc:
            warn(f"cannot copy artifact {source}: {exc}")
            continue
        atomic_write_bytes(artifacts_dest.joinpath(*relative.parts), data, durable=False)
