"""Runs in the rollout server's process: ties its life to the session's, then runs the
SDK's bootstrap (or the entrypoint itself) exactly as ``osmosis eval run`` would.

Usage: ``python serve_child.py <bootstrap.py or -> <entrypoint.py>``. Standard library
only, and nothing of this file stays visible to the rollout: its own folder is taken off
``sys.path`` before the bootstrap or entrypoint runs, as if they had been started directly.

The session holds the write end of a pipe whose read end this process inherits (its
number in ``_PYTEST_OSMOSIS_LIFELINE``). When the session ends in any way (a clean end,
Ctrl-C, SIGTERM, even SIGKILL) the pipe reads end-of-file and this process group stops,
so no rollout server outlives the session that started it.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

LIFELINE_ENV = "_PYTEST_OSMOSIS_LIFELINE"


def _watch(fd: int) -> None:
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    group = os.getpgrp()
    try:
        os.killpg(group, signal.SIGTERM)
        time.sleep(5.0)
        os.killpg(group, signal.SIGKILL)
    except OSError:
        os._exit(1)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: serve_child.py <bootstrap.py|-> <entrypoint.py>")
    bootstrap, entrypoint = sys.argv[1], os.path.abspath(sys.argv[2])
    lifeline = os.environ.pop(LIFELINE_ENV, None)
    if lifeline is not None:
        threading.Thread(target=_watch, args=(int(lifeline),), daemon=True).start()
    del sys.path[0]  # this file's folder: the rollout must not see it
    if bootstrap == "-":  # an existing interpreter runs the entrypoint itself (the SDK's way)
        sys.argv = [entrypoint]
        sys.path.insert(0, os.path.dirname(entrypoint))
        runpy.run_path(entrypoint, run_name="__main__")
    else:
        sys.argv = [bootstrap, entrypoint]
        sys.path.insert(0, os.path.dirname(os.path.abspath(bootstrap)))
        runpy.run_path(bootstrap, run_name="__main__")


if __name__ == "__main__":
    main()
