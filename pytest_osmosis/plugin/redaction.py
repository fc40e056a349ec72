"""Keep secret values out of everything pytest writes: the redaction plugin.

Redaction (:class:`RedactionHooks`) is a pytest plugin registered in every process
(controller and xdist workers). It replaces the values of ``[secrets]`` (any length)
and the ambient provider keys the SDK scrubs (Appendix A, 8 characters or more) in
every report before anything sees it (failure tracebacks, captured stdout/stderr/log
sections, user properties, the eval result on the report), so the terminal, ``-rA``,
JUnit XML and the xdist controller only ever receive redacted text; in log records when
they are made (``--log-file``, ``log_cli``, captured logs); in warnings; and in what
reaches the real stdout/stderr (``-s``, ``tee-sys``, output between items, writes to
``sys.__stdout__``/``sys.__stderr__``, ``atexit`` handlers). Each value is redacted in its
``repr`` and JSON-escaped forms too (:func:`~pytest_osmosis.results.redact.secret_forms`);
messages built from provider or rollout text go through
:func:`~pytest_osmosis.results.redact.scrub`, before any cut.

Not covered: bytes a rollout writes itself (its artifacts, its own files, raw
``os.write`` to file descriptors 1/2, child processes' output under ``-s``); report.html
embeds artifacts but is redacted as a whole.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, TextIO

import pytest

from pytest_osmosis.results.redact import (
    MIN_REDACTED_LENGTH,
    Redactor,
    ambient_secret_values,
    use_for_messages,
)

PLUGIN_NAME = "osmosis-redaction"
#: Every stream Python code writes the terminal through: sys.__stdout__ too (``-s``,
#: ``tee-sys`` and rollouts that write to it directly).
_STREAMS = ("stdout", "stderr", "__stdout__", "__stderr__")


def redaction_values(
    names: Iterable[str],
    resolved: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """What to redact for *names*: the resolved values and any environment values.

    A name set both in the secrets file and in the environment resolves to the file's
    value, while an in-process rollout reads the environment's; both are secrets.
    """
    env = os.environ if environ is None else environ
    values = list((resolved or {}).values())
    values += [env[name] for name in names if env.get(name)]
    return values


# --------------------------------------------------------------------------- #
# A redacting text stream
# --------------------------------------------------------------------------- #


class RedactingStream:
    """Wraps a text stream; values are replaced before they reach it.

    A tail that could be the start of a value is held back until the next write
    (or :meth:`drain`), so a value written in pieces is still caught whole.
    """

    def __init__(self, target: TextIO, redactor: Redactor) -> None:
        self.target = target
        self.redactor = redactor
        self.lingering = False
        self._pending = ""
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not self._pending and not len(self.redactor):
            # Nothing to redact yet (the common case before any secret is known).
            self.target.write(text)
            return len(text)
        with self._lock:
            buffered = self.redactor.redact(self._pending + text)
            keep = 0 if self.lingering else self.redactor.holdback(buffered)
            self._pending = buffered[len(buffered) - keep :] if keep else ""
            out = buffered[: len(buffered) - keep]
            if out:
                self.target.write(out)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.target.flush()

    def drain(self) -> None:
        """Write what is held back (the stream is ending) and flush."""
        with self._lock:
            pending, self._pending = self._pending, ""
            if pending:
                self.target.write(pending)
        self.target.flush()

    def linger(self) -> None:
        """Redact without holding anything back: the process is exiting, and no later
        write may come to flush a held-back tail (``atexit`` handlers print)."""
        self.lingering = True
        self.drain()

    def isatty(self) -> bool:
        return bool(self.target.isatty())

    def fileno(self) -> int:
        return self.target.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


# --------------------------------------------------------------------------- #
# Reports
# --------------------------------------------------------------------------- #


def redact_longrepr(longrepr: Any, redactor: Redactor) -> Any:
    """A report's ``longrepr`` without secret values.

    Strings and skip tuples are redacted directly. A rendered repr (traceback) is first
    redacted in place, keeping its structure and colours; if its text still holds a
    value, it is replaced by its redacted text.
    """
    if longrepr is None or not len(redactor):
        return longrepr
    if isinstance(longrepr, str):
        return redactor.redact(longrepr)
    if isinstance(longrepr, tuple):
        return tuple(redactor.redact(p) if isinstance(p, str) else p for p in longrepr)
    try:
        text = str(longrepr)
    except Exception:  # noqa: BLE001 - an unrenderable repr is replaced below
        return "[longrepr withheld: it could not be rendered to check it for secrets]"
    if not redactor.contains(text):
        return longrepr
    _redact_fields(longrepr, redactor, depth=0)
    try:
        again = str(longrepr)
    except Exception:  # noqa: BLE001
        return redactor.redact(text)
    return longrepr if not redactor.contains(again) else redactor.redact(text)


def _redact_fields(node: Any, redactor: Redactor, *, depth: int) -> None:
    if depth > 16:
        return
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = [f.name for f in dataclasses.fields(node)]
    elif isinstance(getattr(node, "longrepr", None), str):  # CollectErrorRepr
        names = ["longrepr"]
    else:
        return
    for name in names:
        value = getattr(node, name, None)
        new = _redacted_value(value, redactor, depth=depth + 1)
        if new is not value:
            try:
                setattr(node, name, new)
            except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
                pass  # the rendered text is checked afterwards


def _redacted_value(value: Any, redactor: Redactor, *, depth: int) -> Any:
    if isinstance(value, str):
        redacted = redactor.redact(value)
        return value if redacted == value else redacted
    if isinstance(value, (list, tuple)):
        items = [_redacted_value(item, redactor, depth=depth) for item in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if dataclasses.is_dataclass(value) or hasattr(value, "longrepr"):
        _redact_fields(value, redactor, depth=depth)
        return value
    text = str(value)
    redacted = redactor.redact(text)
    return value if redacted == text else redacted


def redact_report(report: pytest.TestReport | pytest.CollectReport, redactor: Redactor) -> None:
    """Redact, in place, every field of *report* that pytest or a plugin writes out."""
    if not len(redactor):
        return
    report.longrepr = redact_longrepr(report.longrepr, redactor)
    # New lists only where something was redacted: pytest keeps every report to the end,
    # and three copies of each row's properties were a tenth of a 100,000-row run's memory.
    sections = [
        (redactor.redact(title), redactor.redact(content)) for title, content in report.sections
    ]
    if sections != report.sections:
        report.sections = sections
    properties = getattr(report, "user_properties", None)
    if properties:
        redacted = [
            (
                redactor.redact(str(name)),
                _redacted_value(value, redactor, depth=0),
            )
            for name, value in properties
        ]
        if any(  # by identity: a property may be any object, its == anything
            new_name is not name or new_value is not value
            for (new_name, new_value), (name, value) in zip(redacted, properties, strict=True)
        ):
            report.user_properties = redacted  # type: ignore[union-attr]
    result = getattr(report, "osmosis", None)
    if isinstance(result, dict):
        # Free text only: identity fields and the error vocabulary are journalled as is.
        for key in ("message", "detail"):
            value = result.get(key)
            if isinstance(value, str):
                result[key] = redactor.redact(value)


# --------------------------------------------------------------------------- #
# The plugin
# --------------------------------------------------------------------------- #


class RedactionHooks:
    """Keeps secret values out of reports, logs, warnings and the terminal (every process).

    Register it with :func:`install_redaction`; add values with :meth:`add` as soon as they
    are known (before the rollout is imported: its module code may print them).
    """

    def __init__(self, redactor: Redactor | None = None) -> None:
        if redactor is None:
            # Output (terminal, reports, trajectories): values of MIN_REDACTED_LENGTH or
            # more, the SDK's rule for keys it redacts everywhere; a shorter one would
            # shred unrelated words (OPENAI_API_KEY=x turned "sandboxed" into
            # "sandbo[REDACTED]ed"). logs.txt keeps the SDK's own rule for it: every
            # non-empty [secrets] value (runner.py::SecretRedactor, contract §9.4).
            redactor = Redactor(min_length=MIN_REDACTED_LENGTH)
            redactor.extend(ambient_secret_values(os.environ))
        self.redactor = redactor
        self.log_redactor = Redactor(min_length=1)
        self.log_redactor.extend(ambient_secret_values(os.environ))
        self._warned: set[str] = set()
        #: What this process's makereport redacted last (``_as_redacted``).
        self._fresh: tuple[object, ...] | None = None
        self._streams: list[tuple[str, TextIO, RedactingStream]] = []
        self._patched: list[tuple[object, str, object]] = []
        self._factory: Callable[..., logging.LogRecord] | None = None
        self._previous_factory: Callable[..., logging.LogRecord] | None = None

    def add(self, values: Iterable[str]) -> None:
        """More values to redact (resolved ``[secrets]``, a bridge token, ...)."""
        values = list(values)
        self.redactor.extend(values)
        self.log_redactor.extend(values)

    def warn_short(self, config: pytest.Config, names: Iterable[str]) -> None:
        """One line per short secret and process, naming the variable, never the value."""
        for name in names:
            if name in self._warned:
                continue
            self._warned.add(name)
            line = (
                f"WARNING: secret {name} is shorter than {MIN_REDACTED_LENGTH} characters: "
                "it is not redacted from the output (logs.txt still hides it)"
            )
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(line, yellow=True)
            else:
                print(line, file=sys.stderr)

    # -- reports ------------------------------------------------------------ #

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Runner process: outermost wrapper, so it sees the report after every plugin."""
        report = yield
        redact_report(report, self.redactor)
        self._fresh = self._as_redacted(report)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        redact_report(report, self.redactor)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, None, None]:
        """Every process: again before anyone logs it (xdist reports, worker crashes).

        Not twice in one process: the report our makereport redacted, logged with the same
        values to redact and the same fields (nothing replaced or added since), is clean.
        """
        fresh, self._fresh = self._fresh, None
        now = self._as_redacted(report)
        if (
            fresh is None
            or len(fresh) != len(now)
            or any(a is not b for a, b in zip(fresh, now, strict=True))
        ):
            redact_report(report, self.redactor)
        return (yield)

    def _as_redacted(self, report: pytest.TestReport) -> tuple[object, ...]:
        """What a second pass would look at: the objects themselves (held, and compared by
        identity) and the lengths of the lists."""
        properties = getattr(report, "user_properties", None) or ()
        result = getattr(report, "osmosis", None)
        fields = (result.get("message"), result.get("detail")) if isinstance(result, dict) else ()
        return (
            report,
            self.redactor.generation,
            report.longrepr,
            report.sections,
            len(report.sections),
            properties,
            len(properties),
            result,
            *fields,
        )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collectreport(self, report: pytest.CollectReport) -> Generator[None, None, None]:
        redact_report(report, self.redactor)
        return (yield)

    @pytest.hookimpl(tryfirst=True)
    def pytest_warning_recorded(
        self, warning_message: Any, when: str, nodeid: str, location: Any
    ) -> None:
        """Before the terminal keeps it for the summary or xdist sends it as text.

        (A historic hook: it cannot be a wrapper, so ``tryfirst`` it is.)
        """
        if len(self.redactor):
            message = warning_message.message
            text = str(message)
            redacted = self.redactor.redact(text)
            if redacted != text:
                try:
                    warning_message.message = type(message)(redacted)
                except Exception:  # noqa: BLE001 - a warning class with another signature
                    warning_message.message = UserWarning(redacted)
            line = getattr(warning_message, "line", None)
            if isinstance(line, str):
                warning_message.line = self.redactor.redact(line)

    # -- streams and logging ------------------------------------------------ #

    def pytest_configure(self, config: pytest.Config) -> None:
        """Called on registration (pytest_configure is historic)."""
        self._install_streams(config)
        self._install_record_factory()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.uninstall()

    def _install_streams(self, config: pytest.Config) -> None:
        """Wrap sys.stdout/sys.stderr, and make pytest restore the wrappers, not the originals.

        pytest's capture swaps the streams around every item and restores the ones it
        saved at start-up, and its terminal writer holds the original stdout; both are
        pointed at the wrappers so output between items, ``-s`` and ``tee-sys`` output
        and the terminal report pass through redaction.
        """
        if self._streams:
            return
        wrappers: dict[int, RedactingStream] = {}
        for name in _STREAMS:
            current = getattr(sys, name, None)
            if current is None:
                continue
            # -s: sys.stdout is sys.__stdout__; one wrapper, so one held-back tail.
            wrapper = wrappers.setdefault(id(current), RedactingStream(current, self.redactor))
            setattr(sys, name, wrapper)
            self._streams.append((name, current, wrapper))
        replacements: dict[int, RedactingStream] = {
            id(original): wrapper for _, original, wrapper in self._streams
        }
        capman = config.pluginmanager.getplugin("capturemanager")
        multi = getattr(capman, "_global_capturing", None)
        for attr in ("out", "err"):
            capture = getattr(multi, attr, None)
            syscapture = getattr(capture, "syscapture", capture)
            self._patch(syscapture, "_old", replacements)
            self._patch(getattr(syscapture, "tmpfile", None), "_other", replacements)
        reporter = config.pluginmanager.getplugin("terminalreporter")
        self._patch(getattr(reporter, "_tw", None), "_file", replacements)

    def _patch(self, owner: object, attr: str, replacements: Mapping[int, object]) -> None:
        if owner is None:
            return
        current = getattr(owner, attr, None)
        if current is not None and id(current) in replacements:
            setattr(owner, attr, replacements[id(current)])
            self._patched.append((owner, attr, current))

    def _install_record_factory(self) -> None:
        if self._factory is not None:
            return
        previous = logging.getLogRecordFactory()
        redactor = self.redactor

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if len(redactor):
                _redact_record(record, redactor)
            return record

        self._previous_factory = previous
        self._factory = factory
        logging.setLogRecordFactory(factory)

    def uninstall(self) -> None:
        """Put back the streams and the log record factory (end of session).

        Once a value is known, what ``atexit`` handlers print is redacted too
        (:func:`_redact_at_exit`).
        """
        for owner, attr, original in reversed(self._patched):
            if getattr(owner, attr, None) is not None:
                setattr(owner, attr, original)
        self._patched.clear()
        for name, original, wrapper in reversed(self._streams):
            wrapper.drain()
            if getattr(sys, name, None) is wrapper:
                setattr(sys, name, original)
        self._streams.clear()
        if len(self.redactor):
            _redact_at_exit()
        if self._factory is not None and logging.getLogRecordFactory() is self._factory:
            assert self._previous_factory is not None
            logging.setLogRecordFactory(self._previous_factory)
        self._factory = None


def _redact_at_exit() -> None:
    """Wrap the streams again when the interpreter exits, before ``atexit`` handlers print.

    Handlers run last registered first: registered again at the end of each session,
    after every rollout it imported registered theirs, this one runs before them.
    """
    atexit.unregister(_wrap_streams_for_exit)
    atexit.register(_wrap_streams_for_exit)


def _wrap_streams_for_exit() -> None:
    if not _ACTIVE or not len(_ACTIVE[0].redactor):
        return
    wrappers: dict[int, RedactingStream] = {}
    for name in _STREAMS:
        current = getattr(sys, name, None)
        if current is None or isinstance(current, RedactingStream):
            continue
        wrapper = wrappers.get(id(current))
        if wrapper is None:
            wrapper = wrappers[id(current)] = RedactingStream(current, _ACTIVE[0].redactor)
            wrapper.linger()
        setattr(sys, name, wrapper)


def _redact_record(record: logging.LogRecord, redactor: Redactor) -> None:
    """Redact a log record as it is made, so every handler sees the same safe text."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string is the handler's to report
        message = str(record.msg)
    redacted = redactor.redact(message)
    if redacted != message:
        record.msg, record.args = redacted, None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        if redactor.contains(text):
            record.exc_text = redactor.redact(text)
    if record.stack_info:
        record.stack_info = redactor.redact(record.stack_info)


# --------------------------------------------------------------------------- #
# Wiring helpers
# --------------------------------------------------------------------------- #


_ACTIVE: list[RedactionHooks] = []  # the latest session's hooks in this process


def install_redaction(config: pytest.Config) -> RedactionHooks:
    """The process's :class:`RedactionHooks`, registered on first call (idempotent)."""
    existing = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if isinstance(existing, RedactionHooks):
        return existing
    hooks = RedactionHooks()
    config.pluginmanager.register(hooks, PLUGIN_NAME)
    _ACTIVE[:] = [hooks]
    use_for_messages(hooks.redactor)
    return hooks


def add_secret_values(config: pytest.Config, values: Iterable[str]) -> None:
    """Redact *values* from now on in this process (registers the hooks if needed)."""
    install_redaction(config).add(values)


def add_named_secrets(
    config: pytest.Config, names: Iterable[str], resolved: Mapping[str, str] | None = None
) -> None:
    """Redact the values of ``[secrets]`` *names* from now on; warn once about a short one."""
    names = list(names)
    hooks = install_redaction(config)
    hooks.add(redaction_values(names, resolved))
    env = os.environ
    short = [
        name
        for name in names
        if any(
            0 < len(value) < MIN_REDACTED_LENGTH
            for value in ((resolved or {}).get(name, ""), env.get(name, ""))
        )
    ]
    hooks.warn_short(config, short)


def redactor_for(config: pytest.Config) -> Redactor:
    """The redactor this process uses for output (reports, trajectories)."""
    return install_redaction(config).redactor


def log_redactor_for(config: pytest.Config) -> Redactor:
    """The redactor for logs.txt: every non-empty ``[secrets]`` value, as the SDK's."""
    return install_redaction(config).log_redactor
