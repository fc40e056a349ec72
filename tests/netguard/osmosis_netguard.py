"""Test-only network guard: any socket use that is not loopback raises and is recorded.

An audit hook sees ``socket.connect`` / ``socket.getaddrinfo`` (and friends) *before*
the system call, so raising there stops the packet from ever leaving. Library code
may swallow the exception (LiteLLM turns it into a retry or an error response), so
every violation is also recorded; ``tests/conftest.py`` fails the running test when
it finds one. Subprocesses install the same hook through ``sitecustomize.py`` in
this directory (put it on PYTHONPATH) and append their violations to the file named
by ``OSMOSIS_TEST_NETGUARD_LOG``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["NetworkGuardError", "drain", "expected", "install", "violations", "watch_log"]

LOG_ENV = "OSMOSIS_TEST_NETGUARD_LOG"
_LOCAL_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost"})
_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.sendto",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
    }
)

violations: list[str] = []
_installed = False
_log_path: str | None = None
_log_offset = 0
_watch_path: str | None = None
_lock = threading.Lock()


class NetworkGuardError(OSError):
    """A test tried to reach a non-loopback address."""


def _is_local_host(host: Any) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return True
    name = host.strip().lower().rstrip(".")
    if name in _LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False  # a DNS name other than localhost means a lookup on the network
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return address.is_loopback or address.is_unspecified


def _target(event: str, args: tuple[Any, ...]) -> tuple[Any, Any] | None:
    """(host, port) the event is about, or None when it is not an IP endpoint."""
    if event in ("socket.connect", "socket.sendto"):
        address = args[1] if len(args) > 1 else None
        if isinstance(address, tuple) and len(address) >= 2:
            return address[0], address[1]
        return None  # AF_UNIX paths and other families stay on this machine
    if event == "socket.getaddrinfo":
        return args[0], args[1] if len(args) > 1 else None
    return (args[0] if args else None), None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    target = _target(event, args)
    if target is None or _is_local_host(target[0]):
        return
    host, port = target
    where = f"{host}:{port}" if port is not None else f"{host}"
    message = f"network guard: {event} to {where} blocked (tests may only use loopback)"
    violations.append(message)
    if _log_path:
        with contextlib.suppress(OSError), open(_log_path, "a", encoding="utf-8") as fh:
            fh.write(f"[pid {os.getpid()}] {message}\n")
    raise NetworkGuardError(message)


def install(log_path: str | None = None) -> None:
    """Add the audit hook once per process; `log_path` also receives violations."""
    global _installed, _log_path
    if log_path:
        _log_path = log_path
    if _installed:
        return
    _installed = True
    sys.addaudithook(_hook)


def watch_log(path: str) -> None:
    """Collect violations that subprocesses append to `path` (the parent's side)."""
    global _log_offset, _watch_path
    os.environ[LOG_ENV] = path
    with open(path, "a", encoding="utf-8"):
        pass
    _log_offset = os.path.getsize(path)
    _watch_path = path


def drain() -> list[str]:
    """Take every violation recorded so far, in this process and in its children."""
    global _log_offset
    with _lock:
        taken = violations[:]
        del violations[: len(taken)]
        path = _watch_path
        if path:
            try:
                size = os.path.getsize(path)
            except OSError:
                size = _log_offset
            if size > _log_offset:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    fh.seek(_log_offset)
                    taken.extend(line.rstrip("\n") for line in fh.read().splitlines())
                _log_offset = size
    return taken


@contextlib.contextmanager
def expected() -> Iterator[list[str]]:
    """Violations inside the block are the test's subject, not a failure: hand them over."""
    earlier = drain()
    caught: list[str] = []
    try:
        yield caught
    finally:
        caught.extend(drain())
        with _lock:
            violations[:0] = earlier
