"""Start-up milestones: a line for each phase before the first row that can take a while.

Importing the rollouts, loading ``osmosis/embedded``, checking the model and importing
LiteLLM each take from milliseconds to seconds, and pytest prints nothing of its own until
they are over. On a terminal each phase shows as it starts (``osmosis [0.41 s] checking
model openai/gpt-5-mini ...``, the time since pytest started), and its line ends with how
long it took. When a phase fails, its line is wiped: the failure's own line (exit 4) is
the only one left, as with no milestones. Where output is not a terminal (CI logs,
captured runs) nothing can be wiped, so the lines of a start-up are written together once
it has succeeded, each with its start and duration; a failed start-up stays one line.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Milestones", "since_start"]

_PLUGIN_IMPORTED = time.monotonic()


def _process_age() -> float | None:
    """Seconds since this process started (Linux's /proc), None where that is unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - started
    return age if age >= 0 else None


_STARTED: float | None = None


def since_start() -> float:
    """Seconds since pytest started: the process's age, else since this plugin was imported."""
    global _STARTED
    if _STARTED is None:
        age = _process_age()
        _STARTED = time.monotonic() - age if age is not None else _PLUGIN_IMPORTED
    return time.monotonic() - _STARTED


class Milestones:
    """Writes start-up phases through pytest's terminal reporter (nothing without one)."""

    def __init__(self, reporter: Any, *, quiet: bool = False) -> None:
        self.reporter = None if quiet else reporter
        self.live = bool(reporter is not None and getattr(reporter, "isatty", False))
        self._done: list[str] = []

    @contextlib.contextmanager
    def phase(self, doing: str) -> Iterator[None]:
        """``doing`` (e.g. ``checking model openai/gpt-5-mini``) while the block runs."""
        if self.reporter is None:
            yield
            return
        began = since_start()
        head = f"osmosis [{began:.2f} s] {doing} ..."
        if self.live:
            self.reporter.write(head, flush=True)
        try:
            yield
        except BaseException:
            if self.live:  # the failure's own line is the one left on screen
                self.reporter.write("\r" + " " * len(head) + "\r", flush=True)
            self._done.clear()
            raise
        took = f" {since_start() - began:.2f} s"
        if self.live:
            self.reporter.write(took + "\n", flush=True)
        else:
            self._done.append(head + took)

    def finish(self) -> None:
        """Start-up succeeded: where lines were not live, write them now."""
        done, self._done = self._done, []
        if self.reporter is not None:
            for line in done:
                self.reporter.write_line(line)
