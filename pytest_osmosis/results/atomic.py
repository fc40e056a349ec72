"""Durable file writes and the canonical JSON forms the run directory uses.

Every snapshot in the run directory may be read while a run is live (and by
``osmosis eval upload`` afterwards), so a reader must only ever see a complete
old or a complete new file, also across a crash: temp file in the destination
directory, fsync, ``os.replace``, fsync of the directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import re
import signal
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_osmosis.results import stdjson as json

#: Owner-only, like the SDK: trajectories and logs may carry prompts and data.
FILE_MODE = 0o600


#: Whether the main thread is inside :func:`interrupt_held` (only it ever sets this).
_holding = False


@contextlib.contextmanager
def interrupt_held() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT, or SIGTERM: plugin/terminate.py) that arrives inside the block
    until the block has ended.

    For a pair of writes that must both happen or neither: a result in the journal but
    not in the run's records leaves the index one row short. Only the main thread
    receives signals; elsewhere this does nothing, as it does inside a block that holds
    them already (recording a row nests two: two handler swaps a row cost 5% of a run).
    """
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:
        yield  # a handler not installed from Python, which we cannot put back
        return
    held: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    _holding = True
    try:
        yield
    finally:
        _holding = False
        signal.signal(signal.SIGINT, previous)
        if held:
            signum, frame = held[0]
            if callable(previous):
                previous(signal.SIGINT, frame)
            else:  # SIGTERM with SIGINT ignored: its own handler makes it a KeyboardInterrupt
                signal.raise_signal(signum)


def fsync_dir(directory: Path) -> None:
    """Persist a directory entry so a rename or a create survives a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - filesystem dependent
        # Some filesystems refuse fsync on a directory; the rename itself is still
        # atomic, so this only weakens durability.
        if exc.errno not in (errno.EINVAL, errno.EACCES, errno.EBADF):
            raise
    finally:
        os.close(fd)


_TMP_COUNTER = itertools.count()


#: ``.<name>.<writer pid>.<n>.tmp``: what :func:`_open_temp` creates.
_TEMP_NAME = re.compile(r"\A\..+\.(?P<pid>[1-9][0-9]*)\.[0-9]+\.tmp\Z", re.DOTALL)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _blocks(pieces: Iterable[bytes], size: int = 1 << 18) -> Iterator[bytes]:
    """*pieces* joined into blocks of about *size* bytes (one write each)."""
    block: list[bytes] = []
    held = 0
    for piece in pieces:
        block.append(piece)
        held += len(piece)
        if held >= size:
            yield b"".join(block)
            block, held = [], 0
    if block:
        yield b"".join(block)


def _temp_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{next(_TMP_COUNTER)}.tmp"


def _process_is_alive(pid: int) -> bool:
    """Whether *pid* names a running process (one of another user's counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid at all)
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temp files of dead writers directly in *directory*; returns them.

    A writer killed between creating its temp file and the rename leaves it behind
    forever. One whose pid still runs may be writing it now, so it is kept (a pid
    reused since only keeps a stale file, never deletes a live one).
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name) if entry.name.endswith(".tmp") else None
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        if _process_is_alive(int(match["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _open_temp(directory: str, name: str, mode: int) -> tuple[int, str]:
    """Create a unique temp file next to the destination (O_EXCL, never reused)."""
    while True:
        tmp = os.path.join(directory, _temp_name(name))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), tmp
        except FileExistsError:
            continue


#: A file as the run directory tells versions apart: inode, size, mtime and ctime (ns).
Signature = tuple[int, int, int, int]


def signature_of(st: os.stat_result) -> Signature:
    """The :data:`Signature` of a ``stat`` result."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def atomic_write_bytes(
    path: str | Path,
    data: bytes | Iterable[bytes],
    *,
    mode: int = FILE_MODE,
    durable: bool = True,
    identify: bool = False,
) -> Signature | None:
    """Replace *path* with *data* atomically (mode 0600 by default).

    *data* may be pieces (an index's lines): written in blocks of 256 KB, so a
    100,000-line file is never held whole a second time (~20 MB at the session's end).

    ``durable`` adds the fsyncs that make the new content survive a power loss;
    files that are rebuilt from the journal anyway (projections, trajectories)
    skip them, since two fsyncs per file would dominate a fast run's cost.
    ``identify`` returns the file's signature as the rename left it (the rename changes
    its ctime), or None when the path no longer shows the file written (replaced or
    changed at once).
    """
    directory, name = os.path.split(os.fspath(path))
    directory = directory or "."
    try:
        fd, tmp = _open_temp(directory, name, mode)
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = _open_temp(directory, name, mode)
    written: os.stat_result | None = None
    try:
        try:
            if mode != FILE_MODE:
                os.fchmod(fd, mode)  # the umask may have narrowed a wider mode
            if isinstance(data, bytes):
                write_all(fd, data)
            else:
                for block in _blocks(data):
                    write_all(fd, block)
            if durable:
                os.fsync(fd)
            written = os.fstat(fd) if identify else None
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(Path(directory))
    return None if written is None else _as_written(path, written)


def _as_written(path: str | Path, written: os.stat_result) -> Signature | None:
    """*path*'s signature if it is still the file *written* (fstat'ed before the rename)."""
    try:
        now = os.stat(path)
    except OSError:
        return None
    same = (now.st_ino, now.st_size, now.st_mtime_ns)
    return (
        signature_of(now)
        if same == (written.st_ino, written.st_size, written.st_mtime_ns)
        else None
    )


def pretty_json(payload: Any) -> str:
    """The SDK's snapshot form (manifest, progress, metrics): indent 2 plus a newline."""
    return json.dumps(payload, ensure_ascii=False, indent=2, allow_nan=False) + "\n"


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write *payload* in the snapshot form, atomically."""
    atomic_write_bytes(path, pretty_json(payload).encode("utf-8"))


def canonical_json(payload: Any) -> str:
    """Sorted keys, no incidental whitespace: the journal and digest form."""
    return json.dumps(
        payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
    )


def digest_of(payload: Any) -> str:
    """SHA-256 hex of the canonical JSON of *payload*."""
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def format_utc(moment: datetime) -> str:
    """``2026-11-29T07:45:05.670675Z``: the SDK's timestamp form (UTC, microseconds)."""
    # A naive datetime is local time, as everywhere in Python.
    utc = moment.astimezone(timezone.utc)
    return utc.isoformat(timespec="microseconds").replace("+00:00", "Z")


def utc_now() -> str:
    """The current time in :func:`format_utc` form."""
    return format_utc(datetime.now(timezone.utc))
