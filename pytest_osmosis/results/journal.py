"""``events.jsonl``: the append-only terminal journal, the one resume authority.

One canonical JSON line per terminal attempt, fsync'd before the result is
reported, so an acknowledged result survives a crash. Appends go through one committer
thread per journal, which writes every record queued meanwhile with a single ``fsync``
(group commit): rows that finish together share the disk's latency, and each caller
still waits for its own record's sync before anything reports it. A commit starts as
soon as someone waits for one; records nobody waits for yet (rows that finished ahead of
pytest's report) wait at most ``GROUP_WINDOW_S`` for more to join them, so a fast run
wakes the committer and syncs once per window, not once per row. Replay keeps the last
record per ``(row_index, run_index)`` in append order (no timestamps on purpose:
a skewed clock can never change which attempt wins).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atomic import FILE_MODE, canonical_json, fsync_dir

JOURNAL_FILENAME = "events.jsonl"

#: ``(row_index, run_index)``: a work item's identity inside one run.
WorkKey = tuple[int, int]

TERMINAL_STATUSES: frozenset[str] = frozenset({"success", "failed", "skipped"})

#: ``(field, accepted JSON types, label, required)``; the whole record schema.
#: Unlisted keys are dropped, so a work result may carry extras for the plugin.
_FIELDS: tuple[tuple[str, type | tuple[type, ...], str, bool], ...] = (
    ("row_index", int, "an integer", True),
    ("run_index", int, "an integer", True),
    ("rollout_id", str, "a string", True),
    ("status", str, "a string", True),
    ("source_row_index", int, "an integer", False),
    ("reward", (int, float), "a number", False),
    ("tokens", int, "an integer", False),
    ("duration_ms", (int, float), "a number", False),
    ("error_type", str, "a string", False),
)

_PATH_SEPARATORS = ("/", "\\")

#: How long a record nobody waits for yet may wait for others to share its fsync: what a
#: crash (not an interrupt, an error or an exit: those commit at once) may lose of rows
#: that finished ahead of their report.
GROUP_WINDOW_S = 0.02

_CORRUPT_HINT = (
    "the run cannot resume safely: repair or delete that line, or start over with --osmosis-fresh"
)


def is_single_path_segment(name: str) -> bool:
    """True when *name* is one plain path component (no separator, not ``.``/``..``)."""
    if not name or name in (".", ".."):
        return False
    if "\x00" in name or any(sep in name for sep in _PATH_SEPARATORS):
        return False
    # Only a drive ("C:x" on Windows) can still make the last component differ; a path
    # object for every row's id (three a row) is skipped when there is no colon.
    return ":" not in name or Path(name).name == name


def _show(value: Any) -> str:
    """A short repr, so one corrupt value cannot flood an error line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_utf8(text: str) -> bool:
    """False for lone surrogates (``"\\ud800"`` in JSON), which no file can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def normalize_record(payload: Any, *, where: str) -> dict[str, Any]:
    """Validate one terminal record and return exactly the journal fields.

    ``None`` values count as absent, booleans are refused for numeric fields,
    ``reward``/``duration_ms`` become floats and ``duration_ms`` defaults to 0.0,
    as the SDK's record type does. Raises :class:`RunDirectoryError` naming *where*.
    """
    if not isinstance(payload, Mapping):
        raise RunDirectoryError(f"{where}: record is not a JSON object")
    values: dict[str, Any] = {}
    for name, kinds, label, required in _FIELDS:
        value = payload.get(name)
        if value is None:
            if required:
                raise RunDirectoryError(f"{where}: {name} is missing")
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise RunDirectoryError(f"{where}: {name} must be {label}, got {_show(value)}")
        if isinstance(value, str) and not _is_utf8(value):
            raise RunDirectoryError(
                f"{where}: {name} is not valid Unicode text, got {_show(value)}"
            )
        values[name] = value
    for name in ("row_index", "run_index", "source_row_index"):
        if values.get(name, 0) < 0:
            raise RunDirectoryError(
                f"{where}: {name} must be a non-negative integer, got {values[name]}"
            )
    # The id names a directory under rollout_trials/ and is copied into
    # projections, so a separator or traversal would reach outside the run.
    if not is_single_path_segment(values["rollout_id"]):
        raise RunDirectoryError(
            f"{where}: rollout_id must be a single path segment, got {values['rollout_id']!r}"
        )
    if values["status"] not in TERMINAL_STATUSES:
        raise RunDirectoryError(
            f"{where}: status must be one of failed, skipped, success, got {values['status']!r}"
        )
    for name in ("reward", "duration_ms"):
        if name in values:
            # The journal is written with allow_nan=False, so a non-finite number here
            # could never be written back (index, metrics): refuse it as corruption.
            try:
                number = float(values[name])
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                raise RunDirectoryError(
                    f"{where}: {name} must be a finite number, got {_show(values[name])}"
                )
            values[name] = number
    values.setdefault("duration_ms", 0.0)
    return values


_FIELD_NAMES = tuple(name for name, *_ in _FIELDS)


def normalized_as(payload: Any, normalized: Mapping[str, Any]) -> bool:
    """Whether :func:`normalize_record` of *payload* is *normalized*, known without checking
    it again: each journal field of *payload* is the very object *normalized* holds (or
    absent from both). A result normalized as its row finished (``RunDirectory.stage``)
    and handed on as it was, or copied with its values, is not validated twice."""
    if not isinstance(payload, Mapping):
        return False
    for name in _FIELD_NAMES:
        if payload.get(name) is not normalized.get(name):
            return False
    return True


def journal_line(record: Mapping[str, Any]) -> bytes:
    """The on-disk form of a normalized record: canonical JSON plus ``\\n``."""
    return (canonical_json(dict(record)) + "\n").encode("utf-8")


def _read_back(line: bytes) -> Any:
    """What replay will make of *line*: one JSON object on one line, or None."""
    if line.count(b"\n") != 1:
        return None
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


@dataclass
class JournalReplay:
    """What replay found: the latest record per key and where appends must start."""

    latest: dict[WorkKey, dict[str, Any]] = field(default_factory=dict)
    #: Byte offset just past the last complete line.
    committed_size: int = 0
    #: Size of a discarded final fragment with no newline (a crash mid-append).
    truncated_bytes: int = 0


def _foreign_item(record: Mapping[str, Any], sources: Sequence[int], n: int) -> str | None:
    """Why *record* is no work item of a run of ``sources`` rows x ``n`` attempts, if it is not.

    Only a hand edit puts one there; replaying it would count a row the dataset does not
    have ("11 passed of 11" for 10 rows), and the SDK's planner rejects such a run.
    """
    row, attempt = record["row_index"], record["run_index"]
    rows = len(sources)
    if row >= rows:
        return f"row_index {row} is not a row of this run (it has {rows} rows: 0-{rows - 1})"
    if attempt >= n:
        return f"run_index {attempt} is not an attempt of this run (n = {n}: 0-{n - 1})"
    source = record.get("source_row_index")
    if source is not None and source != sources[row]:
        return f"source_row_index {source} is not row_index {row}'s source row ({sources[row]})"
    return None


def replay_journal(
    path: Path, *, sources: Sequence[int] | None = None, n: int | None = None
) -> JournalReplay:
    """Read committed records; a torn final line is reported, a bad committed one refused.

    Given the run's selected ``sources`` rows and ``n`` attempts, a record of any other
    work item is refused too, naming its line.
    """
    replay = JournalReplay()
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return replay
    except OSError as exc:
        raise RunDirectoryError(f"{path}: cannot read the journal ({exc})") from exc
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                replay.truncated_bytes = len(raw)
                break
            where = f"{path}:{lineno}"
            text = raw[:-1].strip()
            if not text:
                raise RunDirectoryError(f"{where}: blank journal record; {_CORRUPT_HINT}")
            try:
                payload = json.loads(text)
            except (ValueError, RecursionError) as exc:
                # Besides JSONDecodeError/UnicodeDecodeError: integers past the str->int
                # digit limit (ValueError) and deeply nested arrays (RecursionError).
                reason = getattr(exc, "msg", None) or " ".join(str(exc).split())
                raise RunDirectoryError(
                    f"{where}: invalid JSON in journal record ({reason}); {_CORRUPT_HINT}"
                ) from exc
            try:
                record = normalize_record(payload, where=where)
            except RunDirectoryError as exc:
                raise RunDirectoryError(f"{exc}; {_CORRUPT_HINT}") from exc
            if record["status"] != "success" and "reward" in record:
                # Only a hand edit or a foreign journal holds one: the SDK counts a failed
                # record's reward against the threshold, we count no failure as passed,
                # so the index and the pass rate would disagree with it.
                raise RunDirectoryError(
                    f"{where}: a {record['status']} record carries reward "
                    f"{_show(record['reward'])}, but only a success has a reward; "
                    f"{_CORRUPT_HINT}"
                )
            if sources is not None and n is not None:
                foreign = _foreign_item(record, sources, n)
                if foreign is not None:
                    raise RunDirectoryError(f"{where}: {foreign}; {_CORRUPT_HINT}")
            replay.latest[(record["row_index"], record["run_index"])] = record
            replay.committed_size += len(raw)
    return replay


def read_journal(run_dir: Path) -> dict[WorkKey, dict[str, Any]]:
    """Latest record per work key of *run_dir*, read-only (for xdist workers)."""
    return replay_journal(run_dir / JOURNAL_FILENAME).latest


class Commit:
    """One caller's records in the committer's queue: wait for them to be durable.

    Only a sequence number and its journal: a row that finished ahead of pytest's report
    holds one until it is reported, so it must weigh no more than an int (an Event each
    was ~1 KB a row).
    """

    __slots__ = ("_journal", "_sequence")

    def __init__(self, journal: Journal, sequence: int) -> None:
        self._journal = journal
        self._sequence = sequence

    def wait(self) -> None:
        """Return once the records are written and fsync'd; raise what the write raised."""
        self._journal._wait(self._sequence)


class Journal:
    """The append side of ``events.jsonl``: queued records, ``os.write`` loop, one ``fsync``."""

    def __init__(self, path: Path, replay: JournalReplay) -> None:
        self.path = path
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
        try:
            if replay.truncated_bytes:
                # Discard the torn fragment so the next record starts on a line.
                os.ftruncate(fd, replay.committed_size)
                os.fsync(fd)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        #: Which file this is, to notice the run directory deleted or replaced under us.
        self._identity = (st.st_dev, st.st_ino)
        #: Bytes of complete records: a failed append is cut back to it.
        self._size = st.st_size
        self._queue: list[bytes] = []
        lock = threading.Lock()
        self._wake = threading.Condition(lock)  # the committer: something is queued
        self._durable = threading.Condition(lock)  # the callers: a commit has settled
        #: Submissions are numbered; every one up to ``_settled`` is written or failed.
        self._submitted = 0
        self._settled = 0
        self._waiting = 0  # callers waiting for a submission not settled yet
        self._since = 0.0  # when the oldest queued record was queued (monotonic)
        self._failures: dict[int, BaseException] = {}
        self._closing = False
        self._committer: threading.Thread | None = None
        if created:
            fsync_dir(path.parent)

    def ensure_in_place(self) -> None:
        """Raise :class:`RunDirectoryError` unless ``path`` is still the file opened.

        A cleanup job deleting the run directory leaves the open descriptor writable,
        so appends would "succeed" into a file no one can read and a resume would
        silently run and pay for every row again.
        """
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            raise RunDirectoryError(
                f"the run directory {self.path.parent} was deleted or replaced during the "
                f"session (its {self.path.name} is gone); nothing more can be recorded there"
            )

    def append(self, record: Mapping[str, Any]) -> None:
        """Durably append one normalized record; returns after ``fsync``.

        A failed write (a full disk) is cut back off, so the journal holds exactly the
        records acknowledged before it and the next session resumes after the last one.
        """
        self.extend([record])

    def extend(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Durably append normalized records with one ``fsync`` (all of them, or none)."""
        self.submit(records).wait()

    def submit(self, records: Sequence[Mapping[str, Any]]) -> Commit:
        """Queue normalized records for the next group commit; :meth:`Commit.wait` for it.

        Never blocks on the disk, so the event loop can hand over a finished row's record.
        """
        lines = []
        for record in records:
            one = journal_line(record)
            if _read_back(one) != dict(record):
                raise RunDirectoryError(
                    f"{self.path}: the record of row {record.get('row_index')} run "
                    f"{record.get('run_index')} does not read back as written, so it was not "
                    "journalled (is json.dumps replaced in this process?)"
                )
            lines.append(one)
        with self._wake:
            if self._fd is None or self._closing:
                raise RunDirectoryError(f"{self.path}: the journal is closed")
            if not self._queue:
                self._since = time.monotonic()
                self._wake.notify()  # the committer starts its window (later ones join it)
            self._queue.append(b"".join(lines))
            self._submitted += 1
            commit = Commit(self, self._submitted)
            if self._committer is None:
                self._committer = threading.Thread(
                    target=self._commit_loop, name="osmosis-journal", daemon=True
                )
                self._committer.start()
        return commit

    def _commit_loop(self) -> None:
        """Write whatever is queued, sync once, release its callers; until closed."""
        while True:
            with self._wake:
                while True:
                    if not self._queue:
                        if self._closing:
                            return
                        self._wake.wait()
                        continue
                    left = GROUP_WINDOW_S - (time.monotonic() - self._since)
                    if self._closing or self._waiting or left <= 0:
                        break
                    self._wake.wait(left)
                batch, self._queue = self._queue, []
                first, last = self._submitted - len(batch) + 1, self._submitted
            failure: BaseException | None = None
            try:
                self._write(b"".join(batch))
            except BaseException as exc:  # noqa: BLE001 - each caller raises it
                failure = exc
            with self._wake:
                if failure is not None:
                    self._failures.update(dict.fromkeys(range(first, last + 1), failure))
                self._settled = last
                self._durable.notify_all()

    def _wait(self, sequence: int) -> None:
        with self._durable:
            if self._settled < sequence:
                self._waiting += 1
                self._wake.notify()  # someone waits: commit now, not at the window's end
                try:
                    self._durable.wait_for(lambda: self._settled >= sequence)
                finally:
                    self._waiting -= 1
            failure = self._failures.get(sequence)
        if failure is not None:
            raise failure

    def _write(self, data: bytes) -> None:
        """Append *data* and fsync; a failure cuts the file back to its last whole record."""
        assert self._fd is not None
        self.ensure_in_place()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def seal(self) -> None:
        """The final flush: write what is queued now and take no record after it (submit
        raises). Returns once every record submitted is written or failed, so the file holds
        all it will ever hold from this process: what a stop line may count."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            self._durable.wait_for(lambda: self._settled >= self._submitted)

    def close(self) -> None:
        """Commit what is queued, stop the committer and close the descriptor; later appends
        raise."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            committer.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
