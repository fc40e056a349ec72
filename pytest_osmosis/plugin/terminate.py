"""SIGTERM stops an eval session the way Ctrl-C does.

A CI runner cancelling a job (or ``timeout``, or ``kill``) sends SIGTERM. By default Python
dies on it at once: no final snapshots, no sealed journal, no line saying what was kept.
So while an eval session runs, SIGTERM is handed to whatever SIGINT's handler is at that
moment: Python's (a KeyboardInterrupt: the session winds down and ends with the same
"N of M recorded" line, Controller.finish sealing the runs), ``interrupt_held``'s (held
until a journal append is whole), the second interrupt's (``arm_second_interrupt``: one
line with what was kept, exit 2) or the preflight's. One path, whichever signal.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


def as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler: do what our SIGINT handler would do now; else a KeyboardInterrupt.

    Only a handler of this package is called: a user's own SIGINT handler (a "really
    quit?" prompt, a flag it sets) is for Ctrl-C, and a cancelled job must still stop."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and _ours(handler):
        handler(signum, frame)
        return
    raise KeyboardInterrupt("SIGTERM")  # also where SIGINT is ignored (a background job)


def _ours(handler: Callable[..., object]) -> bool:
    module = getattr(handler, "__module__", None) or getattr(
        getattr(handler, "func", None), "__module__", None
    )
    return isinstance(module, str) and module.startswith(f"{__package__.partition('.')[0]}.")


def forward_sigterm() -> Callable[[], None] | None:
    """Route SIGTERM to the interrupt path for this session; return what puts it back.

    Only from the main thread (the only one that may set handlers), and only where SIGTERM
    has its default action: a handler someone else installed is theirs to keep."""
    if not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    signal.signal(signal.SIGTERM, as_interrupt)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is as_interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore
