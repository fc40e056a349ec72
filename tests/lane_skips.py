"""A green local run says what it did not cover (issue 29, point 6).

The README's test command on a fresh clone skips the tests that need the official SDK (a
Python 3.12+ with osmosis-ai) or the SDK's reference run, each with its reason; pytest's
summary shows only a count of skips. This hook (registered by conftest.py) adds one line:
how many of them there are, and what ``.ci/run`` sets to run them.
"""

from __future__ import annotations

from typing import Any

import pytest

#: What the skip reasons of those tests name (sdk_planner.SDK_MISSING, reference_paths).
LANE_WORDS = ("OSMOSIS_SDK_PYTHON", "OSMOSIS_REFERENCE_RUN", "reference run")

HOW = (
    "set OSMOSIS_SDK_PYTHON to a Python 3.12+ with osmosis-ai[eval]==0.3.8 and "
    "OSMOSIS_REFERENCE_RUN to the SDK's reference run (shared/reference-run), as .ci/run does"
)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    lane = [
        report
        for report in skipped
        if isinstance(report, pytest.TestReport)
        and any(word in _reason(report) for word in LANE_WORDS)
    ]
    if lane:
        terminalreporter.write_line(
            f"not covered: {len(lane)} tests skipped that need the official SDK or its "
            f"reference run; to run them, {HOW}"
        )
