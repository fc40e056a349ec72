"""JSONL: one JSON object a line; a kept row is its byte span, re-parsed when it runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import weakref
from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from pytest_osmosis.core.errors import DatasetError, SessionFaultError
from pytest_osmosis.dataset.rows import json_kind, one_line
from pytest_osmosis.dataset.scan import Identity, Scan, changed, identity, read_error
from pytest_osmosis.dataset.select import Selection

# Module level so tests can shrink it and exercise lines split across reads.
_READ_CHUNK = 1 << 20
# Python's text mode (what the official reader uses) ends a line at \r\n, \r or \n.
_NEWLINE_SPLIT = re.compile(rb"(\r\n|\r|\n)")


class DatasetChangedError(DatasetError, SessionFaultError):
    """The file a run reads rows from is no longer the one it validated (replaced, edited,
    removed): a fault of the whole session, not of the row that noticed it."""


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
        raise DatasetError(f"{path}:{lineno}: invalid JSON ({one_line(exc)})") from None
    if not isinstance(payload, dict):
        raise DatasetError(
            f"{path}:{lineno}: each line must be a JSON object, got a JSON {json_kind(payload)}"
        )
    return payload


def _read_span(fd: int, start: int, size: int) -> bytes:
    """``size`` bytes at ``start`` (fewer only at the end of the file)."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class _JsonlRows:
    """Line number and byte span of each kept row; the file is re-read per row."""

    __slots__ = (
        "path",
        "identity",
        "sha256",
        "lines",
        "starts",
        "ends",
        "_fd",
        "_closer",
        "_lock",
        "__weakref__",
    )

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Opened at the first row read and kept until ``close`` (the session's end; the
        #: store itself is memoised across sessions): its rows are read with ``pread``,
        #: after a ``stat`` of the path says it is still this file.
        self._fd: int | None = None
        self._closer: weakref.finalize[Any, Any] | None = None  # closes it if never closed
        #: A read and ``close`` never overlap: a descriptor closed under a read may be
        #: another file's by the time it is read.
        self._lock = threading.Lock()
        self.identity: Identity = (0, 0, 0, 0)
        self.sha256 = ""
        self.lines = array("q")
        self.starts = array("q")
        self.ends = array("q")

    def keep(self, positions: list[int]) -> None:
        for name in ("lines", "starts", "ends"):
            values: array[int] = getattr(self, name)
            setattr(self, name, array("q", (values[at] for at in positions)))

    def raw(self, position: int) -> Mapping[str, Any]:
        start = self.starts[position]
        try:
            # The path's identity now (replaced, or written since: changed), then the span
            # read through the descriptor kept open on that same file: two system calls a
            # row (an open, fstat, pread and close each row were four).
            if identity(os.stat(self.path)) != self.identity:
                raise self._changed()
            with self._lock:
                line = _read_span(self._descriptor(), start, self.ends[position] - start)
        except OSError as exc:
            raise DatasetChangedError(
                f"{read_error(self.path, exc)} during the run; stopped, the rows not run are "
                f"left pending"
            ) from None
        payload = _json_line(self.path, self.lines[position], line)
        if payload is None:  # pragma: no cover - identity check makes this unreachable
            raise changed(self.path)
        return payload

    def _descriptor(self) -> int:
        """The kept descriptor, opened if need be (under ``_lock``)."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDONLY)
            if identity(os.fstat(fd)) != self.identity:  # replaced just now
                os.close(fd)
                raise self._changed()
            self._fd = fd
            self._closer = weakref.finalize(self, os.close, fd)
        return self._fd

    def close(self) -> None:
        """Close the kept descriptor now (a later row read opens it again)."""
        with self._lock:
            closer, self._closer, self._fd = self._closer, None, None
        if closer is not None:
            closer()  # closes it once, and never again at collection

    def _changed(self) -> DatasetChangedError:
        return DatasetChangedError(
            f"{self.path} changed after it was opened (sha256 {self.sha256[:12]}); "
            f"stopped, the rows not run are left pending"
        )


def scan_jsonl(path: Path, selection: Selection) -> Scan:
    store = _JsonlRows(path)
    scan = Scan(store, selection.sampling)
    digest = hashlib.sha256()
    total = 0
    with path.open("rb") as handle:
        scan.identity = identity(os.fstat(handle.fileno()))
        for lineno, (start, line) in enumerate(_physical_lines(handle, digest), 1):
            payload = _json_line(path, lineno, line)
            if payload is None:
                continue
            source = total
            total += 1
            if not selection.pick(source):
                continue
            scan.add(payload, source, (path, lineno))
            store.lines.append(lineno)
            store.starts.append(start)
            store.ends.append(start + len(line))
        if identity(os.fstat(handle.fileno())) != scan.identity:
            raise changed(path)
    scan.total = total
    scan.sha256 = store.sha256 = digest.hexdigest()
    store.identity = scan.identity
    return scan
