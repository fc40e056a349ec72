"""Join the run directories of ``--osmosis-shard K/N`` into the run one session would write.

Every shard's manifest inputs are the unsharded run's (the dataset and its selection before
sharding, the rollout's digest, the model, n, the versions), so the merged run has the same
inputs: running the unsharded command with ``--osmosis-name NAME`` afterwards finds it
finished. The records go through :class:`RunDirectory` as a session's results do (journal,
then index, projections, progress and ``metrics.json`` by its ``refresh``), so the merged
run equals an unsharded one row for row, ``metrics.json``'s summary byte for byte.

Anything that would make that untrue is refused in one line naming the key: shards of
different inputs or shard counts, an item in two shards or in none (listed), a shard not
finished.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.results.index import METRICS_FILENAME, PROGRESS_FILENAME
from pytest_osmosis.results.journal import JOURNAL_FILENAME, WorkKey, replay_journal
from pytest_osmosis.results.manifest import MANIFEST_FILENAME, read_manifest
from pytest_osmosis.results.reuse import copy_trial
from pytest_osmosis.results.row_digests import ROWS_FILENAME
from pytest_osmosis.results.row_metrics import (
    attempts_by_row,
    cost_of,
    read_row_metrics,
    row_metrics,
    write_row_metrics,
)
from pytest_osmosis.results.rundir import LOGS_FILENAME, RunDirectory

#: Items listed in a refusal before "and N more".
SHOWN = 10


class MergeError(RunDirectoryError):
    """The shards cannot make one run; the message says which key or items, in one line."""


@dataclass
class ShardRun:
    """One shard's run directory, read."""

    path: Path
    index: int
    count: int
    manifest: dict[str, Any]
    metrics: dict[str, Any]
    progress: dict[str, Any]
    records: dict[WorkKey, dict[str, Any]]

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count} ({self.path})"


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise MergeError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(value, dict):
        raise MergeError(f"{path}: not a JSON object")
    return value


def read_shard(path: Path) -> ShardRun:
    """A shard's manifest, metrics, progress and journal; one line when it is no shard."""
    if not (path / MANIFEST_FILENAME).is_file():
        raise MergeError(f"{path}: no {MANIFEST_FILENAME}, so it is not a run directory")
    manifest = read_manifest(path / MANIFEST_FILENAME)
    shard = (manifest.get("provenance") or {}).get("shard")
    if not isinstance(shard, dict) or not all(
        isinstance(shard.get(key), int) for key in ("index", "count")
    ):
        raise MergeError(
            f"{path}: manifest.json provenance.shard is missing: not a shard "
            "(a run of pytest --osmosis-shard K/N)"
        )
    metrics = _json(path / METRICS_FILENAME) if (path / METRICS_FILENAME).is_file() else {}
    progress = _json(path / PROGRESS_FILENAME) if (path / PROGRESS_FILENAME).is_file() else {}
    records = replay_journal(path / JOURNAL_FILENAME).latest
    return ShardRun(path, shard["index"], shard["count"], manifest, metrics, progress, records)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flat(inner, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): value}


def _compared(run: ShardRun) -> dict[str, Any]:
    """What every shard of one run has the same: its manifest inputs and the rest it says."""
    eval_run = run.metrics.get("eval_run") or {}
    summary = run.metrics.get("summary") or {}
    return {
        **_flat(run.manifest["inputs"], "inputs."),
        "provenance.sdk_version": (run.manifest.get("provenance") or {}).get("sdk_version"),
        "progress.sampled_rows": run.progress.get("sampled_rows"),
        "progress.total_dataset_rows": run.progress.get("total_dataset_rows"),
        "metrics.summary.pass_threshold": summary.get("pass_threshold"),
        "metrics.eval_run.dataset_name": eval_run.get("dataset_name"),
    }


def _item(source_row: int, attempt: int) -> str:
    """An item as the results table and the annotations name it: the dataset's own row."""
    return f"row {source_row} run {attempt}"


def _listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _source_rows(inputs: Mapping[str, Any], sampled: int) -> list[int]:
    """The dataset rows of the selection (item names say them), else the positions."""
    from pytest_osmosis.dataset import RowSelectorError, parse_row_selector

    try:
        ranges = parse_row_selector(str(inputs["dataset"]["selected_source_rows"]))
    except (RowSelectorError, KeyError, TypeError):
        return list(range(sampled))
    sources = [row for first, last in ranges for row in range(first, last + 1)]
    return sources if len(sources) == sampled else list(range(sampled))


def check_shards(shards: Sequence[ShardRun]) -> tuple[list[int], int]:
    """Refuse what cannot be one run; returns the selection's source rows and ``n``."""
    first = shards[0]
    counts = {run.count for run in shards}
    if len(counts) > 1:
        raise MergeError(
            "shards of different shard counts: " + ", ".join(str(run) for run in shards)
        )
    expected = _compared(first)
    for run in shards[1:]:
        theirs = _compared(run)
        differs = sorted(
            key for key in {*expected, *theirs} if expected.get(key) != theirs.get(key)
        )
        if differs:
            raise MergeError(f"{run} differs from {first} in {', '.join(differs)}")
    for run in shards:
        status = (run.metrics.get("eval_run") or {}).get("status")
        if status != "finished":
            raise MergeError(
                f"{run} is not finished (metrics.json status {status!r}): run its command "
                "again to resume it, then merge"
            )
    given: dict[int, list[ShardRun]] = {}
    for run in shards:
        given.setdefault(run.index, []).append(run)
    twice = [runs for runs in given.values() if len(runs) > 1]
    if twice:
        raise MergeError(f"shard given twice: {twice[0][0]} and {twice[0][1].path}")
    count = first.count
    missing_shards = [k for k in range(1, count + 1) if k not in given]
    n = int(first.manifest["inputs"]["n"])
    sampled = int(first.progress.get("sampled_rows") or 0)
    sources = _source_rows(first.manifest["inputs"], sampled)
    owners: dict[WorkKey, list[int]] = {}
    for run in shards:
        for key in run.records:
            owners.setdefault(key, []).append(run.index)
    overlap = sorted(key for key, found in owners.items() if len(found) > 1)
    if overlap:
        names = [
            f"{_item(sources[r], i)} (shards {', '.join(map(str, owners[(r, i)]))})"
            for r, i in overlap
        ]
        raise MergeError(f"{len(overlap)} items are in more than one shard: {_listed(names)}")
    missing = [(r, i) for r in range(sampled) for i in range(n) if (r, i) not in owners]
    if missing or missing_shards:
        lacking = (
            f" (shard {', '.join(map(str, missing_shards))} of {count} not given)"
            if missing_shards
            else ""
        )
        names = [_item(sources[r], i) for r, i in missing]
        raise MergeError(f"{len(missing)} items are in no shard{lacking}: {_listed(names)}")
    return sources, n


def merge_shards(paths: Sequence[Path], output_root: Path, name: str | None = None) -> Path:
    """Write ``<output_root>/<name>`` from the shard run directories; returns its path.

    *name* defaults to the shards' run name without ``-shard-K-of-N``. Nothing is written
    when a check refuses, and a merge that fails midway removes what it wrote.
    """
    from pytest_osmosis.dataset.shard import unsharded_name

    if not paths:
        raise MergeError("no shard run directories given")
    shards = sorted((read_shard(Path(path)) for path in paths), key=lambda run: run.index)
    sources, n = check_shards(shards)
    first = shards[0]
    name = name or unsharded_name(first.manifest["run_name"])
    target = Path(output_root).absolute() / name
    if target.exists() or target.is_symlink():
        raise MergeError(f"{target} exists; merge into a new run name (--name) or remove it")
    provenance = {k: v for k, v in (first.manifest.get("provenance") or {}).items() if k != "shard"}
    rundir = RunDirectory.open(
        output_root, name, first.manifest["inputs"], provenance, sources=sources
    )
    try:
        _write(rundir, shards, n)
    except BaseException:
        rundir.close()
        shutil.rmtree(target, ignore_errors=True)
        raise
    rundir.close()
    return target


def _write(rundir: RunDirectory, shards: Sequence[ShardRun], n: int) -> None:
    """The records in work-item order, each with its trial directory; then the snapshots."""
    owner = {key: run for run in shards for key in run.records}
    for key in sorted(owner):
        run = owner[key]
        rollout_id = run.records[key]["rollout_id"]
        copy_trial(run.path, rundir.path, rollout_id)
    rundir.extend([owner[key].records[key] for key in sorted(owner)])
    digests = shards[0].path / ROWS_FILENAME  # every shard names the whole selection's rows
    if digests.is_file():
        shutil.copyfile(digests, rundir.path / ROWS_FILENAME)
    with open(rundir.logs_path, "ab") as logs:
        for run in shards:
            if (run.path / LOGS_FILENAME).is_file():
                logs.write((run.path / LOGS_FILENAME).read_bytes())
    eval_runs = [run.metrics.get("eval_run") or {} for run in shards]
    started = min(_moment(e.get("started_at")) for e in eval_runs)
    ended = max(_moment(e.get("completed_at")) for e in eval_runs)
    summary = shards[0].metrics.get("summary") or {}
    inputs = rundir.manifest["inputs"]
    rundir.refresh(
        status="finished",
        total_dataset_rows=int(shards[0].progress["total_dataset_rows"]),
        sampled_rows=int(shards[0].progress["sampled_rows"]),
        n=n,
        pass_threshold=summary["pass_threshold"],
        dataset_name=str(eval_runs[0].get("dataset_name")),
        started_at=started,
        duration_ms=(ended - started).total_seconds() * 1000.0,
        model_path=inputs["model_path"],
        rollout_name=inputs["rollout"]["name"],
    )
    costs: dict[str, float | None] = {}
    for run in shards:
        recorded = read_row_metrics(run.path).get("cost_usd_by_rollout")
        if isinstance(recorded, dict):
            costs.update({str(k): cost_of(v) for k, v in recorded.items()})
    records = rundir.records.values()
    doc = row_metrics(
        attempts_by_row(records, float(summary["pass_threshold"])),
        n=n,
        costs={record["rollout_id"]: costs.get(record["rollout_id"]) for record in records},
    )
    write_row_metrics(rundir.path, doc)


def _moment(text: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise MergeError(f"metrics.json eval_run has no valid time: {text!r}") from None
