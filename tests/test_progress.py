"""Live progress: a line per finished row in logs, a throttled status line on a terminal."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_osmosis.progress import Progress


class FakeWriter:
    def __init__(self, markup: bool) -> None:
        self.hasmarkup = markup
        self.width_of_current_line = 0

    def line(self) -> None:
        pass


class FakeReporter:
    def __init__(self, markup: bool) -> None:
        self._tw = FakeWriter(markup)
        self.currentfspath = None
        self.lines: list[str] = []

    def write_line(self, text: str, **markup: Any) -> None:
        self.lines.append(text)


RESULTS = [
    {
        "status": "success",
        "reward": 1.0,
        "passed": True,
        "tokens": 10,
        "source_row_index": 0,
        "run_index": 0,
    },
    {
        "status": "success",
        "reward": 0.0,
        "passed": False,
        "tokens": 10,
        "source_row_index": 1,
        "run_index": 0,
    },
    {
        "status": "failed",
        "error_type": "agent_error",
        "passed": False,
        "source_row_index": 2,
        "run_index": 0,
    },
    {"status": "skipped", "passed": False, "tokens": 5, "source_row_index": 3, "run_index": 0},
]


def test_every_row_gets_a_line_when_output_is_not_a_terminal() -> None:
    reporter = FakeReporter(markup=False)
    progress = Progress(reporter, total=4)
    for result in RESULTS:
        progress.add(result)
    assert len(reporter.lines) == 4
    assert reporter.lines[0].startswith("osmosis: row 0 run 0 passed (reward 1.0)  [1/4 attempts")
    assert reporter.lines[1].startswith("osmosis: row 1 run 0 below threshold (reward 0.0)")
    assert reporter.lines[2].startswith("osmosis: row 2 run 0 errored (agent_error)")
    assert (
        "[3/4 attempts done: 1 passed, 1 below threshold, 1 errored, 0 skipped; "
        "pass rate 33.3%; 20 tokens;" in reporter.lines[2]
    )
    assert reporter.lines[3].startswith("osmosis: row 3 run 0 skipped  [4/4 attempts done")
    assert "ETA" in reporter.lines[2] and "ETA" not in reporter.lines[3]


def test_a_terminal_gets_a_status_line_at_most_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("pytest_osmosis.progress.time.monotonic", lambda: clock[0])
    reporter = FakeReporter(markup=True)
    progress = Progress(reporter, total=10, every_s=5.0)
    for step, result in enumerate(RESULTS * 2):
        clock[0] = 100.0 + 2.0 * (step + 1)
        progress.add(result)
    # At 102..116 s: lines when at least 5 s passed since the last one (106, 112).
    assert len(reporter.lines) == 2
    assert reporter.lines[0].startswith("osmosis: 3/10 attempts done: 1 passed,")
