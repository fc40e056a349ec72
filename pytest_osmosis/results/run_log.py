"""``logs.txt``: the run log, with secret values redacted from every line.

Format (contract §7.8): ``<UTC ISO µs>Z <LEVEL> [<step>] <message>[ <json details>]``,
the shape ``osmosis eval download`` produces for cloud runs, so local and
downloaded runs read the same. Lines are single ``O_APPEND`` writes, so several
processes (xdist workers) may append to one log without interleaving.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atomic import FILE_MODE, utc_now, write_all
from pytest_osmosis.results.redact import Redactor


class RunLog:
    """Appends redacted lines to ``logs.txt`` (mode 0600, created if absent)."""

    def __init__(self, path: Path, redactor: Redactor | None = None) -> None:
        self.path = path
        self.redactor = redactor if redactor is not None else Redactor()
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._lock = threading.Lock()
        #: Its size when opened, None if this made it (take_back goes back to that).
        self.opened_size = os.fstat(self._fd).st_size if existed else None

    @staticmethod
    def format_line(level: str, step: str, message: str, details: Mapping[str, Any]) -> str:
        """One log line, without redaction or newline."""
        line = f"{utc_now()} {level.upper()} [{step}] {message}"
        if details:
            encoded = json.dumps(
                dict(details),
                ensure_ascii=False,
                sort_keys=True,
                separators=(",", ":"),
                default=str,
            )
            line = f"{line} {encoded}"
        return line

    def write(self, level: str, step: str, message: str, **details: Any) -> str:
        """Append one line; returns it as written (redacted, without the newline).

        Embedded newlines are escaped so one call is always one line.
        """
        line = self.format_line(level, step, message, details)
        line = self.redactor.redact(line).replace("\r", "\\r").replace("\n", "\\n")
        data = (line + "\n").encode("utf-8", errors="replace")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            write_all(self._fd, data)
        return line

    def info(self, step: str, message: str, **details: Any) -> str:
        return self.write("info", step, message, **details)

    def warning(self, step: str, message: str, **details: Any) -> str:
        return self.write("warning", step, message, **details)

    def error(self, step: str, message: str, **details: Any) -> str:
        return self.write("error", step, message, **details)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def take_back(self) -> None:
        """Close, leaving the file as it was when opened: a session that lets a resumed run
        go (EvalSession.let_go) leaves nothing of its own in it."""
        self.close()
        with contextlib.suppress(OSError):
            if self.opened_size is None:
                os.unlink(self.path)
            else:
                os.truncate(self.path, self.opened_size)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
