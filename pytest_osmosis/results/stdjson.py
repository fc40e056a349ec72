"""The JSON functions the run directory is written and read with: the standard library's, as
the plugin found them before any rollout was imported.

A rollout may replace ``json.dumps`` process-wide (an orjson shim, a test helper's
monkeypatch); every run's journal and ``metrics.json`` then took that replacement's output,
unchecked. Modules here import this one as ``json``.
"""

from __future__ import annotations

from json import JSONDecodeError

from pytest_osmosis import _JSON_AT_START

__all__ = ["JSONDecodeError", "dumps", "loads"]

dumps, loads = _JSON_AT_START
