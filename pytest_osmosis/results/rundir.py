"""The completed-run directory, owned by one process (the controller) at a time.

``RunDirectory`` holds the run lock, the manifest, the journal and the
projections of one named run. The per-item path is :meth:`RunDirectory.stage` (the
event loop hands a finished row's record to the journal's group commit) and then
:meth:`RunDirectory.append` (the controller waits for that record's fsync before the row
is reported) and :meth:`RunDirectory.settle` (its projections, written before its report reaches
other plugins); :meth:`RunDirectory.refresh` rewrites the snapshots
(index, summary, progress, metrics) and copies projections only for the work
items whose selected attempt changed, so calling it periodically stays cheap.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.core.outcome import is_retried
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atomic import (
    FILE_MODE,
    Signature,
    atomic_write_bytes,
    atomic_write_json,
    format_utc,
    fsync_dir,
    interrupt_held,
    remove_stale_temporaries,
    signature_of,
)
from pytest_osmosis.results.index import (
    CANONICAL_TRAJECTORY_FILENAME,
    INDEX_FILENAME,
    METRICS_FILENAME,
    PROGRESS_FILENAME,
    SUMMARY_FILENAME,
    TRIALS_DIRNAME,
    WrittenTrajectory,
    atif_total_tokens,
    build_index_row,
    read_valid_trajectory,
    render_index_line,
    valid_trajectory,
)
from pytest_osmosis.results.journal import (
    JOURNAL_FILENAME,
    Commit,
    Journal,
    WorkKey,
    normalize_record,
    normalized_as,
    replay_journal,
)
from pytest_osmosis.results.manifest import (
    LOCKS_DIRNAME,
    MANIFEST_FILENAME,
    changed_inputs_error,
    create_manifest,
    read_manifest,
    validate_run_name,
)
from pytest_osmosis.results.metrics import aggregate_metrics
from pytest_osmosis.results.projection import (
    TRAJECTORIES_DIRNAME,
    project_work_item,
    projection_stem,
    read_regular_file,
)

LOGS_FILENAME = "logs.txt"
RunStatus = Literal["running", "finished", "incomplete"]
Warn = Callable[[str], None]


def _ignore(_message: str) -> None:
    return None


# --------------------------------------------------------------------------- #
# Lock and archive
# --------------------------------------------------------------------------- #


class RunLock:
    """Exclusive ``flock`` on ``<output_root>/.locks/<run_name>.lock``.

    It lives outside the run directory so ``--osmosis-fresh`` renaming the
    directory cannot unlock it, and ``osmosis eval upload`` takes the same lock,
    so it never reads a half-written run. The file is never deleted.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise RunDirectoryError(f"cannot create the run lock {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise RunDirectoryError(
                    f"another process (pytest --osmosis-eval or osmosis eval run/upload) "
                    f"holds {self.path}; wait for it to finish or use a different "
                    "--osmosis-name"
                ) from exc
            raise RunDirectoryError(f"cannot lock {self.path}: {exc}") from exc
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def archive_run_directory(run_dir: Path, *, now: datetime | None = None) -> Path:
    """Rename *run_dir* to ``<name>.archive-<UTC stamp>[-k]``; never delete results."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    stamp = moment.strftime("%Y%m%dT%H%M%SZ")
    destination = run_dir.parent / f"{run_dir.name}.archive-{stamp}"
    suffix = 1
    while destination.exists() or destination.is_symlink():
        destination = run_dir.parent / f"{run_dir.name}.archive-{stamp}-{suffix}"
        suffix += 1
    os.replace(run_dir, destination)
    fsync_dir(run_dir.parent)
    return destination


def _remove_stale_temporaries(run_dir: Path, recorded: set[str], warn: Warn) -> None:
    """Delete what writers killed mid-write left: only the lock holder may (it opens runs).

    Snapshots and the manifest live at the top, projections in ``trajectories/``, a
    trajectory in its trial's directory (``artifacts/`` below it is the rollout's own).
    A trial killed mid-write never got its rollout id journalled, so only the trials of
    *recorded* ids are skipped: a 10,000-row run is not listed trial by trial.
    """
    directories = [run_dir, run_dir / TRAJECTORIES_DIRNAME]
    try:
        with os.scandir(run_dir / TRIALS_DIRNAME) as trials:
            directories += [
                Path(t.path)
                for t in trials
                if t.name not in recorded and t.is_dir(follow_symlinks=False)
            ]
    except FileNotFoundError:
        pass
    removed = [path for directory in directories for path in remove_stale_temporaries(directory)]
    if removed:
        shown = ", ".join(str(path.relative_to(run_dir)) for path in removed[:3])
        more = f" and {len(removed) - 3} more" if len(removed) > 3 else ""
        warn(
            f"{run_dir}: removed {len(removed)} temporary file(s) left by interrupted "
            f"writers: {shown}{more}"
        )


# --------------------------------------------------------------------------- #
# Per-item cached state
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class _Entry:
    """What the run directory keeps of a work key beside its record: one small object a row
    for the whole session (at 100,000 rows a dict, a line and two objects a row were
    ~0.7 KB a row).

    The verdict: whether the trajectory.json of rollout ``checked`` is usable and its
    token count, keyed by the file's stat signature (its hash, :func:`_signature_key`).
    ``projected``: the rollout id the projection on disk was written from, and
    ``projected_trajectory`` whether with a trajectory. The key's index line is not kept:
    :meth:`RunDirectory.refresh` renders it from the record and the verdict (~4 us a row).
    """

    checked: str | None = None
    signature: int | None = None
    valid: bool = False
    tokens: int | None = None
    projected: str | None = None
    projected_trajectory: bool = False


def _signature_key(signature: Signature | None) -> int | None:
    """What an :class:`_Entry` keeps of a stat signature: equal signatures, equal keys."""
    return None if signature is None else hash(signature)


def _stat_signature(path: str | Path) -> Signature | None:
    try:
        return signature_of(os.stat(path))
    except OSError:
        return None


def _raw_key(record: Any) -> WorkKey | None:
    """A result's work key as given, if it is one (checked or not: only looked up)."""
    if not isinstance(record, Mapping):
        return None
    row, attempt = record.get("row_index"), record.get("run_index")
    return (row, attempt) if type(row) is int and type(attempt) is int else None


def _read_previous_index(path: Path) -> tuple[dict[WorkKey, dict[str, Any]], int | None]:
    """The index a previous invocation wrote (rows by key) and its ctime, best effort."""
    try:
        ctime = path.stat().st_ctime_ns
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return {}, None
    rows: dict[WorkKey, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            key = (row.get("row_index"), row.get("run_index"))
            if all(isinstance(part, int) for part in key):
                rows[(int(row["row_index"]), int(row["run_index"]))] = row
    return rows, ctime


# --------------------------------------------------------------------------- #
# Run directory
# --------------------------------------------------------------------------- #


class RunDirectory:
    """One named run under an output root, opened for writing by this process."""

    def __init__(
        self,
        *,
        path: Path,
        run_name: str,
        manifest: dict[str, Any],
        lock: RunLock,
        journal: Journal,
        records: dict[WorkKey, dict[str, Any]],
        retry_failed: bool,
        warn: Warn,
    ) -> None:
        self.path = path
        self.run_name = run_name
        self.manifest = manifest
        self.local_run_id: str = manifest["local_run_id"]
        self.retry_failed = retry_failed
        #: --osmosis-retry-below-threshold: the pass threshold below which a recorded
        #: attempt runs again too (None: low rewards are kept).
        self.retry_below: float | None = None
        #: Latest journal record per work key (carried forward plus this invocation's).
        self.records = records
        self._lock = lock
        self._journal = journal
        self._warn = warn
        self._mutex = threading.RLock()
        #: Keys whose record came from an earlier invocation (index ``resumed``).
        self._carried: set[WorkKey] = set(records)
        self._executed: set[WorkKey] = set()
        #: Keys recorded from another run in this invocation (index ``reused``).
        self._reused: set[WorkKey] = set()
        self._entries: dict[WorkKey, _Entry] = {}
        self._dirty: set[WorkKey] = set(records)
        #: Records handed to the journal as their row finished, not yet recorded here.
        self._staged: dict[WorkKey, tuple[dict[str, Any], Commit]] = {}
        #: What the row's process wrote of a staged row's trajectory, until it is settled
        #: (rollout id, what was written): settle neither reads nor parses it again.
        self._handed: dict[WorkKey, tuple[str, WrittenTrajectory]] = {}
        self._staging = threading.Lock()
        #: Held while checking trajectories and writing projections (settle, refresh);
        #: never while journalling, so recording a row does not wait for another's copy.
        self._projecting = threading.Lock()
        self._closed = False
        self._seed_from_previous_index()

    # -- opening ----------------------------------------------------------- #

    @classmethod
    def open(
        cls,
        output_root: Path,
        run_name: str,
        inputs: Mapping[str, Any],
        provenance: Mapping[str, Any],
        *,
        fresh: bool = False,
        retry_failed: bool = False,
        warn: Warn | None = None,
        on_archive: Callable[[Path], None] | None = None,
        sources: Sequence[int] | None = None,
        retry_below: float | None = None,
    ) -> RunDirectory:
        """Lock, create or resume ``<output_root>/<run_name>``.

        ``fresh`` archives an existing run first. Resuming compares the top-level
        ``inputs`` keys with the manifest and refuses, naming them, when any
        changed. *warn* receives non-fatal problems (a discarded torn journal line,
        skipped unsafe artifacts); *on_archive* the path a fresh run archived to.
        Given the run's selected *sources* rows, a journal record of a row or attempt
        the run does not have is refused, naming its line.
        """
        validate_run_name(run_name)
        report = warn or _ignore
        output_root = Path(os.path.abspath(output_root))
        lock = RunLock(output_root / LOCKS_DIRNAME / f"{run_name}.lock")
        lock.acquire()
        try:
            opened = cls._open_locked(
                output_root,
                run_name,
                inputs,
                provenance,
                lock=lock,
                fresh=fresh,
                retry_failed=retry_failed,
                warn=report,
                on_archive=on_archive,
                sources=sources,
            )
        except BaseException:
            lock.release()
            raise
        opened.retry_below = retry_below if retry_failed else None
        return opened

    @classmethod
    def _open_locked(
        cls,
        output_root: Path,
        run_name: str,
        inputs: Mapping[str, Any],
        provenance: Mapping[str, Any],
        *,
        lock: RunLock,
        fresh: bool,
        retry_failed: bool,
        warn: Warn,
        on_archive: Callable[[Path], None] | None,
        sources: Sequence[int] | None,
    ) -> RunDirectory:
        run_dir = output_root / run_name
        if run_dir.is_symlink():
            raise RunDirectoryError(
                f"run directory {run_dir} is a symbolic link; remove it or use a different "
                "--osmosis-name"
            )
        try:
            current = json.loads(json.dumps(dict(inputs), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise RunDirectoryError(f"run inputs are not JSON-serializable: {exc}") from exc
        manifest_path = run_dir / MANIFEST_FILENAME
        manifest: dict[str, Any] | None = None
        try:
            if manifest_path.is_file() and fresh:
                archived = archive_run_directory(run_dir)
                if on_archive is not None:
                    on_archive(archived)
            elif manifest_path.is_file():
                manifest = read_manifest(manifest_path)
                refused = changed_inputs_error(run_name, output_root, manifest["inputs"], current)
                if refused is not None:
                    raise refused
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / TRIALS_DIRNAME).mkdir(exist_ok=True)
            if manifest is None:
                manifest = create_manifest(
                    manifest_path, run_name=run_name, inputs=current, provenance=provenance
                )
            replay = replay_journal(
                run_dir / JOURNAL_FILENAME,
                sources=sources,
                n=current.get("n") if sources is not None else None,
            )
            if replay.truncated_bytes:
                warn(
                    f"{run_dir / JOURNAL_FILENAME}: discarded a partial final record "
                    f"({replay.truncated_bytes} bytes) left by an interrupted run"
                )
            journal = Journal(run_dir / JOURNAL_FILENAME, replay)
            recorded = {record["rollout_id"] for record in replay.latest.values()}
            _remove_stale_temporaries(run_dir, recorded, warn)
        except OSError as exc:
            raise RunDirectoryError(f"cannot open run directory {run_dir}: {exc}") from exc
        return cls(
            path=run_dir,
            run_name=run_name,
            manifest=manifest,
            lock=lock,
            journal=journal,
            records=replay.latest,
            retry_failed=retry_failed,
            warn=warn,
        )

    def _seed_from_previous_index(self) -> None:
        """Trust what the last index said about untouched trajectories and projections.

        Projections are written before the index, so an index row proves its work
        item was projected from that attempt; a trajectory whose ctime predates the
        index has not changed since it was checked. Resuming a finished run of
        10,000 items then costs stats, not 10,000 JSON parses and file copies.
        """
        rows, index_ctime = _read_previous_index(self.path / INDEX_FILENAME)
        if index_ctime is None:
            return
        for key, record in self.records.items():
            row = rows.get(key)
            if row is None or row.get("rollout_id") != record["rollout_id"]:
                continue
            rollout_id = record["rollout_id"]
            path = self._trajectory_path(rollout_id)
            signature = _stat_signature(path)
            has_trajectory = row.get("trajectory_filename") == CANONICAL_TRAJECTORY_FILENAME
            if signature is not None and signature[3] >= index_ctime:
                continue  # changed since that index was written: check it again
            if signature is None and has_trajectory:
                continue
            tokens = row.get("tokens") if record.get("tokens") is None else None
            entry = self._entries[key] = _Entry(
                checked=rollout_id,
                signature=_signature_key(signature),
                valid=has_trajectory and signature is not None,
                tokens=tokens if isinstance(tokens, int) else None,
            )
            stem = projection_stem(*key)
            projected = _stat_signature(self.path / TRAJECTORIES_DIRNAME / f"{stem}.json")
            if has_trajectory and (
                projected is None or signature is None or projected[1] != signature[1]
            ):
                continue  # lost or torn copy (projections are not fsync'd)
            if not has_trajectory and projected is not None:
                continue
            entry.projected = rollout_id
            entry.projected_trajectory = has_trajectory
            self._dirty.discard(key)

    # -- state -------------------------------------------------------------- #

    @property
    def logs_path(self) -> Path:
        """``<run_dir>/logs.txt`` (open it with :class:`RunLog`)."""
        return self.path / LOGS_FILENAME

    @property
    def trials_dir(self) -> Path:
        return self.path / TRIALS_DIRNAME

    @property
    def resumed_keys(self) -> frozenset[WorkKey]:
        """Keys whose result was carried forward from an earlier invocation."""
        return frozenset(self._carried)

    def pending(self, keys: Iterable[WorkKey]) -> set[WorkKey]:
        """The subset of *keys* that must run in this invocation.

        A key is pending when it has no record; with ``retry_failed`` also when its
        carried-forward record is ``failed`` or ``skipped`` (or below ``retry_below``;
        a result produced in this invocation is never retried again).
        """
        result: set[WorkKey] = set()
        for key in keys:
            record = self.records.get(key)
            if record is None:
                result.add(key)
            elif (
                self.retry_failed
                and key not in self._executed
                and is_retried(record, self.retry_below)
            ):
                result.add(key)
        return result

    def stage(self, record: Mapping[str, Any], trajectory: WrittenTrajectory | None = None) -> None:
        """Hand a finished row's record to the journal now, without waiting for the disk.

        Called on the event loop as the row finishes, so rows that finish together share
        one fsync; :meth:`append` of the same record later only waits for it (and does not
        validate it again). A record that is never appended (the session ended before
        pytest reported its row) is in the journal all the same, as the rows that finished
        ahead always were. *trajectory*: what was written of the row's trajectory, which
        :meth:`settle` checks and copies while the file is unchanged.
        """
        try:
            normalized = normalize_record(record, where="work result")
        except RunDirectoryError:
            return  # append journals it itself, and raises there
        key = (normalized["row_index"], normalized["run_index"])
        with self._staging:  # submitted and noted at once: kept() never sees one and not the other
            try:
                commit = self._journal.submit([normalized])
            except (RunDirectoryError, OSError):
                return  # append raises it (or the journal is sealed: the session has ended)
            self._staged[key] = (normalized, commit)
            if trajectory is not None:
                self._handed[key] = (normalized["rollout_id"], trajectory)
            else:
                self._handed.pop(key, None)

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Journal one work result durably (fsync) and make it the key's latest.

        Only the journal fields are kept (contract §7.2); extra keys are dropped.
        Returns the normalized record.
        """
        return self.extend([record])[0]

    def extend(
        self, records: Sequence[Mapping[str, Any]], *, reused: bool = False
    ) -> list[dict[str, Any]]:
        """Journal several work results with one fsync (a merge of shards, a reuse).

        ``reused``: recorded from another run without running (the index row says so).
        A record :meth:`stage` already handed over is waited for, not written again.
        """
        with self._staging:  # a staged record's check is not made twice (normalized_as)
            peeked = [
                self._staged.get(key) if (key := _raw_key(record)) else None for record in records
            ]
        normalized = [
            found[0]
            if found is not None and normalized_as(record, found[0])
            else normalize_record(record, where="work result")
            for record, found in zip(records, peeked, strict=True)
        ]
        with self._mutex, interrupt_held():
            commits: list[Commit] = []
            fresh: list[dict[str, Any]] = []
            with self._staging:
                for record in normalized:
                    key = (record["row_index"], record["run_index"])
                    staged = self._staged.pop(key, None)
                    if staged is not None and (staged[0] is record or staged[0] == record):
                        commits.append(staged[1])
                    elif staged is None and key in self._executed and self.records[key] == record:
                        pass  # adopted from the stage already (refresh): the same attempt
                    else:
                        fresh.append(record)
            try:
                if fresh:
                    commits.append(self._journal.submit(fresh))
                for commit in commits:
                    commit.wait()
            except OSError as exc:
                raise RunDirectoryError(
                    f"cannot append to {self.path / JOURNAL_FILENAME}: {exc}"
                ) from exc
            for record in normalized:
                self._adopt(record, reused=reused)
        return normalized

    def _adopt(self, record: dict[str, Any], *, reused: bool) -> None:
        """Make a journalled record its key's latest (under the mutex)."""
        key = (record["row_index"], record["run_index"])
        self.records[key] = record
        self._carried.discard(key)
        self._executed.add(key)
        self._dirty.add(key)
        if reused:
            self._reused.add(key)
        else:
            self._reused.discard(key)

    def _adopt_staged(self) -> None:
        """Record what the journal holds of rows never appended (the session ended first),
        so the snapshots agree with the journal. A Ctrl-C waits: a record taken out of
        ``_staged`` and not adopted yet would be missing from :meth:`kept`."""
        with interrupt_held():
            with self._staging:
                staged, self._staged = list(self._staged.values()), {}
            for record, commit in staged:
                try:
                    commit.wait()
                except (RunDirectoryError, OSError):
                    continue  # cut back off: not in the journal
                self._adopt(record, reused=False)

    def seal(self) -> None:
        """Journal nothing more (the session is ending): write what is queued, refuse later
        records (a row finishing now is not kept: :meth:`stage` drops it) and adopt every
        staged one the journal took, so ``records`` is exactly what the journal holds."""
        with self._mutex, interrupt_held():
            self._journal.seal()
            self._adopt_staged()

    def kept(self) -> int:
        """How many work items the journal holds for good (it is sealed first): the one
        count a line that stops the session states, and what a resume will not run again.
        Safe in a SIGINT handler: the main thread holds none of its locks outside
        ``interrupt_held`` (the journal's, ``_staging``), and ``_mutex`` is re-entrant."""
        self.seal()
        return len(self.records)

    def settle(self, key: WorkKey) -> None:
        """Check one recorded item's trajectory and write its projections now.

        Called as each result is recorded, while other rows are still in flight, so that
        the end of a run (``refresh``) finds nothing left to parse or copy: at 1,000 rows
        that work was 0.6-0.9 s of CPU in the serial tail after the last row. Done before
        the row's report reaches other plugins, so a hook reading the trajectory of the
        row it is told about finds it.
        """
        if not self._closed:
            self._settle_now(key)

    def _settle_now(self, key: WorkKey) -> None:
        with self._staging:
            handed = self._handed.pop(key, None)
        with self._projecting:
            record = self.records.get(key)
            if record is None:
                return
            written = (
                handed[1] if handed is not None and handed[0] == record["rollout_id"] else None
            )
            try:
                read: list[bytes] = []  # the trajectory's bytes, checked once and copied
                self._verdict(key, record["rollout_id"], read, written)
                self._project([key], project_all=False, trajectory_data=read[0] if read else None)
            except OSError:
                # A full disk can fail even the warning about a failed copy. The result is
                # journalled; the item stays dirty, so refresh copies it again and reports
                # a storage fault the way it always has.
                pass
            if self.records.get(key) is not record:  # recorded again meanwhile: redo it
                self._dirty.add(key)

    # -- snapshots ---------------------------------------------------------- #

    def _trajectory_path(self, rollout_id: str) -> str:
        # A string: one per row at every refresh, where pathlib's joins cost more than the stat.
        return os.path.join(self.path, TRIALS_DIRNAME, rollout_id, CANONICAL_TRAJECTORY_FILENAME)

    def _verdict(
        self,
        key: WorkKey,
        rollout_id: str,
        read: list[bytes] | None = None,
        written: WrittenTrajectory | None = None,
    ) -> _Entry:
        """The key's entry, its verdict on *rollout_id*'s trajectory re-checked every refresh,
        but parsed again only when the file changed.

        Given ``read``, the bytes it parsed are appended there when they were read as the
        projection reads them (not through a link): the caller copies those, not a re-read.
        Given what was *written* there, and the file still as written (its signature), the
        verdict and the bytes are the writer's: the file is neither read nor parsed.
        """
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        path = self._trajectory_path(rollout_id)
        stat = _stat_signature(path)
        signature = _signature_key(stat)
        if entry.checked == rollout_id and entry.signature == signature:
            return entry
        if written is not None and stat is not None and written.signature == stat:
            valid = written.identity == rollout_id  # valid_trajectory: the writer's JSON object
            entry.checked, entry.signature, entry.valid = rollout_id, signature, valid
            entry.tokens = written.tokens if valid else None
            if read is not None:
                read.append(written.data)
            return entry
        document = None
        if signature is not None:
            try:
                data = read_regular_file(path)
            except OSError:  # a link, or not a file: read as it always was (the copy refuses it)
                document = read_valid_trajectory(path, rollout_id=rollout_id)
            else:
                document = valid_trajectory(data, rollout_id=rollout_id)
                if read is not None:
                    read.append(data)
        entry.checked, entry.signature, entry.valid = rollout_id, signature, document is not None
        entry.tokens = None if document is None else atif_total_tokens(document)
        return entry

    def _index_row(self, key: WorkKey, record: Mapping[str, Any], entry: _Entry) -> dict[str, Any]:
        """The key's index row, from its record and its entry's verdict (made when asked)."""
        tokens = record.get("tokens")
        return build_index_row(
            record,
            trajectory_filename=CANONICAL_TRAJECTORY_FILENAME if entry.valid else None,
            tokens=entry.tokens if tokens is None else tokens,
            resumed=key in self._carried,
            reused=key in self._reused,
        )

    def _rows_of(self, keys: Iterable[WorkKey]) -> Iterator[dict[str, Any]]:
        """The index rows of *keys*, one at a time (their verdicts checked already)."""
        for key in keys:
            yield self._index_row(key, self.records[key], self._entries[key])

    def index_rows(self) -> list[dict[str, Any]]:
        """The current index rows, sorted (computed as :meth:`refresh` would)."""
        with self._mutex, self._projecting:
            rows = []
            for key in sorted(self.records):
                record = self.records[key]
                rows.append(self._index_row(key, record, self._verdict(key, record["rollout_id"])))
            return rows

    def refresh(
        self,
        *,
        status: RunStatus,
        total_dataset_rows: int,
        sampled_rows: int,
        n: int | None = None,
        pass_threshold: float,
        dataset_name: str,
        started_at: datetime,
        model_path: str | None = None,
        rollout_name: str | None = None,
        duration_ms: float | None = None,
        project_all: bool = False,
        expected_keys: Iterable[WorkKey] | None = None,
    ) -> dict[str, Any]:
        """Rewrite projections (changed items only), index, summary, progress, metrics.

        ``started_at``/``duration_ms`` describe this invocation (duration defaults
        to the time since ``started_at``). ``finished`` is written only when every
        work item ``(r < sampled_rows, i < n)`` has a record; otherwise it becomes
        ``incomplete``. *n*, *model_path* and *rollout_name* default to the
        manifest's inputs. *expected_keys* narrows the work items a finished run must have
        recorded (a shard's share, shard.py). Returns the ``metrics.json`` document.
        """
        inputs = self.manifest["inputs"]
        n_runs = max(1, int(inputs["n"] if n is None else n))
        model = inputs["model_path"] if model_path is None else model_path
        rollout = inputs["rollout"]["name"] if rollout_name is None else rollout_name
        total_runs = sampled_rows * n_runs
        with self._mutex:
            # Writing snapshots into a recreated directory would show a run with no journal.
            self._journal.ensure_in_place()
            self._adopt_staged()
            keys = sorted(self.records)
            try:
                with self._projecting:
                    for key in keys:
                        self._verdict(key, self.records[key]["rollout_id"])
                    self._project(keys, project_all=project_all)
                    # Rows and lines made one at a time, none kept: at the end of a session,
                    # when pytest still holds every report, a list of either was a row's worth.
                    summary = aggregate_metrics(self._rows_of(keys), pass_threshold)
                    index = self.path / INDEX_FILENAME
                    atomic_write_bytes(index, map(render_index_line, self._rows_of(keys)))
                with open(index, "rb") as written:  # summary.jsonl: the same bytes
                    blocks = iter(lambda: written.read(1 << 18), b"")
                    atomic_write_bytes(self.path / SUMMARY_FILENAME, blocks)
                atomic_write_json(
                    self.path / PROGRESS_FILENAME,
                    {
                        "total_runs": total_runs,
                        "sampled_rows": sampled_rows,
                        "total_dataset_rows": total_dataset_rows,
                    },
                )
                expected = (
                    ((r, i) for r in range(sampled_rows) for i in range(n_runs))
                    if expected_keys is None
                    else expected_keys
                )
                complete = all(key in self.records for key in expected)
                final_status = "incomplete" if status == "finished" and not complete else status
                now = datetime.now(timezone.utc)
                if duration_ms is None:
                    duration_ms = (now - started_at.astimezone(timezone.utc)).total_seconds()
                    duration_ms *= 1000.0
                eval_run = {
                    "id": self.local_run_id,
                    "status": final_status,
                    "name": self.run_name,
                    "dataset_name": dataset_name,
                    "model_name": model,
                    "rollout_name": rollout,
                    "duration_ms": float(duration_ms),
                    "started_at": format_utc(started_at),
                    "completed_at": format_utc(now) if final_status == "finished" else None,
                }
                metrics = {
                    "eval_run": {k: v for k, v in eval_run.items() if v is not None},
                    "summary": summary,
                }
                atomic_write_json(self.path / METRICS_FILENAME, metrics)
            except OSError as exc:
                raise RunDirectoryError(f"cannot write snapshots in {self.path}: {exc}") from exc
        return metrics

    def recorded_metrics(self) -> dict[str, Any] | None:
        """``metrics.json`` as the last refresh wrote it (None when absent or unreadable)."""
        try:
            document = json.loads((self.path / METRICS_FILENAME).read_bytes())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    def _project(
        self, keys: list[WorkKey], *, project_all: bool, trajectory_data: bytes | None = None
    ) -> None:
        """Copy projections for items whose selected attempt or trajectory changed.

        ``trajectory_data``: the one key's trajectory, just read by its verdict."""
        for key in keys:
            record = self.records[key]
            entry = self._entries[key]  # made by the _verdict before every call
            has_trajectory = entry.valid
            if (
                not project_all
                and key not in self._dirty
                and entry.projected == record["rollout_id"]
                and entry.projected_trajectory == has_trajectory
            ):
                continue
            try:
                project_work_item(
                    self.path,
                    row_index=key[0],
                    run_index=key[1],
                    rollout_id=record["rollout_id"],
                    trajectory_filename=(CANONICAL_TRAJECTORY_FILENAME if has_trajectory else None),
                    warn=self._warn,
                    trajectory_data=trajectory_data,
                )
            except OSError as exc:
                # A projection is a convenience copy; the result itself is durable.
                self._warn(f"cannot project row {key[0]} run {key[1]}: {exc}")
                continue
            entry.projected = record["rollout_id"]
            entry.projected_trajectory = has_trajectory
            self._dirty.discard(key)

    # -- closing ------------------------------------------------------------ #

    def close(self) -> None:
        """Close the journal and release the run lock (idempotent)."""
        self._closed = True
        with self._mutex, interrupt_held():  # a Ctrl-C's kept() must not find the lock held
            self._journal.close()
            self._lock.release()

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
