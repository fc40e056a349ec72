"""Hooks pytest-osmosis offers to conftest files and other plugins."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_osmosis.gate import GateRun, Verdict


@pytest.hookspec
def pytest_osmosis_gate_verdict(config: pytest.Config, runs: Sequence[GateRun]) -> Verdict | None:
    """A gate rule: its verdict on the session's finished runs (controller or single process,
    at session end, unless the session was interrupted or broke).

    Return a ``pytest_osmosis.gate.Verdict``, or None to have no say. Every implementation
    is called (not firstresult), the built-in rules first (``gate.BuiltinGate``, no say
    without a gate option): the session passes only when every verdict does, so a project's
    rule adds to the built-in gate and cannot switch it off by answering first. When no
    rule has a say, pytest's own semantics hold (any failed row fails the session).
    """


@pytest.hookspec(firstresult=True)
def pytest_osmosis_gate(
    config: pytest.Config, metrics: list[dict[str, Any]], verdict: dict[str, Any]
) -> bool | None:
    """Decide whether the session passes (controller or single process, at session end).

    ``metrics`` holds each run's ``metrics.json``; ``verdict`` is the built-in gate's
    decision (``{"passed": bool, "reasons": [...]}``, and ``"regressions"``: the rows worse
    than in the ``--osmosis-baseline`` run, when one is compared). Return True or False to
    override it, None to keep it. Called only when a rule had a say
    (``pytest_osmosis_gate_verdict``); a new rule is better written as one of those.
    """


def pytest_osmosis_row_result(config: pytest.Config, result: dict[str, Any]) -> None:
    """A work item's result was journalled (controller or single process).

    ``result`` is the dict of builtins that travelled on the test report.
    """
