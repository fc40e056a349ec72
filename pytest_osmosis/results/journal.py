"""``events.jsonl``: the append-only terminal journal, the one resume authority.

One canonical JSON line per terminal attempt, fsync'd before the result is
reported, so an acknowledged result survives a crash. Replay keeps the last
record per ``(row_index, run_index)`` in append order (no timestamps on purpose:
a skewed clock can never change which attempt wins).
"""

from __future__ import annotations

import contextlib
import math
import os
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

_CORRUPT_HINT = (
    "the run cannot resume safely: repair or delete that line, or start over with --osmosis-fresh"
)


def is_single_path_segment(name: str) -> bool:
    """True when *name* is one plain path component (no separator, not ``.``/``..``)."""
    if not name or name in (".", ".."):
        return False
    if "\x00" in name or any(sep in name for sep in _PATH_SEPARATORS):
        return False
    return Path(name).name == name


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


class Journal:
    """The append side of ``events.jsonl``: ``os.write`` loop, then ``fsync``."""

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
        if self._fd is None:
            raise RunDirectoryError(f"{self.path}: the journal is closed")
        self.ensure_in_place()
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
        line = b"".join(lines)
        view = memoryview(line)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(line)

    def close(self) -> None:
        """Close the descriptor; later appends raise."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
