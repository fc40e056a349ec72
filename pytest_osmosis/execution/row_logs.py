"""Each row's own log records, for its own report, as ``streams.py`` keeps its prints.

A row's code runs on the session's loop thread while pytest's thread runs another item
(whose handlers would take the record into that item's report and ``caplog``) or none
(between items no handler of pytest's takes records; on an xdist worker they are lost).
Which row emitted a record is decided once, in the thread that emits it
(``blame.current_row``, through :meth:`RowOutput.owner`); :class:`RowLogHandler` keeps the
row's records, formatted, under :data:`streams.LOG`, and :meth:`RowLogs.not_a_row_s` is the
filter that keeps them out of everyone else's capturing handlers. Handlers that show
records as they happen (live logs, a log file) are left alone.

A level the test pytest's thread runs set for itself (``caplog.set_level``, undone at its
teardown) is that test's, not the rows': a row's record is kept only if its logger's level
as it was before allows it (:attr:`RowLogs.lent`), so a row's report does not hang on where
pytest was when the row logged. A level raised that way still stops a row's record at its
logger: a record never made cannot be kept.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping

from pytest_osmosis.execution.streams import LOG, RowOutput

__all__ = ["RowLogHandler", "RowLogs"]


class RowLogs:
    """Whose a record is: the kept row whose code emitted it, or nobody's (None)."""

    def __init__(self, output: RowOutput) -> None:
        self.output = output
        # Every handler asks about the same record in turn, in the emitting thread: the
        # first answer is the one all get (the row may be taken in between).
        self._last = threading.local()
        #: Loggers whose level a test set for itself, by name (None or "": the root) -> the
        #: level before (pytest's caplog keeps this mapping; plugin/row_output.py lends it).
        self.lent: Mapping[str | None, int] = {}

    def owner(self, record: logging.LogRecord) -> str | None:
        """The node id of the kept row whose code emitted ``record`` (call in its thread)."""
        last = getattr(self._last, "decided", None)
        if last is not None and last[0]() is record:
            return last[1]  # type: ignore[no-any-return]
        key = self.output.owner()
        self._last.decided = (weakref.ref(record), key)
        return key

    def at_rest(self, record: logging.LogRecord) -> bool:
        """Whether ``record``'s logger allows it at the levels before any lent (as
        ``Logger.getEffectiveLevel`` walks, with each lent logger's level before)."""
        lent = self.lent
        if not lent:
            return True
        # By name, never logging.getLogger: this runs in a handler's emit, holding its lock,
        # and getLogger takes logging's module lock (dictConfig takes them the other way).
        before = {(name or logging.root.name): level for name, level in list(lent.items())}
        found = logging.root.manager.loggerDict.get(record.name, logging.root)
        logger: logging.Logger | None = found if isinstance(found, logging.Logger) else None
        logger = logger or logging.root
        while logger is not None:
            level = before.get(logger.name, logger.level)
            if level:
                return record.levelno >= level
            logger = logger.parent
        return True

    def not_a_row_s(self, record: logging.LogRecord) -> bool:
        """A handler filter: False for a record a kept row's code emitted."""
        return self.owner(record) is None


class RowLogHandler(logging.Handler):
    """Keeps each record a kept row's code emits, formatted, for that row's report.

    A record that cannot be formatted raises, as in pytest's capturing handler (a bad log
    message fails the test that logged it; here, the row).
    """

    def __init__(self, logs: RowLogs, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.logs = logs

    def emit(self, record: logging.LogRecord) -> None:
        key = self.logs.owner(record)
        if key is not None and self.logs.at_rest(record):
            # A formatting error propagates (no handleError), as pytest's handler raises it.
            self.logs.output.keep_as(key, LOG, self.format(record) + "\n")
