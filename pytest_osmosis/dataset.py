"""Dataset files to selected, normalised rows (contract §3), cheap enough for 100k rows.

Collection must reject a bad row (file, row, key) before any model call, yet an item must
not carry its row. So every selected row is validated when the dataset is opened, and then
only what is needed to rebuild it is kept: byte offsets for JSONL (re-parsed on demand), the
contract columns of the selected rows for CSV and Parquet.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import random
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pytest_osmosis.errors import ConfigError, DatasetError

__all__ = [
    "DATASET_EXTENSIONS",
    "EvalDatasetRow",
    "SelectedDataset",
    "clear_dataset_cache",
    "dataset_extension",
    "format_row_selector",
    "normalize_row",
    "open_dataset",
    "parse_rows",
    "resolve_dataset_path",
]

DATASET_EXTENSIONS = ("jsonl", "csv", "parquet")
"""Lookup order for `<workspace>/data/<dataset>.<ext>`, and the accepted extensions."""

_METADATA = "metadata"
_CONTRACT_COLUMNS = ("system_prompt", "user_prompt", "ground_truth", "label", _METADATA)
_CSV_FIELD_SIZE_LIMIT = 16 * 1024 * 1024
# Module level so tests can shrink it and exercise lines split across reads.
_READ_CHUNK = 1 << 20
_PARQUET_BATCH = 1 << 16
_ROWS_RE = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
# Python's text mode (what the official reader uses) ends a line at \r\n, \r or \n.
_NEWLINE_SPLIT = re.compile(rb"(\r\n|\r|\n)")
_NEWLINE = re.compile(rb"\r\n|\r|\n")
_CACHE_SIZE = 16

_Identity = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class EvalDatasetRow:
    """One normalised row; `row_index` is its position in the selection (platform-visible)."""

    row_index: int
    source_row_index: int
    initial_messages: list[dict[str, str]]
    label: str | None
    metadata: dict[str, Any] | None


class _RowProblem(Exception):
    """A row breaks §3.2; the caller adds where it is (file, row, line)."""


# --------------------------------------------------------------------------- #
# Resolution
# --------------------------------------------------------------------------- #


def dataset_extension(path: Path) -> str:
    """The lower-cased extension, which decides the reader; anything else is refused."""
    extension = path.suffix.lstrip(".").lower()
    if extension not in DATASET_EXTENSIONS:
        raise DatasetError(
            f"{path}: unsupported dataset extension {extension or '(none)'!r}; "
            f"expected one of .jsonl, .csv, .parquet"
        )
    return extension


def resolve_dataset_path(workspace: Path, dataset: str, dataset_file: Path | None) -> Path:
    """`dataset_file` when given, else the first of `data/<dataset>.{jsonl,csv,parquet}`."""
    if dataset_file is not None:
        try:
            candidate = dataset_file.expanduser()
            is_file, exists = candidate.is_file(), candidate.exists()
        except (OSError, RuntimeError) as exc:  # a name too long, no home directory
            raise DatasetError(f"dataset file {dataset_file} cannot be used ({exc})") from None
        if not is_file:
            what = "is not a file" if exists else "does not exist"
            raise DatasetError(f"dataset file {candidate} {what}")
        dataset_extension(candidate)
        return candidate
    if not dataset or dataset in (".", "..") or any(sep in dataset for sep in ("/", "\\", "\0")):
        raise DatasetError(
            f"experiment.dataset {dataset!r} is not a dataset name: it is looked up as "
            f"data/<dataset>.jsonl|.csv|.parquet, so it must be one path segment"
        )
    data_dir = workspace / "data"
    tried = [data_dir / f"{dataset}.{extension}" for extension in DATASET_EXTENSIONS]
    for candidate in tried:
        try:
            if candidate.is_file():
                return candidate
        except OSError as exc:  # e.g. a name longer than the file system allows
            raise DatasetError(
                f"experiment.dataset {_short(dataset)} cannot be looked up as "
                f"{_short(candidate.name)} ({exc.strerror or exc})"
            ) from None
    hint = ""
    if Path(dataset).suffix.lstrip(".").lower() in DATASET_EXTENSIONS:
        hint = f" (experiment.dataset is a name without extension: try {Path(dataset).stem!r})"
    raise DatasetError(
        f"no dataset file for experiment.dataset {dataset!r}: tried "
        f"{', '.join(str(path) for path in tried)}{hint}"
    )


# --------------------------------------------------------------------------- #
# Row normalisation (§3.2)
# --------------------------------------------------------------------------- #


def _short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(exc: BaseException) -> str:
    """Library messages may span lines; ours are one line."""
    return " ".join(str(exc).split())


def _type_name(value: Any) -> str:
    return type(value).__name__


_JSON_KINDS = {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}


def _json_kind(value: Any) -> str:
    return "null" if value is None else _JSON_KINDS.get(type(value), _type_name(value))


def _text(raw: Mapping[str, Any], column: str) -> str | None:
    value = raw.get(column)
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    try:
        return str(value)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _RowProblem(f"{column} cannot be turned into text ({_one_line(exc)})") from None


def _metadata(value: Any) -> dict[str, Any] | None:
    # An empty object counts as absent so the "no prompt and no metadata" rule can fire.
    if value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value) or None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _RowProblem(f"metadata is not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:
            raise _RowProblem(f"metadata is not valid JSON ({_one_line(exc)})") from None
        if not isinstance(decoded, dict):
            raise _RowProblem(f"metadata must be a JSON object, got a JSON {_json_kind(decoded)}")
        return decoded or None
    raise _RowProblem(f"metadata must be a JSON object, got {_type_name(value)}")


def _normalize(
    raw: Mapping[str, Any],
) -> tuple[list[dict[str, str]], str | None, dict[str, Any] | None]:
    """§3.2 without row identity, so validation at open builds no dataclass."""
    metadata_mode = _METADATA in raw
    metadata = _metadata(raw[_METADATA]) if metadata_mode else None
    system_prompt = _text(raw, "system_prompt")
    user_prompt = _text(raw, "user_prompt")
    if user_prompt is None and not metadata_mode:
        raise _RowProblem(
            "user_prompt is required for a row with no 'metadata' column "
            "(give a non-empty user_prompt, or a metadata object)"
        )
    label = _text(raw, "ground_truth")
    if label is None:
        label = _text(raw, "label")
    if label is None and not metadata_mode:
        raise _RowProblem("ground_truth (or label) is required for a row with no 'metadata' column")
    messages: list[dict[str, str]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    if user_prompt is not None:
        messages.append({"role": "user", "content": user_prompt})
    if not messages and metadata is None:
        raise _RowProblem(
            "has no prompt and no metadata; a row needs at least a user_prompt or a "
            "non-empty 'metadata' object"
        )
    return messages, label, metadata


def normalize_row(raw: Mapping[str, Any], source_row_index: int, row_index: int) -> EvalDatasetRow:
    """Normalise one raw row exactly as the official local reader does (§3.2)."""
    try:
        messages, label, metadata = _normalize(raw)
    except _RowProblem as problem:
        raise DatasetError(f"row {source_row_index}: {problem}") from None
    return EvalDatasetRow(row_index, source_row_index, messages, label, metadata)


# --------------------------------------------------------------------------- #
# Row selection (§3.3)
# --------------------------------------------------------------------------- #


def _parse_row_ranges(spec: str) -> list[tuple[int, int]]:
    """Grammar and inverted ranges only; merged inclusive ranges, never materialised."""
    text = spec.strip()
    if not _ROWS_RE.fullmatch(text):
        raise DatasetError(
            f"invalid rows selector {spec!r}: use 0-based indices and inclusive ranges "
            f"joined by commas, e.g. 3,7,10-20 (no spaces, no negatives)"
        )
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            start = int(first)
            end = int(last) if last else start
        except ValueError:  # more digits than int() accepts
            raise DatasetError(f"invalid rows selector {spec!r}: an index is too large") from None
        if start > end:
            raise DatasetError(
                f"rows selector range {part!r} is inverted; write it as {end}-{start}"
            )
        ranges.append((start, end))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1] + 1:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _ranges_selector(ranges: Iterable[tuple[int, int]]) -> str:
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _check_in_range(ranges: list[tuple[int, int]], total: int, name: str) -> None:
    beyond = [(max(start, total), end) for start, end in ranges if end >= total]
    if beyond:
        valid = f"valid indices are 0-{total - 1}" if total else "it has no rows"
        raise DatasetError(
            f"rows selector selects {_ranges_selector(beyond)} but {name} has "
            f"{total} rows ({valid})"
        )


def parse_rows(spec: str, total: int) -> list[int]:
    """Parse a `--rows` value like `3,7,10-20` into sorted unique indices below `total`."""
    ranges = _parse_row_ranges(spec)
    _check_in_range(ranges, total, "the dataset")
    return [index for start, end in ranges for index in range(start, end + 1)]


def format_row_selector(indices: Iterable[int]) -> str:
    """Compact form the manifest stores, e.g. `0-9,12` (sorted, unique, runs as a-b)."""
    ordered = sorted(set(indices))
    ranges: list[tuple[int, int]] = []
    for index in ordered:
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], index)
        else:
            ranges.append((index, index))
    return _ranges_selector(ranges)


def _make_picker(ranges: list[tuple[int, int]] | None, limit: int | None) -> Callable[[int], bool]:
    """Decide, in increasing source order, whether a row is a candidate (rows, else limit)."""
    if ranges is not None:
        state = {"at": 0}

        def in_ranges(source: int) -> bool:
            at = state["at"]
            while at < len(ranges) and ranges[at][1] < source:
                at += 1
            state["at"] = at
            return at < len(ranges) and ranges[at][0] <= source

        return in_ranges
    if limit is not None and limit > 0:
        bound = limit
        return lambda source: source < bound
    return lambda source: True


def _sample_positions(count: int, fraction: float, seed: int) -> list[int]:
    """A seeded subset of `range(count)`: round(count * fraction) rows, at least one."""
    wanted = min(count, max(1, math.floor(count * fraction + 0.5)))
    if wanted >= count:
        return list(range(count))
    # random.Random(int) is identical in every process; hash() and the global RNG are not.
    return sorted(random.Random(seed).sample(range(count), wanted))


# --------------------------------------------------------------------------- #
# Readers: one pass that hashes, counts, and validates the candidate rows
# --------------------------------------------------------------------------- #


def _identity(stat: os.stat_result) -> _Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@dataclass
class _Scan:
    """What one read pass leaves behind, for the candidate rows (before sampling)."""

    sha256: str
    identity: _Identity
    total: int
    sources: array[int]
    lines: array[int]  # 1-based line of each candidate (JSONL, CSV)
    starts: array[int]  # JSONL byte span of each candidate
    ends: array[int]
    errors: dict[int, str]  # candidate position -> message, kept only when sampling
    # CSV and Parquet keep the contract columns present (`names`) of each candidate:
    # CSV as one tuple of strings per row, Parquet as Arrow data (far smaller than dicts).
    names: tuple[str, ...] = ()
    values: list[tuple[Any, ...]] | None = None
    table: Any = None


def _new_scan() -> _Scan:
    return _Scan("", (0, 0, 0, 0), 0, array("q"), array("q"), array("q"), array("q"), {})


def _read_error(path: Path, exc: OSError) -> DatasetError:
    return DatasetError(f"cannot read dataset {path}: {exc.strerror or exc}")


def _changed(path: Path) -> DatasetError:
    return DatasetError(f"{path} changed while it was being read; run again on a stable file")


def _physical_lines(handle: IO[bytes], digest: Any) -> Iterator[tuple[int, bytes]]:
    """(start offset, line without terminator) for each text-mode line, hashing every byte."""
    buffer = bytearray()
    base = 0
    while True:
        chunk = handle.read(_READ_CHUNK)
        if chunk:
            digest.update(chunk)
            low = max(0, len(buffer) - 1)
            buffer += chunk
            # A trailing \r may be the first half of \r\n: keep it for the next read.
            cut = max(buffer.rfind(b"\n", low), buffer.rfind(b"\r", low, len(buffer) - 1)) + 1
            if cut == 0:
                continue
            head = bytes(buffer[:cut])
            del buffer[:cut]
        else:
            head = bytes(buffer)
            buffer.clear()
        position = base
        if b"\r" in head:
            parts = _NEWLINE_SPLIT.split(head)
            for at in range(0, len(parts) - 1, 2):
                line = parts[at]
                yield position, line
                position += len(line) + len(parts[at + 1])
            if parts[-1]:
                yield position, parts[-1]
        else:
            lines = head.split(b"\n")
            last = lines.pop()
            for line in lines:
                yield position, line
                position += len(line) + 1
            if last:
                yield position, last
        base += len(head)
        if not chunk:
            return


def _json_line(path: Path, lineno: int, line: bytes) -> dict[str, Any] | None:
    """The object on one JSONL line, None for a blank line; errors in the contract's words."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start + 1} of the line)"
        ) from None
    stripped = text.strip()
    if not stripped:
        return None
    try:
        payload = json.loads(stripped)
    except json.JSONDecodeError as exc:
        column = len(text) - len(text.lstrip()) + exc.pos + 1
        raise DatasetError(
            f"{path}:{lineno}: invalid JSON ({exc.msg} at column {column})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise DatasetError(f"{path}:{lineno}: invalid JSON ({_one_line(exc)})") from None
    if not isinstance(payload, dict):
        raise DatasetError(
            f"{path}:{lineno}: each line must be a JSON object, got a JSON {_json_kind(payload)}"
        )
    return payload


def _row_place(path: Path, source: int, line: int | None) -> str:
    return f"{path}: row {source}" + (f" (line {line})" if line is not None else "")


def _check_candidate(
    scan: _Scan,
    raw: Mapping[str, Any],
    place: tuple[Path, int, int | None],
    sampling: bool,
) -> None:
    """Validate one candidate; when sampling, only a problem in a sampled row is fatal."""
    try:
        _normalize(raw)
    except _RowProblem as problem:
        message = f"{_row_place(*place)}: {problem}"
        if not sampling:
            raise DatasetError(message) from None
        scan.errors[len(scan.sources)] = message


def _scan_jsonl(path: Path, pick: Callable[[int], bool], sampling: bool) -> _Scan:
    scan = _new_scan()
    digest = hashlib.sha256()
    total = 0
    with path.open("rb") as handle:
        scan.identity = _identity(os.fstat(handle.fileno()))
        for lineno, (start, line) in enumerate(_physical_lines(handle, digest), 1):
            payload = _json_line(path, lineno, line)
            if payload is None:
                continue
            source = total
            total += 1
            if not pick(source):
                continue
            _check_candidate(
                scan,
                payload,
                (path, source, lineno),
                sampling,
            )
            scan.sources.append(source)
            scan.lines.append(lineno)
            scan.starts.append(start)
            scan.ends.append(start + len(line))
        if _identity(os.fstat(handle.fileno())) != scan.identity:
            raise _changed(path)
    scan.total = total
    scan.sha256 = digest.hexdigest()
    return scan


def _read_all(path: Path, scan: _Scan) -> bytes:
    with path.open("rb") as handle:
        scan.identity = _identity(os.fstat(handle.fileno()))
        data = handle.read()
        if _identity(os.fstat(handle.fileno())) != scan.identity:
            raise _changed(path)
    scan.sha256 = hashlib.sha256(data).hexdigest()
    return data


def _utf8_error(data: bytes) -> str:
    """Line and reason of the first invalid UTF-8 byte (error path only)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = len(_NEWLINE.findall(data, 0, exc.start)) + 1
        return f"{line}: not valid UTF-8 ({exc.reason})"
    return ": not valid UTF-8"  # pragma: no cover - only called after a decode error


def _nul_error(path: Path, data: bytes) -> DatasetError | None:
    """A NUL anywhere in a CSV file is refused, on every Python.

    Python 3.10's ``csv`` refuses NUL, 3.11+ accepts it; we decide, not the interpreter.
    ``bytes.find`` keeps the check a C-speed scan; lines are counted only on the error path.
    """
    at = data.find(b"\0")
    if at < 0:
        return None
    line_start = 0
    line = 1
    for match in _NEWLINE.finditer(data, 0, at):
        line, line_start = line + 1, match.end()
    column = len(data[line_start:at].decode("utf-8", "replace")) + 1
    return DatasetError(
        f"{path}:{line}:{column}: invalid CSV (a NUL character at line {line}, column {column})"
    )


def _scan_csv(path: Path, pick: Callable[[int], bool], sampling: bool) -> _Scan:
    scan = _new_scan()
    data = _read_all(path, scan)
    nul = _nul_error(path, data)
    if nul is not None:
        raise nul
    values: list[tuple[Any, ...]] = []
    scan.values = values
    previous_limit = csv.field_size_limit(_CSV_FIELD_SIZE_LIMIT)
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="")
    reader = csv.reader(text)
    try:
        header = next(reader, None)
        if header is None:
            raise DatasetError(f"{path}: the CSV file is empty; it needs a header row")
        if not header:
            raise DatasetError(f"{path}: line 1 must be the CSV header row, but it is empty")
        if header[0].startswith("\ufeff") and header[0][1:] in _CONTRACT_COLUMNS:
            raise DatasetError(
                f"{path}: starts with a UTF-8 byte-order mark, so its first column is not "
                f"{header[0][1:]!r}; save it as UTF-8 without BOM"
            )
        # Like csv.DictReader: the last column of a repeated name wins; missing cells are None.
        position = {name: at for at, name in enumerate(header)}
        columns = [(name, position[name]) for name in _CONTRACT_COLUMNS if name in position]
        scan.names = tuple(name for name, _ in columns)
        total = 0
        while True:
            line = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if not record:
                continue
            source = total
            total += 1
            if not pick(source):
                continue
            width = len(record)
            raw = {name: (record[at] if at < width else None) for name, at in columns}
            _check_candidate(
                scan,
                raw,
                (path, source, line),
                sampling,
            )
            scan.sources.append(source)
            scan.lines.append(line)
            values.append(tuple(raw.values()))
        scan.total = total
    except csv.Error as exc:
        raise DatasetError(f"{path}:{reader.line_num}: invalid CSV ({_one_line(exc)})") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}:{_utf8_error(data)}") from None
    finally:
        csv.field_size_limit(previous_limit)
    return scan


def _scan_parquet(
    path: Path, pick: Callable[[int], bool], last_wanted: int | None, sampling: bool
) -> _Scan:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"{path}: reading Parquet datasets needs pyarrow: pip install 'pytest-osmosis[parquet]'"
        ) from None
    scan = _new_scan()
    data = _read_all(path, scan)
    kept: list[Any] = []
    # pyarrow parses untrusted bytes: whatever it raises means "this file is unreadable".
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        present = set(parquet.schema_arrow.names)
        total = int(parquet.metadata.num_rows)
    except Exception as exc:
        raise DatasetError(
            f"{path}: not a readable Parquet file ({type(exc).__name__}: {_one_line(exc)})"
        ) from None
    columns = [name for name in _CONTRACT_COLUMNS if name in present]
    scan.names = tuple(columns)
    batches = iter(parquet.iter_batches(batch_size=_PARQUET_BATCH, columns=columns))
    offset = 0
    exhausted = False
    while last_wanted is None or offset <= last_wanted:
        try:
            batch = next(batches, None)
        except Exception as exc:
            raise DatasetError(
                f"{path}: cannot read Parquet rows from {offset} on "
                f"({type(exc).__name__}: {_one_line(exc)})"
            ) from None
        if batch is None:
            exhausted = True
            break
        size = int(batch.num_rows)
        wanted = [at for at in range(size) if pick(offset + at)]
        if wanted:
            # A repeated column name comes back twice; like to_pylist(), the last one wins.
            batch_names = list(batch.schema.names)
            arrays = [
                batch.column(len(batch_names) - 1 - batch_names[::-1].index(name))
                for name in columns
            ]
            values: list[list[Any]] = []
            for name, column in zip(columns, arrays, strict=True):
                try:
                    values.append(column.to_pylist())
                except Exception as exc:
                    raise DatasetError(
                        f"{path}: column {name!r} of type {column.type} cannot be read as "
                        f"Python values ({type(exc).__name__}: {_one_line(exc)})"
                    ) from None
            for at in wanted:
                source = offset + at
                raw = {
                    name: column_values[at]
                    for name, column_values in zip(columns, values, strict=True)
                }
                _check_candidate(scan, raw, (path, source, None), sampling)
                scan.sources.append(source)
            if columns:
                selected = pa.RecordBatch.from_arrays(arrays, names=columns)
                kept.append(selected if len(wanted) == size else selected.take(pa.array(wanted)))
        offset += size
    if offset > total or (exhausted and offset != total):
        # A damaged footer: the row count the contract reports must be the real one.
        held = offset if exhausted else f"at least {offset}"
        raise DatasetError(
            f"{path}: corrupt Parquet file: its footer says {total} rows, its row groups "
            f"hold {held}"
        )
    scan.total = total
    if kept:
        scan.table = pa.Table.from_batches(kept)
    return scan


# --------------------------------------------------------------------------- #
# The selected dataset
# --------------------------------------------------------------------------- #


class SelectedDataset:
    """The rows a run executes: identity (path, sha256), sizes, and rows built on demand."""

    __slots__ = (
        "path",
        "format",
        "sha256",
        "total_dataset_rows",
        "selector",
        "_identity",
        "_sources",
        "_lines",
        "_starts",
        "_ends",
        "_names",
        "_values",
        "_table",
    )

    def __init__(self, path: Path, format: str, scan: _Scan) -> None:
        self.path = path
        self.format = format
        self.sha256 = scan.sha256
        self.total_dataset_rows = scan.total
        self._identity = scan.identity
        self._sources = scan.sources
        self._lines = scan.lines
        self._starts = scan.starts
        self._ends = scan.ends
        self._names = scan.names
        self._values = scan.values
        # One chunk makes column[i] O(1).
        self._table = None if scan.table is None else scan.table.combine_chunks()
        self.selector = format_row_selector(scan.sources)

    def __len__(self) -> int:
        return len(self._sources)

    def __repr__(self) -> str:
        return (
            f"SelectedDataset({str(self.path)!r}, rows={self.selector!r}, "
            f"total_dataset_rows={self.total_dataset_rows})"
        )

    @property
    def selected_source_rows(self) -> list[int]:
        """Source indices of the selection, in order (a fresh list: O(selected))."""
        return self._sources.tolist()

    def source_row_index(self, row_index: int) -> int:
        """O(1) source index of one selected row."""
        return self._sources[self._check(row_index)]

    def _check(self, row_index: int) -> int:
        if not 0 <= row_index < len(self._sources):
            raise IndexError(f"row_index {row_index} outside 0..{len(self._sources) - 1}")
        return row_index

    def row(self, row_index: int) -> EvalDatasetRow:
        """Build selected row `row_index` (fresh objects each call, safe to mutate)."""
        source = self._sources[self._check(row_index)]
        raw: Mapping[str, Any]
        if self._values is not None:
            raw = dict(zip(self._names, self._values[row_index], strict=True))
        elif self.format == "parquet":
            table = self._table
            raw = {
                name: None if table is None else table.column(at)[row_index].as_py()
                for at, name in enumerate(self._names)
            }
        else:
            raw = self._jsonl_row(row_index)
        try:
            messages, label, metadata = _normalize(raw)
        except _RowProblem as problem:  # pragma: no cover - validated at open
            raise DatasetError(f"{_row_place(self.path, source, None)}: {problem}") from None
        return EvalDatasetRow(row_index, source, messages, label, metadata)

    def _jsonl_row(self, row_index: int) -> Mapping[str, Any]:
        start = self._starts[row_index]
        try:
            with self.path.open("rb") as handle:
                if _identity(os.fstat(handle.fileno())) != self._identity:
                    raise DatasetError(
                        f"{self.path} changed after it was opened (sha256 {self.sha256[:12]}); "
                        f"restart the session to use the new content"
                    )
                handle.seek(start)
                line = handle.read(self._ends[row_index] - start)
        except OSError as exc:
            raise _read_error(self.path, exc) from None
        payload = _json_line(self.path, self._lines[row_index], line)
        if payload is None:  # pragma: no cover - identity check makes this unreachable
            raise _changed(self.path)
        return payload


_cache: OrderedDict[tuple[Any, ...], SelectedDataset] = OrderedDict()


def clear_dataset_cache() -> None:
    """Forget memoised datasets (tests, or a long-lived process that edits files)."""
    _cache.clear()


def open_dataset(
    path: Path,
    *,
    limit: int | None,
    rows: str | None,
    sample: float | None,
    seed: int,
) -> SelectedDataset:
    """Read, hash and select a dataset; every selected row is validated here.

    Selection: `rows` (if given) wins over `limit`; a positive `limit` keeps the first N
    rows, otherwise all. `sample` (a fraction in (0, 1]) then keeps a `seed`-determined
    subset, in dataset order, so every xdist worker selects the same rows.
    """
    if sample is not None and (
        isinstance(sample, bool)
        or not isinstance(sample, (int, float))
        or not math.isfinite(sample)
        or not 0 < sample <= 1
    ):
        raise ConfigError(f"sample must be a fraction in (0, 1], got {sample!r}")
    if sample is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    extension = dataset_extension(path)
    ranges = _parse_row_ranges(rows) if rows is not None else None
    try:
        resolved = path.resolve()
        stat = resolved.stat()
    except OSError as exc:
        raise _read_error(path, exc) from None
    key = (
        str(resolved),
        _identity(stat),
        None if ranges is not None else (limit if limit is not None and limit > 0 else None),
        tuple(ranges) if ranges is not None else None,
        sample,
        seed if sample is not None else None,
    )
    cached = _cache.get(key)
    if cached is not None:
        _cache.move_to_end(key)
        return cached

    pick = _make_picker(ranges, limit if ranges is None else None)
    sampling = sample is not None
    try:
        if extension == "jsonl":
            scan = _scan_jsonl(path, pick, sampling)
        elif extension == "csv":
            scan = _scan_csv(path, pick, sampling)
        else:
            if ranges is not None:
                last: int | None = ranges[-1][1]
            elif limit is not None and limit > 0:
                last = limit - 1
            else:
                last = None
            scan = _scan_parquet(path, pick, last, sampling)
    except OSError as exc:
        raise _read_error(path, exc) from None

    if ranges is not None:
        _check_in_range(ranges, scan.total, str(path))
    if sample is not None:
        _keep(scan, _sample_positions(len(scan.sources), sample, seed))
    if scan.errors:
        raise DatasetError(scan.errors[min(scan.errors)])
    if not scan.sources:
        raise DatasetError(f"{path} selected no rows (it has {scan.total} rows)")

    selected = SelectedDataset(path, extension, scan)
    _cache[key] = selected
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return selected


def _keep(scan: _Scan, positions: list[int]) -> None:
    """Narrow a scan's candidates to `positions` (sorted), errors included."""
    if len(positions) == len(scan.sources):
        return
    scan.errors = {new: scan.errors[old] for new, old in enumerate(positions) if old in scan.errors}
    for name in ("sources", "lines", "starts", "ends"):
        values: array[int] = getattr(scan, name)
        if values:
            setattr(scan, name, array("q", (values[at] for at in positions)))
    if scan.values is not None:
        scan.values = [scan.values[at] for at in positions]
    if scan.table is not None:
        scan.table = scan.table.take(positions)
