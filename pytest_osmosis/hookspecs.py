"""Hooks pytest-osmosis offers to conftest files and other plugins."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_osmosis_gate(
    config: pytest.Config, metrics: list[dict[str, Any]], verdict: dict[str, Any]
) -> bool | None:
    """Decide whether the session passes (controller or single process, at session end).

    ``metrics`` holds each run's ``metrics.json``; ``verdict`` is the built-in gate's
    decision (``{"passed": bool, "reasons": [...]}``, and ``"regressions"``: the rows worse
    than in the ``--osmosis-baseline`` run, when one is compared). Return True or False to
    override it, None to keep it. Called only when a gate option is set.
    """


def pytest_osmosis_row_result(config: pytest.Config, result: dict[str, Any]) -> None:
    """A work item's result was journalled (controller or single process).

    ``result`` is the dict of builtins that travelled on the test report.
    """
