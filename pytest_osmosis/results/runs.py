"""Find Osmosis run directories and the files beside their records (contract §6–§7).

Used by ``pytest-osmosis list/info/report``: runs under an output root (by name, path or
``latest``), a run's log headlines, trajectories and artifacts; one run itself is read
by :mod:`~pytest_osmosis.results.run_reader`. It never reads outside the run directory
(symlinks that leave it are ignored): the directory is already redacted, anything else
may not be. The one exception is :func:`find_dataset`, which looks for the dataset file
whose bytes the manifest's sha256 names (the report shows each row's input; the report
redacts what it embeds).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.dataset import readers
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.run_reader import (
    RunNotFoundError,
    dict_of,
    inside_run_dir,
    load_run,
    read_bytes,
    started_at,
)

DEFAULT_OUTPUT = Path(".osmosis") / "evals"


#: The run name that means "the newest run under the output root" (a run directory of
#: that very name wins, so an existing run is never shadowed).
LATEST = "latest"


RUN_MARKERS = ("manifest.json", "metrics.json", "index.jsonl", "events.jsonl")


_LOG_LINE = re.compile(r"^(\S+) ([A-Z]+) \[([^\]]+)\] (.*)$")


# ----------------------------------------------------------------------------- discovery


def is_run_dir(path: Path) -> bool:
    """A directory holding at least one of the files a run directory always has."""
    try:
        if not path.is_dir():
            return False
    except OSError:
        return False
    return any(os.path.lexists(path / marker) for marker in RUN_MARKERS)


def find_output_root(start: Path | None = None) -> Path:
    """The output root a bare command means: ``./.osmosis/evals`` of the nearest workspace.

    Walks up from *start* (default: the current directory) to the first directory
    that has ``.osmosis/evals`` or looks like an Osmosis workspace (``configs/eval``);
    falls back to ``<start>/.osmosis/evals``.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / DEFAULT_OUTPUT).is_dir() or (directory / "configs" / "eval").is_dir():
            return directory / DEFAULT_OUTPUT
    return here / DEFAULT_OUTPUT


def discover_runs(root: Path) -> list[Path]:
    """Run directories directly under *root* (hidden entries such as ``.locks`` excluded)."""
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunDirectoryError(f"{root}: cannot list run directories ({exc})") from exc
    return [entry for entry in entries if not entry.name.startswith(".") and is_run_dir(entry)]


def resolve_run(ref: str, root: Path | None = None, *, cwd: Path | None = None) -> Path:
    """A run given as a path (absolute or relative to *cwd*) or as a name under *root*.

    A path wins when it is a run directory, like ``osmosis eval upload``; otherwise
    the name is looked up under the output root.
    """
    base = cwd or Path.cwd()
    if not ref or "\0" in ref:
        raise RunNotFoundError(f"run {ref!r}: give a run name or a run directory path")
    candidate = Path(ref).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    if is_run_dir(candidate):
        return candidate
    output_root = root if root is not None else find_output_root(base)
    named = output_root / ref
    if "/" not in ref and os.sep not in ref and ref not in (".", "..") and is_run_dir(named):
        return named
    if ref == LATEST:
        newest = latest_run(output_root)
        if newest is not None:
            return newest
        raise RunNotFoundError(f"run {LATEST!r}: no runs under {output_root}")
    if candidate.is_dir():
        raise RunNotFoundError(f"{candidate}: not a run directory (no {', '.join(RUN_MARKERS)})")
    known = [p.name for p in discover_runs(output_root)] if output_root.is_dir() else []
    hint = f"; runs there: {', '.join(known[:8])}" if known else ""
    raise RunNotFoundError(f"run {ref!r} not found as a path or under {output_root}{hint}")


def _sort_time(run: Mapping[str, Any]) -> float:
    when = started_at(run)
    if when is not None:
        return when.timestamp()
    try:
        return os.stat(str(run["path"])).st_mtime
    except OSError:
        return 0.0


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Every run under *root*, newest first (finished runs without their rows)."""
    runs = [load_run(path, summary_only=True) for path in discover_runs(root)]
    runs.sort(key=_sort_time, reverse=True)
    return runs


def latest_run(root: Path) -> Path | None:
    """The newest run directory under *root* (by its recorded start), or None."""
    runs = list_runs(root)
    return Path(str(runs[0]["path"])) if runs else None


# ----------------------------------------------------------------------------- its dataset


#: At most this many files are hashed while looking for a run's dataset.
MAX_DATASET_CANDIDATES = 64


#: The official SDK's content-addressed cache of platform datasets (contract §2).
SDK_DATASET_CACHE = Path("~/.cache/osmosis/datasets")


def dataset_sha256(run: Mapping[str, Any]) -> str | None:
    """The sha256 of the dataset file the run read, as its manifest records it."""
    inputs = dict_of(dict_of(run.get("manifest")).get("inputs"))
    sha = dict_of(inputs.get("dataset")).get("sha256")
    return sha.lower() if isinstance(sha, str) and len(sha) == 64 else None


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _dataset_candidates(run: Mapping[str, Any], hints: tuple[Path, ...], cwd: Path) -> list[Path]:
    """Files that may be the run's dataset, likeliest first (none of them is trusted yet)."""
    run_dir = Path(str(run["path"]))
    workspaces: list[Path] = []
    if run_dir.parent.name == DEFAULT_OUTPUT.name and run_dir.parent.parent.name == ".osmosis":
        workspaces.append(run_dir.parent.parent.parent)  # <workspace>/.osmosis/evals/<run>
    workspaces.append(find_output_root(cwd).parent.parent)
    name = dict_of(dict_of(run.get("metrics")).get("eval_run")).get("dataset_name")
    found: list[Path] = list(hints)
    for workspace in workspaces:
        data = workspace / "data"
        if isinstance(name, str) and name and "/" not in name:
            found += [data / f"{name}.{extension}" for extension in readers()]
        try:
            found += sorted(p for p in data.iterdir() if p.suffix.lstrip(".").lower() in readers())
        except OSError:
            pass
    sha = dataset_sha256(run)
    if sha:
        try:
            found += sorted(SDK_DATASET_CACHE.expanduser().glob(f"*/{sha}.*"))
        except (OSError, RuntimeError):
            pass
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique[:MAX_DATASET_CANDIDATES]


def find_dataset(
    run: Mapping[str, Any], hints: tuple[Path, ...] = (), *, cwd: Path | None = None
) -> Path | None:
    """The dataset file the run read, found by content: its sha256 is the manifest's.

    Looked for among *hints* (``--dataset``, the session's own file), the ``data/`` folder
    of the run's workspace and of the current one, and the SDK's dataset cache. A file
    with other bytes is never used, so an edited dataset cannot put the wrong question
    beside a row. None when nothing matches (or the manifest records no sha256).
    """
    sha = dataset_sha256(run)
    if sha is None:
        return None
    for path in _dataset_candidates(run, hints, cwd or Path.cwd()):
        try:
            if not path.is_file():
                continue
        except OSError:
            continue
        if _file_sha256(path) == sha:
            return path
    return None


# ----------------------------------------------------------------------------- its log


def error_messages(run_dir: Path, rollout_ids: set[str] | None = None) -> dict[str, dict[str, str]]:
    """Per rollout id, the error headline (and traceback) the run logged, from ``logs.txt``.

    This plugin logs ``ERROR [result] <headline> {"detail": ...}`` right after the
    ``[result] work item finished {...rollout_id...}`` line of the same item; a
    ``rollout_id`` in the error's own details wins. SDK logs carry no per-item
    headline, so SDK runs get none.
    """
    found: dict[str, dict[str, str]] = {}
    path = run_dir / "logs.txt"
    if not inside_run_dir(run_dir, path):
        return found
    last_id: str | None = None
    try:
        with path.open("rb") as handle:
            for raw in handle:
                if b"[result]" not in raw:
                    continue
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                match = _LOG_LINE.match(line)
                if match is None or match.group(3) != "result":
                    continue
                level, text = match.group(2), match.group(4)
                message, details = _split_details(text)
                rollout_id = details.get("rollout_id")
                if level == "ERROR":
                    target = rollout_id if isinstance(rollout_id, str) else last_id
                    if target and (rollout_ids is None or target in rollout_ids):
                        entry = {"message": message}
                        if isinstance(details.get("detail"), str):
                            entry["detail"] = details["detail"]
                        found[target] = entry
                    last_id = None
                else:
                    last_id = rollout_id if isinstance(rollout_id, str) else None
    except OSError:
        return found
    return found


def _split_details(text: str) -> tuple[str, dict[str, Any]]:
    """``message {json}`` -> (message, json) as written by the run log."""
    start = text.find(" {")
    while start != -1:
        try:
            value = json.loads(text[start + 1 :])
        except json.JSONDecodeError:
            start = text.find(" {", start + 1)
            continue
        if isinstance(value, dict):
            return text[:start], value
        break
    return text, {}


# ----------------------------------------------------------------------------- one item


def projection_stem(row: Mapping[str, Any]) -> str:
    return f"row_{row['row_index']}_run_{row['run_index']}"


def read_trajectory(run_dir: Path, row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row's ATIF document: the canonical trial copy, else the projection."""
    candidates: list[str] = []
    rollout_id = row.get("rollout_id")
    filename = row.get("trajectory_filename")
    if isinstance(rollout_id, str) and isinstance(filename, str) and "/" not in filename:
        candidates.append(f"rollout_trials/{rollout_id}/{filename}")
    if filename or not rollout_id:
        candidates.append(f"trajectories/{projection_stem(row)}.json")
    for rel in candidates:
        try:
            document = json.loads(read_bytes(run_dir, rel))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(document, dict):
            document["_path"] = rel
            return document
    return None


def _walk_files(run_dir: Path, rel_root: str) -> Iterator[PurePosixPath]:
    root = run_dir / rel_root
    try:
        if os.path.islink(root) or not root.is_dir():
            return
    except OSError:
        return
    pending = [(root, PurePosixPath())]
    while pending:
        directory, prefix = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = prefix / entry.name
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), rel))
            elif entry.is_file(follow_symlinks=False):
                yield rel


def list_artifacts(
    run_dir: Path, row: Mapping[str, Any], *, inline_limit: int = 16 * 1024, max_files: int = 50
) -> list[dict[str, Any]]:
    """The row's artifacts: ``path`` (relative to the run dir), ``size``, and ``text`` when
    the file is small UTF-8 text. Reads the projection, else the trial's own directory."""
    stem = projection_stem(row)
    roots = [f"artifacts/{stem}"]
    rollout_id = row.get("rollout_id")
    if isinstance(rollout_id, str):
        roots.append(f"rollout_trials/{rollout_id}/artifacts")
    for rel_root in roots:
        files = sorted(_walk_files(run_dir, rel_root), key=lambda p: p.parts)
        if not files:
            continue
        found: list[dict[str, Any]] = []
        for rel in files[:max_files]:
            path = f"{rel_root}/{rel}"
            full = run_dir / path
            if not inside_run_dir(run_dir, full):
                continue
            try:
                size = os.lstat(full).st_size
            except OSError:
                continue
            item: dict[str, Any] = {"name": str(rel), "path": path, "size": size}
            if size <= inline_limit:
                try:
                    data = read_bytes(run_dir, path, limit=inline_limit + 1)
                    text = data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    text = None
                if text is not None and "\x00" not in text:
                    item["text"] = text
            found.append(item)
        if len(files) > max_files:
            found.append(
                {
                    "name": f"... {len(files) - max_files} more",
                    "path": rel_root,
                    "size": 0,
                    "more": True,
                }
            )
        return found
    return []
