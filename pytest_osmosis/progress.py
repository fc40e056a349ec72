"""Live progress on the controller's terminal: attempts done, outcomes, pass rate, tokens, ETA.

On a terminal a status line is written at most every few seconds; when output is not a
terminal (CI logs) every finished attempt gets a line, so a long run is never silent.

The basis is the results table's (``metrics.json``): attempts recorded by earlier sessions
of a resumed run count as done, with their outcomes and tokens, so the pass rate shown
while running ends where the summary's is. The total is those plus the attempts this
session selected to run (deselected items are not in it); the ETA comes from this
session's own pace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pytest_osmosis.outcome import FAILED, OUTCOMES, PASSED, SKIPPED, classify
from pytest_osmosis.words import ATTEMPTS, OUTCOME_WORDS, outcomes_text


class Progress:
    """Counts results as the controller journals them and reports them to the terminal."""

    def __init__(
        self,
        reporter: Any,
        total: int,
        *,
        recorded: Mapping[str, int] | None = None,
        recorded_tokens: int = 0,
        every_s: float = 5.0,
    ) -> None:
        self.reporter = reporter
        self.total = total
        self.every_s = every_s
        self.started = time.monotonic()
        self.counts = {key: int((recorded or {}).get(key, 0)) for key in OUTCOMES}
        self.recorded = sum(self.counts.values())
        self.done = self.recorded
        self.executed = 0
        self.tokens = recorded_tokens
        self._last = self.started
        self._tty = bool(getattr(getattr(reporter, "_tw", None), "hasmarkup", False))

    def add(self, result: dict[str, Any]) -> None:
        self.done += 1
        self.executed += 1
        self.tokens += int(result.get("tokens") or 0)
        outcome = classify(result, float(result.get("pass_threshold", 1.0)))
        self.counts[outcome] += 1
        now = time.monotonic()
        if self._tty:
            if now - self._last >= self.every_s and self.done < self.total:
                self._last = now
                self._write(f"osmosis: {self.line(now)}", cyan=True)
            return
        if outcome == FAILED:
            why = f" ({result.get('error_type')})"
        elif outcome == SKIPPED:
            why = ""
        else:
            why = f" (reward {result.get('reward')})"
        self._write(
            f"osmosis: row {result.get('source_row_index')} run {result.get('run_index')} "
            f"{OUTCOME_WORDS[outcome]}{why}  [{self.line(now)}]"
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
        counted = self.done - self.counts[SKIPPED]
        rate = f"{self.counts[PASSED] / counted:.1%}" if counted else "-"
        eta = ""
        if self.executed and self.done < self.total:
            eta = f", ETA {_duration(elapsed / self.executed * (self.total - self.done))}"
        earlier = f" ({self.recorded} recorded earlier)" if self.recorded else ""
        return (
            f"{self.done}/{self.total} {ATTEMPTS} done{earlier}: {outcomes_text(self.counts)}; "
            f"pass rate {rate}; {self.tokens} tokens; {_duration(elapsed)} elapsed{eta}"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
