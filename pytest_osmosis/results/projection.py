"""The user-facing copies ``trajectories/row_<r>_run_<n>.json`` and ``artifacts/row_<r>_run_<n>/``.

``rollout_trials/<id>/artifacts/`` is written by user code, so nothing in it is
trusted: symlinks, traversal parts, files resolving outside the root and the
reserved top-level ``manifest.json`` are skipped with a warning, never copied
(a symlink would otherwise exfiltrate host files into the projection). Copies
are independent bytes, so editing a projection never changes what is uploaded.
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

Warn = Callable[[str], None]


def _ignore(_message: str) -> None:
    return None


def projection_stem(row_index: int, run_index: int) -> str:
    """``row_<r>_run_<n>``: the per-work-item projection name."""
    return f"row_{row_index}_run_{run_index}"


def safe_artifact_paths(artifacts_dir: Path, *, warn: Warn = _ignore) -> list[PurePosixPath]:
    """Relative paths of the regular files under *artifacts_dir* that are safe to copy."""
    try:
        root_stat = artifacts_dir.lstat()
    except OSError:
        return []
    if stat.S_ISLNK(root_stat.st_mode):
        warn(f"skipping symlinked artifact root {artifacts_dir}")
        return []
    if not stat.S_ISDIR(root_stat.st_mode):
        return []
    resolved_root = artifacts_dir.resolve()
    selected: list[PurePosixPath] = []
    for dirpath, dirnames, filenames in os.walk(artifacts_dir, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                warn(
                    f"skipping artifact symlink {base / name} "
                    "(osmosis eval upload refuses a run that contains one)"
                )
        for name in sorted(filenames):
            candidate = base / name
            relative = PurePosixPath(candidate.relative_to(artifacts_dir).as_posix())
            try:
                mode = candidate.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                warn(
                    f"skipping artifact symlink {candidate} "
                    "(osmosis eval upload refuses a run that contains one)"
                )
                continue
            if not stat.S_ISREG(mode):
                continue
            if any(part in ("", ".", "..") for part in relative.parts):
                warn(f"skipping unsafe artifact path {relative}")
                continue
            if len(relative.parts) == 1 and relative.name == _RESERVED_ARTIFACT_NAME:
                continue
            try:
                inside = candidate.resolve().is_relative_to(resolved_root)
            except OSError:
                inside = False
            if not inside:
                warn(f"skipping artifact path {relative} outside the artifact root")
                continue
            selected.append(relative)
    selected.sort(key=lambda path: path.parts)
    return selected


def _read_regular_file(path: Path) -> bytes:
    """Read *path* without following a symlink swapped in after the safety check."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return handle.read()


def _clear(path: Path) -> None:
    """Remove a file, a symlink or a directory tree at *path*; absent is fine."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


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
            data = _read_regular_file(trial_dir / trajectory_filename)
        except OSError as exc:
            warn(f"cannot copy the trajectory of rollout {rollout_id}: {exc}")
        else:
            atomic_write_bytes(trajectory_dest, data)
    artifacts_dir = trial_dir / ARTIFACTS_DIRNAME
    for relative in safe_artifact_paths(artifacts_dir, warn=warn):
        source = artifacts_dir.joinpath(*relative.parts)
        try:
            data = _read_regular_file(source)
        except OSError as exc:
            warn(f"cannot copy artifact {source}: {exc}")
            continue
        atomic_write_bytes(artifacts_dest.joinpath(*relative.parts), data)
