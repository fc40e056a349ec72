"""pytest-rerunfailures and eval items: ``--reruns`` runs again only infrastructure errors.

A row whose reward is too low, or whose rollout raised, would say the same when run
again, and pay for its model calls twice; a timeout, a provider's 5xx or a dead worker
may not (``outcome.is_infrastructure``). pytest-rerunfailures decides what it re-runs
from the exception a phase raised: every outcome of an eval item that is not an
infrastructure error is raised as its own type (collect.py), and those types are added
to its ``rerun_except`` list (its public option, which it matches against
``"<type name>: <message>"``), so nothing else needs its internals. A re-run is a new
execution of the same (row, attempt); only the report of the last one is journalled.
"""

from __future__ import annotations

from typing import Any

import pytest


def never_rerun() -> tuple[str, ...]:
    """``rerun_except`` patterns: the eval outcomes that are never run again (what an item
    raises for them, ``collect.RAISED_FOR``; an infrastructure error is re-run)."""
    from pytest_osmosis.plugin.collect import RAISED_FOR

    return tuple(f"^{failure.__name__}: " for failure in RAISED_FOR.values())


def add_rerun_except(config: pytest.Config) -> None:
    """Extend pytest-rerunfailures' ``rerun_except`` (command line, else its ini) with ours.

    Only our own exception types match, so the user's other tests are run again as
    they asked; the ini list is kept, since the option, once set, hides it.
    """
    given = getattr(config.option, "rerun_except", None)
    if given is None:
        given = list(config.getini("rerun_except") or [])
    config.option.rerun_except = [*given, *never_rerun()]


def is_rerun(report: Any) -> bool:
    """A report pytest-rerunfailures logs for an execution it runs again (not the last)."""
    return getattr(report, "outcome", None) == "rerun"
