"""``--osmosis-reuse RUN``: record from an earlier run the work items that have not changed.

An item is the same as one RUN recorded when the run-level inputs that decide a result are
equal (the rollout's source digest and entrypoint, the model, the environment and secret
names the rollout sees, the budgets, the versions: :data:`SAME_INPUTS`) and so are its
dataset row's content (shard.py's ``row_digest``) and its attempt index. Such an item is
recorded without running: its trajectory and artifacts are copied, its journal record
re-keyed to this run's row, and its index row says ``reused``. Anything that differs runs.

A run names its rows' content digests (results/row_digests.py), so a later run finds its
rows by content even when rows were added or moved. A run without them (written by the
SDK) is matched by dataset row when its dataset file is byte for byte the same.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.results.index import CANONICAL_TRAJECTORY_FILENAME, TRIALS_DIRNAME
from pytest_osmosis.results.journal import WorkKey, replay_journal
from pytest_osmosis.results.manifest import MANIFEST_FILENAME, read_manifest
from pytest_osmosis.results.projection import safe_artifact_paths
from pytest_osmosis.results.row_digests import read_row_digests

#: Manifest inputs that must be equal for any item of RUN to be reused.
SAME_INPUTS = ("model_path", "rollout", "env", "secret_names", "timeouts", "versions")


@dataclass
class ReuseSource:
    """The run items are reused from: its records, by row content digest and attempt."""

    path: Path
    name: str
    differs: list[str] = field(default_factory=list)
    """The inputs that differ from this run's (nothing is reused then)."""
    by_content: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)


def open_reuse_source(
    path: Path,
    inputs: Mapping[str, Any],
    dataset_sha256: str,
    digests: Sequence[str],
    sources: Sequence[int],
) -> ReuseSource:
    """Read RUN; one line when it is no run. *digests* are this run's rows', by row index,
    *sources* their rows in the dataset file."""
    if not (path / MANIFEST_FILENAME).is_file():
        raise RunDirectoryError(f"--osmosis-reuse: {path} has no {MANIFEST_FILENAME}")
    manifest = read_manifest(path / MANIFEST_FILENAME)
    theirs = manifest["inputs"]
    source = ReuseSource(path, str(manifest.get("run_name") or path.name))
    source.differs = [key for key in SAME_INPUTS if theirs.get(key) != inputs.get(key)]
    if source.differs:
        return source
    records = replay_journal(path / "events.jsonl").latest
    recorded = read_row_digests(path)  # dataset row -> digest
    if recorded is None:
        same_file = (theirs.get("dataset") or {}).get("sha256") == dataset_sha256
        if not same_file:
            source.differs = ["dataset (and it names no row digests)"]
            return source
        # The same file: RUN's dataset row s has this run's digest of dataset row s.
        recorded = dict(zip(sources, digests, strict=True))
    for (_, attempt), record in sorted(records.items()):
        digest = recorded.get(record.get("source_row_index", -1))
        if digest is not None:
            source.by_content.setdefault((digest, attempt), []).append(record)
    return source


def copy_trial(source_run: Path, target_run: Path, rollout_id: str) -> None:
    """Copy an attempt's trajectory and its artifacts (regular files only) to another run."""
    source = source_run / TRIALS_DIRNAME / rollout_id
    target = target_run / TRIALS_DIRNAME / rollout_id
    if not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    trajectory = source / CANONICAL_TRAJECTORY_FILENAME
    if trajectory.is_file() and not trajectory.is_symlink():
        shutil.copyfile(trajectory, target / CANONICAL_TRAJECTORY_FILENAME)
    for relative in safe_artifact_paths(source / "artifacts"):
        destination = target.joinpath("artifacts", *relative.parts)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.joinpath("artifacts", *relative.parts), destination)


def rekey_trajectory(trial: Path, row_index: int, run_index: int) -> None:
    """Make a copied trajectory name this run's row (the upload checks it against the index)."""
    from pytest_osmosis.results.trajectory import write_trajectory

    path = trial / CANONICAL_TRAJECTORY_FILENAME
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    fields = document.get("extra", {}).get("osmosis", {}).get("request_extra_fields")
    if not isinstance(fields, dict) or fields.get("row_index") == row_index:
        return
    fields["row_index"], fields["run_index"] = row_index, run_index
    write_trajectory(trial, document)


def take(
    source: ReuseSource,
    keys: Sequence[WorkKey],
    digests: Sequence[str],
    sources: Sequence[int],
    *,
    retry_failed: bool,
    retry_below: float | None = None,
    recorded: set[str] | frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The records of RUN this run's pending *keys* reuse, re-keyed to this run's rows.

    Each recorded attempt is used once (two equal rows take two of RUN's), and never one
    whose rollout id this run has *recorded* already; an attempt that errored on
    infrastructure runs again, as does what a resume would run again (``is_retried``: any
    failure under ``--osmosis-retry-failed``, and a reward below *retry_below*, the
    threshold ``--osmosis-retry-below-threshold`` gives).
    """
    from pytest_osmosis.core.outcome import is_infrastructure, is_retried

    taken: list[dict[str, Any]] = []
    for row, attempt in keys:
        candidates = source.by_content.get((digests[row], attempt))
        while candidates:
            record = candidates.pop(0)
            if record["rollout_id"] in recorded:
                continue
            if is_infrastructure(record) or (retry_failed and is_retried(record, retry_below)):
                continue
            taken.append(
                {**record, "row_index": row, "run_index": attempt, "source_row_index": sources[row]}
            )
            break
    return taken


def reuse_into(source: ReuseSource, run_dir: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Copy the reused attempts' files into *run_dir*, each trajectory naming its new row."""
    for record in records:
        rollout_id = record["rollout_id"]
        if os.path.exists(run_dir / TRIALS_DIRNAME / rollout_id):
            raise RunDirectoryError(
                f"--osmosis-reuse: {run_dir} already has rollout_trials/{rollout_id}"
            )
        copy_trial(source.path, run_dir, rollout_id)
        rekey_trajectory(
            run_dir / TRIALS_DIRNAME / rollout_id, record["row_index"], record["run_index"]
        )
