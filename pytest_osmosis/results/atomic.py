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
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Owner-only, like the SDK: trajectories and logs may carry prompts and data.
FILE_MODE = 0o600


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


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace *path* with *data* atomically and durably (mode 0600 by default)."""
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode != FILE_MODE:
                os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    fsync_dir(parent)


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
