"""CSV: a header row, then one row a line; a kept row is the tuple of its contract cells."""

from __future__ import annotations

import csv
import io
import re
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.rows import CONTRACT_COLUMNS, one_line
from pytest_osmosis.dataset.scan import Scan, read_all
from pytest_osmosis.dataset.select import Selection

_CSV_FIELD_SIZE_LIMIT = 16 * 1024 * 1024
_NEWLINE = re.compile(rb"\r\n|\r|\n")


class _CsvRows:
    """The contract columns present (`names`), one tuple of their cells and the line where
    it starts per kept row."""

    __slots__ = ("names", "values", "lines")

    def __init__(self) -> None:
        self.names: tuple[str, ...] = ()
        self.values: list[tuple[Any, ...]] = []
        self.lines = array("q")

    def keep(self, positions: list[int]) -> None:
        self.values = [self.values[at] for at in positions]
        self.lines = array("q", (self.lines[at] for at in positions))

    def raw(self, position: int) -> Mapping[str, Any]:
        return dict(zip(self.names, self.values[position], strict=True))


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


def scan_csv(path: Path, selection: Selection) -> Scan:
    store = _CsvRows()
    scan = Scan(store, selection.sampling)
    data, scan.sha256, scan.identity = read_all(path)
    nul = _nul_error(path, data)
    if nul is not None:
        raise nul
    previous_limit = csv.field_size_limit(_CSV_FIELD_SIZE_LIMIT)
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="")
    reader = csv.reader(text)
    try:
        header = next(reader, None)
        if header is None:
            raise DatasetError(f"{path}: the CSV file is empty; it needs a header row")
        if not header:
            raise DatasetError(f"{path}: line 1 must be the CSV header row, but it is empty")
        if header[0].startswith("\ufeff") and header[0][1:] in CONTRACT_COLUMNS:
            raise DatasetError(
                f"{path}: starts with a UTF-8 byte-order mark, so its first column is not "
                f"{header[0][1:]!r}; save it as UTF-8 without BOM"
            )
        # Like csv.DictReader: the last column of a repeated name wins; missing cells are None.
        position = {name: at for at, name in enumerate(header)}
        columns = [(name, position[name]) for name in CONTRACT_COLUMNS if name in position]
        store.names = tuple(name for name, _ in columns)
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
            if not selection.pick(source):
                continue
            width = len(record)
            raw = {name: (record[at] if at < width else None) for name, at in columns}
            scan.add(raw, source, (path, line))
            store.values.append(tuple(raw.values()))
            store.lines.append(line)
        scan.total = total
    except csv.Error as exc:
        raise DatasetError(f"{path}:{reader.line_num}: invalid CSV ({one_line(exc)})") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}:{_utf8_error(data)}") from None
    finally:
        csv.field_size_limit(previous_limit)
    return scan
