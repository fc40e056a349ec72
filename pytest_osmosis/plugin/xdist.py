"""xdist without double spending: whole shards of rows go to one worker.

xdist's default ``load`` distribution hands items to whichever worker is free, so a
worker cannot know which items it will run next and must run them one at a time. Our
scheduler (xdist_scheduler.py, the controller's) groups an eval config's items into shards
of consecutive rows and sends each shard to one worker; a worker then starts every item
already queued for it ahead of time (here), and no row is ever run by two workers.

This module is what workers import, so it imports none of xdist's scheduling: a worker
paid up to ~0.13 s of start-up for it (compiled afresh where bytecode is not cached).
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import pytest


def dist_was_chosen(config: pytest.Config) -> bool:
    """True when the user named a distribution; we only replace xdist's default."""
    return any(
        arg == "--dist" or arg.startswith("--dist=") for arg in config.invocation_params.args
    )


def worker_count(config: pytest.Config) -> int:
    """How many workers xdist starts: ``-n N``, or one per ``--tx`` spec (``3*popen``: 3,
    ``ssh=…``: 1); 0 when the session is not distributed."""
    if getattr(config.option, "dist", "no") == "no":
        return 0
    count = 0
    for spec in getattr(config.option, "tx", None) or []:
        times, star, _ = str(spec).partition("*")
        count += int(times) if star and times.isdigit() else 1
    return count


def per_worker(total: int, workers: int) -> int:
    """``--osmosis-concurrency`` is the total across workers, so each gets its share."""
    return max(1, math.ceil(total / max(1, workers)))


_INTERACTOR = pytest.StashKey[Any]()
_HANDED_OUT = pytest.StashKey[set[int]]()


def newly_queued_indices(config: pytest.Config) -> list[int]:
    """Indices of the items xdist has sent to this worker since the last call, in run order.

    They start with the item being run and the one xdist took off the queue ahead of it
    (its ``nextitem``): left out, either would start after the rows queued behind it, and
    when its turn came it would run beyond the worker's share of the concurrency.

    Each index is returned once: the worker starts every one ahead when it is returned,
    so a later call (one per item) needs only the shards that arrived since. Returning the
    whole queue each time had the worker look over ~64 queued items for every row it ran.
    """
    interactor = config.stash.get(_INTERACTOR, None)
    if interactor is None:  # found once per worker, not per item
        interactor = next(
            (
                plugin
                for plugin in config.pluginmanager.get_plugins()
                if type(plugin).__name__ == "WorkerInteractor"
                and getattr(plugin, "torun", None) is not None
            ),
            None,
        )
        if interactor is None or not callable(getattr(interactor.torun, "lock", None)):
            return []  # the controller checked this xdist (internals_problem); never fail a row
        config.stash[_INTERACTOR] = interactor
        config.stash[_HANDED_OUT] = set()
    handed_out = config.stash[_HANDED_OUT]
    now = [getattr(interactor, name, None) for name in ("item_index", "nextitem_index")]
    with interactor.torun.lock() as queue:
        queued = [i for i in queue if isinstance(i, int) and i not in handed_out]
    new = [i for i in now if isinstance(i, int) and i not in handed_out] + queued
    handed_out.update(new)
    return new


#: How often a worker checks that its controller is still there.
WATCH_INTERVAL = 0.2


def _terminal_fd(config: pytest.Config) -> int:
    """A duplicate of the stderr the worker inherited, past pytest's fd capture (best effort:
    the saved fd is not public API; without it the line goes to the captured fd 2)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    saved = getattr(err, "targetfd_save", None)
    try:
        return os.dup(saved if isinstance(saved, int) else 2)
    except OSError:
        return 2


def watch_controller(
    config: pytest.Config, controller_pid: int, interval: float = WATCH_INTERVAL
) -> bool:
    """Worker: exit as soon as the controller is gone (SIGKILL leaves it no time to say so).

    Only the controller journals results, so a worker without one can record nothing:
    every row it starts or model call it makes is paid for and lost. execnet notices the
    lost channel only when the worker next sends (after its row); a thread watching the
    parent pid notices within ``interval``, and the worker exits at once: it starts no
    row and makes no model call, and its unjournalled rows stay pending for a resume.
    False when the controller is not this process's parent (nothing to watch).
    """
    if os.getppid() != controller_pid:
        return False
    terminal = _terminal_fd(config)

    def watch() -> None:
        while os.getppid() == controller_pid:
            time.sleep(interval)
        try:
            os.write(
                terminal,
                b"osmosis: the xdist controller is gone; this worker stops "
                b"(its unrecorded rows stay pending)\n",
            )
        finally:
            os._exit(1)

    threading.Thread(target=watch, name="osmosis-controller-watch", daemon=True).start()
    return True
