"""``manifest.json``: the resolved-input lock plus provenance, written once.

The raw bytes' SHA-256 is the upload's import identity, so the file is created
once and never re-serialized. ``inputs`` holds exactly what changes the meaning
of results (model, dataset bytes and selection, n, rollout source, env, secret
names, timeouts, format versions); resuming with any of it changed is refused
by key name rather than silently mixing versions in one set of metrics.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import ConfigError, RolloutLoadError, RunDirectoryError
from pytest_osmosis.dataset import format_row_selector as format_row_selector  # one formatter
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atomic import atomic_write_bytes, digest_of, pretty_json, utc_now

MANIFEST_FILENAME = "manifest.json"
STATE_SCHEMA_VERSION = 1
DATASET_NORMALIZATION_VERSION = 1
#: osmosis-ai 0.3.8's rollout protocol; a run from another protocol cannot resume.
ROLLOUT_PROTOCOL_VERSION = "0.4"

LOCKS_DIRNAME = ".locks"

#: Never part of a rollout's source identity (environments, caches, build output).
SOURCE_EXCLUDED_DIRS: frozenset[str] = frozenset(
    {
        "__pycache__",
        ".git",
        ".venv",
        "venv",
        "dist",
        "build",
        "node_modules",
        ".pytest_cache",
        ".ruff_cache",
    }
)
#: Written into the tree by resolving its environment (``uv sync``, setuptools).
SOURCE_EXCLUDED_PATTERNS: tuple[str, ...] = ("uv.lock", "*.egg-info")
#: The SDK refuses a longer run name (contract §2.4).
RUN_NAME_MAX_LEN = 96
_NAME_SUFFIX_LEN = len("-YYYYmmddTHHMMSSZ-0123abcd")


def run_name_problem(name: str) -> str | None:
    """What is wrong with a run name (contract §2.4: one safe directory name), else None.

    The one rule: the run directory's own check (:func:`validate_run_name`) and the
    TOML/option check (``workspace.config.validate_run_name``) both ask it.
    """
    if not name:
        return "must not be empty"
    if len(name) > RUN_NAME_MAX_LEN:
        return f"must be at most {RUN_NAME_MAX_LEN} characters"
    if name in (".", "..") or any(sep in name for sep in ("/", "\\", "\0")):
        return "must be a single path segment (no separators, not '.' or '..')"
    # The first-character rule also keeps out the reserved lock directory ".locks".
    if name[0] in "-." or any(c not in "._-" and not c.isalnum() for c in name):
        return "must start with a letter or digit and use only letters, digits, '.', '_', '-'"
    return None


def validate_run_name(name: str) -> str:
    """Return *name* if it is a valid run name (one safe path segment), else raise."""
    problem = run_name_problem(name)
    if problem is not None:
        raise RunDirectoryError(f"run name {name!r} {problem}")
    return name


def generated_run_name(config_path: Path, inputs_digest: str, now: datetime) -> str:
    """``<stem>-<UTC YYYYmmddTHHMMSSZ>-<digest[:8]>``; a naive ``now`` is taken as UTC.

    The stem is cut so the name fits the 96-character limit (the SDK would refuse it).
    """
    if not re.fullmatch(r"[0-9a-fA-F]{8,}", inputs_digest):
        raise ValueError(f"inputs digest must be hex of at least 8 chars, got {inputs_digest!r}")
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in config_path.stem)
    stem = stem.strip("-._")[: RUN_NAME_MAX_LEN - _NAME_SUFFIX_LEN].rstrip("-._") or "eval"
    moment = now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now
    stamp = moment.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return validate_run_name(f"{stem}-{stamp}-{inputs_digest[:8].lower()}")


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def build_inputs(
    *,
    model_path: str,
    dataset_sha256: str,
    selected_source_rows: str,
    n: int,
    rollout_name: str,
    entrypoint: str,
    source_digest: str,
    env: Mapping[str, str],
    secret_names: Iterable[str],
    agent_timeout_s: float | None,
    grader_timeout_s: float | None,
) -> dict[str, Any]:
    """The manifest's ``inputs`` object, in the SDK's key order.

    Deliberately absent (so changing them never refuses a resume): run name,
    output path, concurrency, pass threshold, UI flags, SDK version, timestamps.
    """
    return {
        "model_path": model_path,
        "dataset": {"sha256": dataset_sha256, "selected_source_rows": selected_source_rows},
        "n": n,
        "rollout": {"name": rollout_name, "entrypoint": entrypoint, "source_digest": source_digest},
        "env": dict(sorted(env.items())),
        "secret_names": sorted(secret_names),
        "timeouts": {
            "agent_timeout_sec": _optional_float(agent_timeout_s),
            "grader_timeout_sec": _optional_float(grader_timeout_s),
        },
        "versions": {
            "rollout_protocol": ROLLOUT_PROTOCOL_VERSION,
            "dataset_normalization": DATASET_NORMALIZATION_VERSION,
            "state_schema": STATE_SCHEMA_VERSION,
        },
    }


def inputs_digest(inputs: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of *inputs* (generated run names use its prefix)."""
    return digest_of(dict(inputs))


def changed_input_keys(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Top-level ``inputs`` keys that differ, added and removed ones included."""
    return sorted(key for key in {*previous, *current} if previous.get(key) != current.get(key))


def selection_change(
    previous: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[str, str] | None:
    """``(recorded, now)`` row selectors when the selection of rows differs, else None."""
    before, now = previous.get("dataset"), current.get("dataset")
    if not isinstance(before, Mapping) or not isinstance(now, Mapping):
        return None
    recorded, selected = before.get("selected_source_rows"), now.get("selected_source_rows")
    return None if recorded == selected else (str(recorded), str(selected))


def describe_changed_inputs(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs, as a refused resume names it: the top-level keys, except that the
    ``dataset`` key (the file's bytes and the row selection) says which of the two changed:
    another ``--osmosis-rows`` is not another dataset."""
    selection = selection_change(previous, current)
    words: list[str] = []
    for key in changed_input_keys(previous, current):
        if key == "dataset" and selection is not None:
            before, now = dict(previous["dataset"]), dict(current["dataset"])
            before.pop("selected_source_rows", None)
            now.pop("selected_source_rows", None)
            if before != now:
                words.append(key)
            words.append(f"row selection ({selection[0]} recorded, {selection[1]} now)")
        else:
            words.append(key)
    return words


def changed_inputs_error(
    run_name: str, output_root: Path, previous: Mapping[str, Any], current: Mapping[str, Any]
) -> RunDirectoryError | None:
    """Why run ``run_name``, made with other inputs, is not resumed (resuming would mix
    versions in one set of metrics); None when its inputs are these. The run raises it,
    its plan shows it."""
    changed = describe_changed_inputs(previous, current)
    if not changed:
        return None
    selection = selection_change(previous, current)
    rows = (
        f"select its rows again (--osmosis-rows {selection[0]}) to resume it, "
        if selection is not None and len(changed) == 1
        else ""
    )
    return RunDirectoryError(
        f"run {run_name!r} in {output_root} was created with different "
        f"resolved inputs (changed: {', '.join(changed)}), so resuming it "
        f"would mix versions inside one set of metrics; {rows}rerun with "
        "--osmosis-fresh (the previous results are archived, never deleted) "
        "or use a different --osmosis-name"
    )


# --------------------------------------------------------------------------- #
# Rollout source digest
# --------------------------------------------------------------------------- #


def _excluded(parts: tuple[str, ...]) -> bool:
    if SOURCE_EXCLUDED_DIRS.intersection(parts):
        return True
    return any(
        fnmatch.fnmatch(part, pattern) for pattern in SOURCE_EXCLUDED_PATTERNS for part in parts
    )


def source_digest(rollout_dir: Path, output_root: Path | None = None) -> str:
    """SHA-256 over every source file's relative path and bytes, in path order.

    Same traversal as the SDK, so a run started by ``osmosis eval run`` and one
    started here agree on the rollout's identity (:func:`source_files`).
    """
    digest = hashlib.sha256()
    for parts, path in source_files(rollout_dir, output_root):
        digest.update("/".join(parts).encode())
        try:
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            raise RolloutLoadError(f"cannot read rollout source file {path}: {exc}") from exc
    return digest.hexdigest()


def source_files(
    rollout_dir: Path, output_root: Path | None = None
) -> list[tuple[tuple[str, ...], Path]]:
    """A rollout's source files (relative parts, path), in path order.

    Environment/cache directories, ``uv.lock`` and ``*.egg-info`` are skipped, as is
    *output_root* when it lies inside the rollout. A directory symlink or a broken symlink
    is refused (a digest could not describe what it covers); file symlinks count as their
    target.
    """
    root = rollout_dir.resolve()
    exclude: Path | None = None
    if output_root is not None:
        resolved_output = output_root.resolve()
        if resolved_output == root:
            raise ConfigError(
                f"the output directory {resolved_output} must not be the rollout source "
                "directory; choose another --osmosis-output"
            )
        if resolved_output.is_relative_to(root):
            exclude = resolved_output
    files: list[tuple[tuple[str, ...], Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        kept_dirs: list[str] = []
        for name in dirnames:
            path = base / name
            parts = path.relative_to(root).parts
            if _excluded(parts) or (exclude is not None and path.is_relative_to(exclude)):
                continue
            if path.is_symlink():
                raise RolloutLoadError(
                    f"rollout source contains a directory symlink: {path} -> "
                    f"{os.readlink(path)}; replace it with a real directory"
                )
            kept_dirs.append(name)
        dirnames[:] = kept_dirs
        for name in filenames:
            path = base / name
            parts = path.relative_to(root).parts
            if _excluded(parts) or (exclude is not None and path.is_relative_to(exclude)):
                continue
            if path.is_symlink() and not path.is_file():
                raise RolloutLoadError(
                    f"rollout source contains a broken symlink: {path} -> "
                    f"{os.readlink(path)}; replace it with a real file"
                )
            if path.is_file():
                files.append((parts, path))
    files.sort(key=lambda item: item[0])
    return files


# --------------------------------------------------------------------------- #
# Provenance
# --------------------------------------------------------------------------- #


def git_provenance(workspace: Path) -> dict[str, Any]:
    """``git_head``, ``git_branch`` (absent when detached) and ``git_dirty``.

    Empty when ``git`` is not on PATH, *workspace* has no ``.git`` or HEAD does
    not resolve: provenance is best effort and never stops a run.
    """
    if shutil.which("git") is None or not (workspace / ".git").exists():
        return {}

    def run(*args: str) -> str | None:
        try:
            result = subprocess.run(
                ["git", "-C", str(workspace), *args],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    head = run("rev-parse", "HEAD")
    if head is None:
        return {}
    branch = run("rev-parse", "--abbrev-ref", "HEAD")
    porcelain = run("status", "--porcelain")
    found: dict[str, Any] = {
        "git_head": head,
        "git_branch": None if branch == "HEAD" else branch,
        "git_dirty": bool(porcelain),
    }
    return {key: value for key, value in found.items() if value is not None}


def build_provenance(
    *,
    sdk_version: str,
    config_branch: str | None = None,
    config_commit_sha: str | None = None,
    advanced: Mapping[str, Any] | None = None,
    config_path: str | Path | None = None,
    workspace: Path | None = None,
) -> dict[str, Any]:
    """``manifest.provenance`` in the SDK's key order, ``None`` values omitted.

    *config_path* may be a path (made workspace-relative, dropped when outside the
    workspace) or an already relative POSIX string.
    """
    relative_config: str | None = None
    if isinstance(config_path, Path):
        if workspace is not None:
            try:
                relative_config = config_path.resolve().relative_to(workspace.resolve()).as_posix()
            except ValueError:
                relative_config = None
    elif config_path:
        relative_config = config_path
    provenance: dict[str, Any] = {
        "sdk_version": sdk_version,
        "config_branch": config_branch,
        "config_commit_sha": config_commit_sha,
        "config_path": relative_config,
        "advanced": dict(advanced) if advanced else None,
    }
    if workspace is not None:
        provenance.update(git_provenance(workspace))
    return {key: value for key, value in provenance.items() if value is not None}


# --------------------------------------------------------------------------- #
# Reading and writing
# --------------------------------------------------------------------------- #


def create_manifest(
    path: Path, *, run_name: str, inputs: Mapping[str, Any], provenance: Mapping[str, Any]
) -> dict[str, Any]:
    """Write a new manifest (fresh ``local_run_id``) and return its payload."""
    payload: dict[str, Any] = {
        "schema_version": STATE_SCHEMA_VERSION,
        "local_run_id": uuid.uuid4().hex,
        "run_name": run_name,
        "created_at": utc_now(),
        "inputs": dict(inputs),
        "provenance": dict(provenance),
    }
    try:
        data = pretty_json(payload).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise RunDirectoryError(
            f"{path}: inputs/provenance are not JSON-serializable ({exc})"
        ) from exc
    atomic_write_bytes(path, data)
    return payload


def read_manifest(path: Path) -> dict[str, Any]:
    """Read an existing manifest; refuse one this version cannot resume."""
    try:
        payload = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise RunDirectoryError(
            f"{path} is unreadable ({exc}); start over with --osmosis-fresh"
        ) from exc
    if not isinstance(payload, dict):
        raise RunDirectoryError(f"{path} is not a JSON object; start over with --osmosis-fresh")
    version = payload.get("schema_version")
    if version != STATE_SCHEMA_VERSION:
        raise RunDirectoryError(
            f"{path} was written by state schema version {version!r}, this version reads "
            f"{STATE_SCHEMA_VERSION}; start over with --osmosis-fresh"
        )
    if not isinstance(payload.get("inputs"), dict):
        raise RunDirectoryError(f"{path} has no inputs object; start over with --osmosis-fresh")
    run_id = payload.get("local_run_id")
    if not isinstance(run_id, str) or not run_id:
        raise RunDirectoryError(f"{path} has no local_run_id; start over with --osmosis-fresh")
    return payload
