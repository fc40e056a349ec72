"""The process's standard streams: kept open whatever a rollout does with them, and each
row's own output kept for that row.

Rollout code shares ``sys.stdout`` and ``sys.stderr`` with pytest (its capture, its terminal
reporter). A helper that closes one, thinking it owns it, made every later setup and report
fail with "I/O operation on closed file": 2,730 lines of errors and rows not recorded. Each
stream a row can reach gets a ``close`` that flushes instead (an attribute of that object
alone: nothing else in the process changes, and printing still works).

Rows run ahead on the session's loop thread, so what a row prints cannot be left to
pytest's capture: that belongs to whichever item pytest's thread is running then, or is
suspended between items (an xdist worker's own stdout then goes nowhere). A
stream :meth:`RowOutput.route` was given keeps what a row's code writes under the row's
node id, for the row's own report; everything else passes through.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pytest_osmosis.execution.blame import current_row

__all__ = [
    "LOG",
    "STREAMS",
    "RoutedStream",
    "RowOutput",
    "keep_streams_open",
    "let_streams_close",
    "unroute",
]

STREAMS = ("stdout", "stderr")
#: What a row's log records are kept under (``execution/row_logs.py``): pytest's section name.
LOG = "log"

#: The streams given a flushing ``close``, to give them their own back at session end.
_KEPT: list[Any] = []


def keep_streams_open() -> None:
    """Make ``close()`` a flush on the current standard streams and the process's own.

    Called as each row starts: pytest swaps its capture streams in and out between items,
    so the streams a row can reach are the ones current then (cheap when already done).
    """
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        _keep_open(stream)


def _keep_open(stream: Any) -> None:
    if stream is None:
        return
    try:
        if "close" in vars(stream):
            return
        stream.close = stream.flush
    except (TypeError, AttributeError):  # a stream type without instance attributes
        return
    _KEPT.append(stream)


def let_streams_close() -> None:
    """The session is over (no row runs any more): each stream closes as it did before."""
    while _KEPT:
        stream = _KEPT.pop()
        try:
            if vars(stream).get("close") == stream.flush:
                del stream.close
        except (TypeError, AttributeError):
            pass


class RowOutput:
    """What each row's code wrote to each standard stream, from its start to its report.

    A row is kept from :meth:`open` (as it starts) until :meth:`take` (its report): what
    its code writes after that (a task it left running) is no longer its own and passes
    through. ``which`` names the row whose code is writing (``blame.current_row``).
    """

    def __init__(self, which: Callable[[], str | None] = current_row) -> None:
        self._which = which
        self._rows: dict[str, dict[str, list[str]]] = {}
        # A thread the row started may write while its report takes the text: a line
        # appended after the join would show nowhere.
        self._lock = threading.Lock()
        self._through = threading.local()  # .on: this thread's writes are no row's now

    def open(self, key: str) -> None:
        """``key``'s row starts (again: a re-run keeps only its own output)."""
        self._rows[key] = {}

    def owner(self) -> str | None:
        """The kept row whose code is running in this thread now, if any."""
        key = self._which()
        return key if key is not None and key in self._rows else None

    @contextlib.contextmanager
    def passing_through(self) -> Iterator[None]:
        """What this thread writes meanwhile is shown where it goes, as it happens, not
        kept for a row (pytest's live logs, printing a row's record to the terminal)."""
        before = getattr(self._through, "on", False)
        self._through.on = True
        try:
            yield
        finally:
            self._through.on = before

    def keep(self, name: str, text: str) -> bool:
        """Keep ``text`` written to stream ``name`` if a kept row's code wrote it."""
        key = self._which()
        if key is None or getattr(self._through, "on", False):
            return False
        if not isinstance(text, str):  # what a text stream says
            if key in self._rows:
                raise TypeError(f"write() argument must be str, not {type(text).__name__}")
            return False
        return self.keep_as(key, name, text)

    def keep_as(self, key: str, name: str, text: str) -> bool:
        """Keep ``text`` under ``name`` for row ``key``, if that row is still kept."""
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                return False
            row.setdefault(name, []).append(text)
        return True

    def take(self, key: str) -> dict[str, str]:
        """``key``'s output by stream, then its log records as text (only what it has);
        no longer kept."""
        with self._lock:
            row = self._rows.pop(key, None)
        if not row:
            return {}
        joined = {name: "".join(row.get(name, ())) for name in (*STREAMS, LOG)}
        joined[LOG] = joined[LOG].strip()  # as pytest shows a phase's records
        return {name: text for name, text in joined.items() if text}

    def clear(self) -> None:
        """Forget every row's output (the session is over)."""
        self._rows.clear()

    def route(self, name: str, stream: Any, tee: Callable[[str], Any] | None = None) -> Any:
        """``stream`` (standard stream ``name``) with a kept row's writes going to the row.

        Its ``write`` and ``writelines`` are replaced on the object itself, so whoever holds
        it or checks its type (pytest's capture does) is unaffected; what is returned is
        ``stream``, or a :class:`RoutedStream` around one that takes no attributes
        (``__slots__``). With ``tee`` (pytest's ``--capture=tee-sys``: the terminal's own write) a
        row's writes are also written there as they happen. :func:`unroute` undoes it.
        """
        known = _ROUTED.get(id(stream))
        if known is not None and known[0] is stream:
            return stream  # routed already
        write = stream.write

        def routed(text: str) -> int:
            if not self.keep(name, text):
                return int(write(text))
            if tee is not None:
                tee(text)
            return len(text)

        def routed_lines(lines: Iterable[str]) -> None:
            for line in lines:
                routed(line)

        try:
            own = vars(stream)  # TypeError: it takes no attributes (``__slots__``)
            before = {key: own[key] for key in ("write", "writelines") if key in own}
            stream.write, stream.writelines = routed, routed_lines
        except (TypeError, AttributeError):
            return RoutedStream(stream, routed, routed_lines)
        _ROUTED[id(stream)] = (stream, before)
        return stream


#: Streams whose writes :meth:`RowOutput.route` replaced: id -> (stream, its own before).
_ROUTED: dict[int, tuple[Any, dict[str, Any]]] = {}


def unroute(stream: Any) -> Any:
    """The stream :meth:`RowOutput.route` was given for ``stream``, writing as before."""
    if isinstance(stream, RoutedStream):
        return stream.target
    routed = _ROUTED.pop(id(stream), None)
    if routed is not None and routed[0] is stream:
        for key in ("write", "writelines"):
            try:
                if key in routed[1]:
                    setattr(stream, key, routed[1][key])
                else:
                    delattr(stream, key)
            except AttributeError:
                pass
    return stream


class RoutedStream:
    """Stands in for a stream whose writes cannot be replaced on the object itself."""

    def __init__(self, target: Any, write: Callable[[str], int], writelines: Any) -> None:
        self.target = target
        self.write = write
        self.writelines = writelines

    def __getattr__(self, name: str) -> Any:
        if name in ("target", "write", "writelines"):  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.target, name)

    def __repr__(self) -> str:
        return f"<RoutedStream of {self.target!r}>"
