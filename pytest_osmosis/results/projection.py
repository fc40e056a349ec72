"""The user-facing copies ``trajectories/row_<r>_run_<n>.json`` and ``artifacts/row_<r>_run_<n>/``.

``rollout_trials/<id>/artifacts/`` is written by user code, so nothing in it is
trusted. Before a work item is projected, everything there that ``osmosis eval
upload`` would refuse (a symlink anywhere, a symlinked or non-directory artifact
root, a name with a backslash or control character or that is not UTF-8, an upload
path longer than 1024 characters) is moved to ``rollout_trials/<id>/refused_artifacts/``
(never uploaded, nothing deleted) with a warning naming it, so one bad file cannot make
the whole run impossible to upload. What remains is copied: directories are walked
without following links, files opened with ``O_NOFOLLOW``, so every copied byte comes
from inside the artifact root and every copy lands inside the projection (whose parent
directories are checked to be real directories, not links a rollout planted). Copies
are independent bytes: editing a projection never changes what is uploaded.
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
#: Where refused artifacts go, inside the trial directory; the upload planner never
#: looks there.
REFUSED_ARTIFACTS_DIRNAME = "refused_artifacts"
#: ``osmosis eval upload`` refuses an artifact whose upload path is longer.
MAX_UPLOAD_PATH_LENGTH = 1024
#: Reserved by the platform's download layout; excluded on both sides.
_RESERVED_ARTIFACT_NAME = "manifest.json"
_UPLOAD_REFUSES = "(osmosis eval upload refuses a run that contains one)"

Warn = Callable[[str], None]


def _ignore(_message: str) -> None:
    return None


def projection_stem(row_index: int, run_index: int) -> str:
    """``row_<r>_run_<n>``: the per-work-item projection name."""
    return f"row_{row_index}_run_{run_index}"


def upload_path_problem(path: str) -> str | None:
    """Why the upload planner would refuse the artifact upload path *path*, else None."""
    if len(path) > MAX_UPLOAD_PATH_LENGTH:
        return f"its upload path is longer than {MAX_UPLOAD_PATH_LENGTH} characters"
    if "\\" in path or any(ord(char) < 32 or ord(char) == 127 for char in path):
        return "its name contains a backslash or a control character"
    if path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        return "it has an empty, '.' or '..' path segment"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    return None


def _upload_prefix(rollout_id: str) -> str:
    return f"{TRIALS_DIRNAME}/{rollout_id}/{ARTIFACTS_DIRNAME}/"


def safe_artifact_paths(
    artifacts_dir: str | Path, *, warn: Warn = _ignore, upload_prefix: str = ""
) -> list[PurePosixPath]:
    """Relative paths of the regular files under *artifacts_dir* that are safe to copy.

    *upload_prefix* (``rollout_trials/<id>/artifacts/``) lets names be checked as the
    upload planner checks them.
    """
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
            elif (problem := upload_path_problem(upload_prefix + "/".join(parts))) is not None:
                warn(f"skipping artifact {'/'.join(parts)!r}: {problem} {_UPLOAD_REFUSES}")
            elif parts != (_RESERVED_ARTIFACT_NAME,):
                selected.append(PurePosixPath(*parts))
    selected.sort(key=lambda path: path.parts)
    return selected


def refuse_unsafe_artifacts(trial_dir: str | Path, rollout_id: str, *, warn: Warn = _ignore) -> int:
    """Move what the upload planner would refuse out of ``trial_dir/artifacts``.

    Refused entries (a symlink is moved as the link, never followed) go to
    ``trial_dir/refused_artifacts/`` under the same relative path; an entry that
    cannot be moved is deleted. Each one is named in a warning. Returns how many.
    """
    return _refuse_unsafe_artifacts(trial_dir, rollout_id, warn)[0]


def _refuse_unsafe_artifacts(
    trial_dir: str | Path, rollout_id: str, warn: Warn
) -> tuple[int, bool]:
    """:func:`refuse_unsafe_artifacts`, and whether the root was a real, empty directory
    (then there is nothing to copy either: most rows write no artifact, and listing the
    root a second time was six more system calls a row)."""
    root = os.path.join(trial_dir, ARTIFACTS_DIRNAME)
    try:
        root_mode = os.lstat(root).st_mode
    except OSError:
        return 0, False
    refused = 0
    trial_dir = Path(trial_dir)  # only a refused entry needs it
    if stat.S_ISLNK(root_mode) or not stat.S_ISDIR(root_mode):
        kind = "symlinked artifact root" if stat.S_ISLNK(root_mode) else "artifact root"
        reason = "is a symbolic link" if stat.S_ISLNK(root_mode) else "is not a directory"
        _refuse(trial_dir, (ARTIFACTS_DIRNAME,), f"{kind} of rollout {rollout_id}", reason, warn)
        return 1, False
    prefix = _upload_prefix(rollout_id)
    pending: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    empty = False
    while pending:
        directory, parents = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as exc:
            warn(f"cannot list artifacts in {directory}: {exc}")
            continue
        if directory is root and not entries:
            empty = True
        for entry in entries:
            parts = (*parents, entry.name)
            upload = prefix + "/".join(parts)
            problem: str | None
            if entry.is_symlink():
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    target = "?"
                problem = f"is a symbolic link (to {target!r})"
            elif entry.is_dir(follow_symlinks=False):
                problem = upload_path_problem(upload)
                if problem is None:
                    pending.append((entry.path, parts))
                    continue
            elif entry.is_file(follow_symlinks=False):
                problem = upload_path_problem(upload)
            else:
                continue  # sockets, fifos, devices: the planner skips them too
            if problem is not None:
                what = f"artifact {'/'.join(parts)!r} of rollout {rollout_id}"
                _refuse(trial_dir, (ARTIFACTS_DIRNAME, *parts), what, problem, warn)
                refused += 1
    return refused, empty


def _refuse(trial_dir: Path, parts: tuple[str, ...], what: str, why: str, warn: Warn) -> None:
    """Move ``trial_dir/<parts>`` under ``refused_artifacts/``; delete it if it cannot move."""
    source = trial_dir.joinpath(*parts)
    destination = trial_dir.joinpath(REFUSED_ARTIFACTS_DIRNAME, *parts)
    suffix = 1
    while os.path.lexists(destination):
        destination = destination.with_name(f"{parts[-1]}.{suffix}")
        suffix += 1
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, destination)
    except OSError:
        try:
            _clear(source)
        except OSError as exc:
            warn(f"refused {what}: it {why}, and it could not be moved or removed: {exc}")
            return
        warn(f"refused {what}: it {why}; removed it {_UPLOAD_REFUSES}")
        return
    where = destination.relative_to(trial_dir).as_posix()
    warn(f"refused {what}: it {why}; moved it to {where} {_UPLOAD_REFUSES}")


def _real_directory(path: str | Path, warn: Warn) -> None:
    """*path* (ours: trajectories/, artifacts/) as a real directory, never a planted link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
        return
    if stat.S_ISDIR(mode):
        return
    warn(f"replacing {path}: it was a {'symbolic link' if stat.S_ISLNK(mode) else 'file'}")
    os.unlink(path)
    os.makedirs(path, exist_ok=True)


def read_regular_file(path: str) -> bytes:
    """Read *path* without following a symlink swapped in after the safety check."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        # Raw reads, not a buffered file object: a row's copy is read once per row.
        chunks = []
        size = max(st.st_size + 1, 1)
        while chunk := os.read(fd, size):
            chunks.append(chunk)
            size = 1 << 16
        return b"".join(chunks)
    finally:
        os.close(fd)


def _clear(path: str | Path) -> None:
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
    trajectory_data: bytes | None = None,
) -> None:
    """Rewrite one work item's projections from its selected attempt.

    The old projection is cleared first: a retry whose new attempt produced no
    trajectory must not leave the superseded attempt's files attributed to it.
    ``trajectory_data``: the trajectory's bytes, read by the caller just now the way
    this function reads them (:func:`read_regular_file`), so they are not read twice.
    """
    # Plain strings, not Path objects: this runs once per row at every refresh, and
    # pathlib's joins and str() conversions were most of its cost.
    stem = projection_stem(row_index, run_index)
    run = os.fspath(run_dir)
    trial_dir = os.path.join(run, TRIALS_DIRNAME, rollout_id)
    trajectories = os.path.join(run, TRAJECTORIES_DIRNAME)
    artifacts_root = os.path.join(run, ARTIFACTS_DIRNAME)
    trajectory_dest = os.path.join(trajectories, f"{stem}.json")
    artifacts_dest = os.path.join(artifacts_root, stem)
    _real_directory(trajectories, warn)
    _real_directory(artifacts_root, warn)
    _clear(trajectory_dest)
    _clear(artifacts_dest)
    empty = False
    if not os.path.islink(trial_dir):
        empty = _refuse_unsafe_artifacts(trial_dir, rollout_id, warn)[1]
    if trajectory_filename is not None:
        try:
            data = (
                read_regular_file(os.path.join(trial_dir, trajectory_filename))
                if trajectory_data is None
                else trajectory_data
            )
        except OSError as exc:
            warn(f"cannot copy the trajectory of rollout {rollout_id}: {exc}")
        else:
            atomic_write_bytes(trajectory_dest, data, durable=False)
    if empty:
        return
    artifacts_dir = os.path.join(trial_dir, ARTIFACTS_DIRNAME)
    prefix = _upload_prefix(rollout_id)
    for relative in safe_artifact_paths(artifacts_dir, warn=warn, upload_prefix=prefix):
        source = os.path.join(artifacts_dir, *relative.parts)
        try:
            data = read_regular_file(source)
        except OSError as exc:
            warn(f"cannot copy artifact {source}: {exc}")
            continue
        atomic_write_bytes(os.path.join(artifacts_dest, *relative.parts), data, durable=False)
