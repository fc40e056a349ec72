"""Live progress on the controller's terminal: rows done, pass rate, failures, tokens, ETA.

On a terminal a status line is written at most every few seconds; when output is not a
terminal (CI logs) every finished row gets a line, so a long run is never silent.
"""

from __future__ import annotations

import time
from typing import Any


class Progress:
    """Counts results as the controller journals them and reports them to the terminal."""

    def __init__(self, reporter: Any, total: int, *, every_s: float = 5.0) -> None:
        self.reporter = reporter
        self.total = total
        self.every_s = every_s
        self.started = time.monotonic()
        self.done = self.passed = self.scored = self.failed = self.tokens = 0
        self._last = self.started
        self._tty = bool(getattr(getattr(reporter, "_tw", None), "hasmarkup", False))

    def add(self, result: dict[str, Any]) -> None:
        self.done += 1
        self.tokens += int(result.get("tokens") or 0)
        status = result.get("status")
        if status != "skipped":
            self.scored += 1
        if result.get("passed"):
            self.passed += 1
        if status == "failed":
            self.failed += 1
        now = time.monotonic()
        if self._tty:
            if now - self._last >= self.every_s and self.done < self.total:
                self._last = now
                self._write(f"osmosis: {self.line(now)}", cyan=True)
            return
        if status == "success":
            outcome = f"reward {result.get('reward')}"
        elif status == "failed":
            outcome = f"failed ({result.get('error_type')})"
        else:
            outcome = str(status)
        self._write(
            f"osmosis: row {result.get('source_row_index')} run {result.get('run_index')} "
            f"{outcome}  [{self.line(now)}]"
        )

    def _write(self, text: str, **markup: bool) -> None:
        """Our own line, never glued to the letters pytest prints for each item."""
        writer: Any = getattr(self.reporter, "_tw", None)
        pending_letters = bool(getattr(writer, "width_of_current_line", 0))
        if pending_letters and not getattr(self.reporter, "currentfspath", None):
            writer.line()  # write_line only ends the line itself after a file name
        self.reporter.write_line(text, **markup)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        rate = f"{self.passed / self.scored:.1%}" if self.scored else "-"
        eta = ""
        if 0 < self.done < self.total:
            eta = f", ETA {_duration(elapsed / self.done * (self.total - self.done))}"
        return (
            f"{self.done}/{self.total} rows done, pass rate {rate}, {self.failed} failed, "
            f"{self.tokens} tokens, {_duration(elapsed)} elapsed{eta}"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
