"""The process's standard streams stay open whatever a rollout does with them.

Rollout code shares ``sys.stdout`` and ``sys.stderr`` with pytest (its capture, its terminal
reporter). A helper that closes one, thinking it owns it, made every later setup and report
fail with "I/O operation on closed file": 2,730 lines of errors and rows not recorded. Each
stream a row can reach gets a ``close`` that flushes instead (an attribute of that object
alone: nothing else in the process changes, and printing still works).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["keep_streams_open", "let_streams_close"]

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
