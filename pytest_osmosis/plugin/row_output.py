"""Each row's own output in its own report, whenever the row printed it.

Rows run ahead on the session's loop thread while pytest's thread runs other items (whose
capture would take what the row prints) or none (between items, capture is suspended: a
single process's terminal gets it, an xdist worker's stdout loses it). So every stream
pytest's capture swaps into ``sys.stdout`` and ``sys.stderr`` is routed (execution/streams.py:
its ``write`` keeps a row's writes under the row's node id);
the item's setup, where the row is waited for, adds them as pytest's own ``Captured stdout
setup`` section, which the terminal, ``-rA``, xdist, JUnit and pytest-html show as any
test's output. With capture off (``-s``) nothing is routed: rows print as they go.

A row's ``logging`` records are its own the same way (execution/row_logs.py): kept out of
the handlers pytest's logging plugin captures an item's records with (its report's and
``caplog``'s), kept for the row at ``--log-level`` in the plugin's format, and shown as
``Captured log setup``, also under ``-s``. Live logs and ``--log-file`` still get them as
they happen; without the logging plugin (``-p no:logging``) nothing changes. A level a test
sets with ``caplog.set_level`` is lent to that test alone (:class:`CaplogLevels`): rows
running meanwhile keep their records at the levels before.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import pytest

from pytest_osmosis.execution.row_logs import RowLogHandler, RowLogs
from pytest_osmosis.execution.streams import STREAMS, RowOutput, unroute


class RowCapture:
    """One process's routing of rows' output: installed while its rows may run."""

    def __init__(self) -> None:
        self.output = RowOutput()
        self._routed: list[tuple[object, str, Any, Any]] = []  # owner, field, before, after
        self._undo: list[Callable[[], object]] = []  # what undoes the routing of records
        self._installed = False

    def install(self, config: pytest.Config) -> None:
        """Route the streams of pytest's global capture (before any row starts).

        pytest puts its capture's ``tmpfile`` in ``sys.stdout`` for each item phase and its
        saved stream (``_old``) back between them; both are routed. Undone by
        :meth:`uninstall`, at the latest among the config's cleanups (before pytest's
        capture ends: it registered its own first, so it runs last).
        """
        if self._installed:
            return
        self._installed = True
        config.add_cleanup(self.uninstall)
        capman = config.pluginmanager.getplugin("capturemanager")
        multi = getattr(capman, "_global_capturing", None)
        tee = config.getoption("capture", None) == "tee-sys"
        for name, attr in zip(STREAMS, ("out", "err"), strict=True):
            capture = getattr(multi, attr, None)  # None with capture off (-s)
            syscapture = getattr(capture, "syscapture", capture)  # fd capture's, or itself
            if syscapture is None:
                continue
            old = getattr(syscapture, "_old", None)
            live = old.write if tee and old is not None else None  # before it is routed
            for field in ("_old", "tmpfile"):
                stream = getattr(syscapture, field, None)
                if stream is None:
                    continue
                routed = self.output.route(name, stream, tee=live)
                self._routed.append((syscapture, field, stream, routed))
                if routed is not stream:
                    setattr(syscapture, field, routed)
                    if getattr(sys, name, None) is stream:
                        setattr(sys, name, routed)
        self._install_logs(config)

    def _install_logs(self, config: pytest.Config) -> None:
        """Keep rows' records out of pytest's capturing handlers, and for the rows; live
        logs print a row's records as they happen (not into the row's stdout)."""
        plugin = config.pluginmanager.get_plugin("logging-plugin")  # None: -p no:logging
        capturing = [
            handler
            for name in ("report_handler", "caplog_handler")
            if isinstance(handler := getattr(plugin, name, None), logging.Handler)
        ]
        if plugin is None or len(capturing) < 2:
            return
        logs = RowLogs(self.output)
        level = getattr(plugin, "log_level", None)  # --log-level; None: as the loggers allow
        ours = RowLogHandler(logs, logging.NOTSET if level is None else level)
        ours.setFormatter(getattr(plugin, "formatter", None) or capturing[0].formatter)
        for handler in capturing:
            handler.addFilter(logs.not_a_row_s)
            self._undo.append(functools.partial(handler.removeFilter, logs.not_a_row_s))
        root = logging.getLogger()
        root.addHandler(ours)
        self._undo.append(functools.partial(root.removeHandler, ours))
        lending = CaplogLevels(logs)
        config.pluginmanager.register(lending, "osmosis-caplog-levels")
        self._undo.append(functools.partial(config.pluginmanager.unregister, lending))
        live = getattr(plugin, "log_cli_handler", None)
        if isinstance(live, logging.Handler) and "handle" not in vars(live):
            handle = live.handle

            def handle_live(record: logging.LogRecord) -> bool:
                with self.output.passing_through():
                    return handle(record)

            live.handle = handle_live  # type: ignore[method-assign]
            self._undo.append(functools.partial(delattr, live, "handle"))

    def uninstall(self) -> None:
        """Give pytest's capture its own streams back (idempotent)."""
        for owner, field, stream, routed in reversed(self._routed):
            unroute(routed)
            if routed is not stream:
                if getattr(owner, field, None) is routed:
                    setattr(owner, field, stream)
                for name in STREAMS:
                    if getattr(sys, name, None) is routed:
                        setattr(sys, name, stream)
        self._routed.clear()
        while self._undo:
            self._undo.pop()()
        self.output.clear()
        self._installed = False

    def open(self, nodeid: str) -> None:
        """The row ``nodeid`` starts: what its code writes or logs from now on is its own."""
        if self._routed or self._undo:
            self.output.open(nodeid)

    def take(self, nodeid: str) -> dict[str, str]:
        """What row ``nodeid`` wrote, by stream, and logged, for its item's report; the
        row's code is no longer routed (a task it left running prints as any other code)."""
        return self.output.take(nodeid)


class CaplogLevels:
    """Hooks that tell the rows' records which logger levels the running test set for itself.

    ``caplog.set_level`` changes process-wide loggers until that test's teardown, while
    rows run ahead on the loop thread: which of a row's records its report showed hung on
    which test pytest's thread was in. pytest's ``LogCaptureFixture`` notes each logger's
    level before it set one (``_initial_logger_levels``, a dict since pytest 3.5, filled as
    the test calls ``set_level``); that live mapping is lent to :class:`RowLogs` while the
    fixture is up. A pytest without it lends nothing, and rows log as before.
    """

    def __init__(self, logs: RowLogs) -> None:
        self.logs = logs

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Any:
        yield
        if fixturedef.argname != "caplog" or not fixturedef.cached_result:
            return
        levels = getattr(fixturedef.cached_result[0], "_initial_logger_levels", None)
        if isinstance(levels, dict):
            self.logs.lent = levels

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        if fixturedef.argname == "caplog":
            self.logs.lent = {}  # its levels are back (caplog's teardown restored them)
