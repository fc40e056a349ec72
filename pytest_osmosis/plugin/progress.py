"""Live progress on the controller's terminal: a pinned status line, or one line per row in logs.

On a terminal one status line stays below everything pytest prints (``StatusLine``): rows
done of those selected, the outcome counts in the results table's words, tokens, cost when
known, rows in flight, elapsed time and ETA, redrawn in place at most
:data:`UPDATES_PER_SECOND` times a second and never wider than the terminal (80 columns
or fewer). Off a terminal (CI logs) each finished attempt gets exactly one line in place
of pytest's letter; with ``-q`` pytest's letters and the running totals once a minute;
with ``-v`` pytest's own line per item. ``--osmosis-progress auto|line|log|off`` chooses
(``mode_for``).

The basis is the results table's (``metrics.json``): attempts recorded by earlier sessions
of a resumed run count as done, with their outcomes and tokens, so the counts shown while
running end where the summary's do. The total is those plus the attempts this session
selected to run (deselected items are not in it); the ETA comes from this session's own
pace.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_osmosis.core.outcome import (
    BELOW_THRESHOLD,
    FAILED,
    OUTCOMES,
    PASSED,
    SKIPPED,
    classify,
    no_trajectory_text,
)
from pytest_osmosis.core.words import (
    ATTEMPTS,
    OUTCOME_WORDS,
    cost_words,
    outcomes_text,
    rate_text,
)

#: What ``--osmosis-progress`` accepts: ``auto`` draws the status line on a terminal that can
#: redraw it and writes log lines elsewhere; ``line`` and ``log`` force one; ``off`` is silent.
MODES = ("auto", "line", "log", "off")

#: The status line's redraw budget (its content changes at most this often).
UPDATES_PER_SECOND = 4

#: The widest status line, whatever the terminal: it fits an 80-column terminal.
MAX_WIDTH = 80

#: ``-q`` off a terminal: pytest's letters, and the running totals at most this often.
QUIET_EVERY_S = 60.0

Clock = Callable[[], float]


# -- choosing ---------------------------------------------------------------------------


def parse_mode(raw: Any, source: str) -> str:
    """The option's value as one of :data:`MODES`; a one-line ValueError otherwise."""
    value = str(raw).strip().lower()
    if value not in MODES:
        raise ValueError(f"{source}: must be one of {', '.join(MODES)}, got {raw!r}")
    return value


def mode_for(
    wanted: str,
    reporter: Any,
    *,
    capture: str | None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """``line``, ``log`` or ``off`` for this session.

    No terminal reporter (``-p no:terminal``) means nothing to write to. ``auto`` draws the
    line only where it can be redrawn in place: a terminal (not a pipe or a file), whose
    TERM is not ``dumb``, with output captured (under ``--capture=no`` a row's own prints
    land on the status line, as pytest turns its own percentage off there).
    """
    if wanted == "off" or reporter is None:
        return "off"
    if wanted != "auto":
        return wanted  # ``line`` falls back to ``log`` where the writer cannot be pinned
    env = os.environ if environ is None else environ
    file = _file_of(reporter)
    tty = bool(file is not None and _isatty(file))
    if not tty or env.get("TERM", "") == "dumb" or capture == "no":
        return "log"
    return "line"


def _file_of(reporter: Any) -> Any:
    """The file pytest's terminal writer writes to, if it has the attribute we rely on."""
    return getattr(getattr(reporter, "_tw", None), "_file", None)


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# -- what the line says -----------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """The numbers one status line shows."""

    done: int
    total: int
    counts: Mapping[str, int]
    tokens: int
    elapsed: float
    eta: float | None = None
    in_flight: int | None = None  # None: not known here (the xdist controller)
    cost: float | None = None  # None: no result carried a cost
    priced: int = 0  # attempts with a cost, of ``costed`` attempts seen
    costed: int = 0


def status_line(snap: Snapshot, width: int = MAX_WIDTH) -> str:
    """The status line, at most ``min(width, 80) - 1`` characters.

    ``osmosis 37/120  30 passed  4 below threshold  2 errored  8 in flight  12.3k tokens
    $0.04  1m02s elapsed  ETA 3m10s``: rows done of those selected, then each outcome in the
    results table's words (``passed`` always, the others once they happen), then what fits,
    the least useful given up first: tokens, elapsed time, rows in flight, cost, ETA.
    """
    limit = max(1, min(width, MAX_WIDTH) - 1)
    head = [f"osmosis {snap.done}/{snap.total}"]
    head += [
        f"{snap.counts.get(key, 0)} {OUTCOME_WORDS[key]}"
        for key in OUTCOMES
        if key == PASSED or snap.counts.get(key, 0)
    ]
    # (text, priority: the lower is given up first), in display order.
    tail: list[tuple[str, int]] = []
    if snap.in_flight is not None:
        tail.append((f"{snap.in_flight} in flight", 3))
    tail.append((f"{compact(snap.tokens)} tokens", 1))
    if snap.cost is not None:
        tail.append((cost_words(snap.cost, snap.priced, snap.costed, short=True), 4))
    tail.append((f"{clock_text(snap.elapsed)} elapsed", 2))
    if snap.eta is not None:
        tail.append((f"ETA {clock_text(snap.eta)}", 5))
    for drop in range(0, 6):
        text = "  ".join([*head, *(part for part, rank in tail if rank > drop)])
        if len(text) <= limit:
            return text
    return text[: limit - 3] + "..." if limit > 3 else text[:limit]


def compact(number: float) -> str:
    """``950``, ``12.3k``, ``4.5M``: a count that keeps the line short."""
    if number < 1000:
        return f"{number:.0f}"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= size:
            value = number / size
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{number:.0f}"  # pragma: no cover - the loop always returns


def clock_text(seconds: float) -> str:
    """``7s``, ``3m10s``, ``2h05m``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


# -- counting ---------------------------------------------------------------------------


class Progress:
    """Counts results as the controller journals them and shows them (line, log or off)."""

    def __init__(
        self,
        reporter: Any,
        total: int,
        *,
        recorded: Mapping[str, int] | None = None,
        recorded_tokens: int = 0,
        mode: str = "log",
        verbosity: int = 0,
        in_flight: Callable[[], int | None] | None = None,
        clock: Clock = time.monotonic,
        started: float | None = None,
    ) -> None:
        self.reporter = reporter
        self.total = total
        self.mode = mode
        self.verbosity = verbosity
        self.clock = clock
        self.paced_from = clock()
        self.started = self.paced_from if started is None else started  # "elapsed" counts
        self._first_result: float | None = None  # the ETA's pace is measured from here
        self.counts = {key: int((recorded or {}).get(key, 0)) for key in OUTCOMES}
        self.recorded = sum(self.counts.values())
        self.done = self.recorded
        self.executed = 0
        self.tokens = recorded_tokens
        self.cost: float | None = None
        self.priced = self.costed = 0  # attempts with a cost, of those seen
        self._in_flight = in_flight
        self._last_heartbeat = self.paced_from
        self.status: StatusLine | None = None

    @property
    def replaces_letters(self) -> bool:
        """Log lines stand in for pytest's letters (so a row is one line, not three)."""
        return self.mode == "log" and self.verbosity == 0

    def start(self, *, ticker: bool = True) -> None:
        """Before the first row: put the status line up (``line``), or make room for log
        lines in place of pytest's letters (``log``)."""
        if self.mode == "line" and self.status is None:
            status = StatusLine.install(self.reporter, self.snapshot, clock=self.clock)
            if status is None:  # pytest's writer is not what we know: lines instead
                self.mode = "log"
            else:
                self.status = status
                status.tick(force=True)
                if ticker:
                    status.start_ticker()
        if self.replaces_letters and hasattr(self.reporter, "_show_progress_info"):
            # pytest's [NN%] counts the letters it showed, which are none: our lines count.
            self.reporter._show_progress_info = False

    def stop(self) -> None:
        """Take the status line down; what pytest writes next lands where it would have."""
        if self.status is not None:
            self.status.close()

    def add(self, result: Mapping[str, Any]) -> None:
        self.done += 1
        self.executed += 1
        self.tokens += int(result.get("tokens") or 0)
        self.add_cost(result)
        outcome = classify(result, float(result.get("pass_threshold", 1.0)))
        self.counts[outcome] += 1
        now = self.clock()
        if self._first_result is None:
            self._first_result = now
        if self.mode == "line":
            if self.status is not None:
                # The last result is drawn at once, whatever the rate: the ticker may get no
                # turn before the session's end takes the line down (a loaded machine).
                self.status.tick(now, force=self.done >= self.total)
        elif self.mode == "log":
            if self.verbosity == 0:
                self._write(f"osmosis: {row_text(result, outcome)}  [{self.line(now)}]")
            elif self.verbosity < 0 and now - self._last_heartbeat >= QUIET_EVERY_S:
                self._last_heartbeat = now
                self._write(f"osmosis: {self.line(now)}")

    def _write(self, text: str) -> None:
        """Our own line, never glued to the letters pytest prints for each item.

        The writer is pytest's, so the path it prints before a file's first item stays on
        its own line and is not printed again for every row.
        """
        writer: Any = getattr(self.reporter, "_tw", None)
        if writer is None:
            self.reporter.write_line(text)
            return
        if writer.width_of_current_line:
            writer.line()
        writer.line(text)

    def snapshot(self, now: float | None = None) -> Snapshot:
        now = self.clock() if now is None else now
        elapsed = now - self.started
        eta = None
        if self.executed and self.done < self.total:
            eta = self._per_row(now) * (self.total - self.done)
        return Snapshot(
            done=self.done,
            total=self.total,
            counts=dict(self.counts),
            tokens=self.tokens,
            elapsed=elapsed,
            eta=eta,
            in_flight=self._in_flight() if self._in_flight is not None else None,
            cost=self.cost,
            priced=self.priced,
            costed=self.costed,
        )

    def add_cost(self, row: Mapping[str, Any]) -> None:
        """A result's or a recorded row's cost, when it has one (shown only once one has)."""
        from pytest_osmosis.results.run_reader import COST_KEY

        cost = row.get(COST_KEY)
        self.costed += 1
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            self.cost = (self.cost or 0.0) + float(cost)
            self.priced += 1

    def _per_row(self, now: float) -> float:
        """Seconds per row at this session's pace: from its first result on, once there
        are two (start-up, a worker importing LiteLLM, is no row's time), else from the
        first item."""
        if self.executed >= 2 and self._first_result is not None:
            return (now - self._first_result) / (self.executed - 1)
        return (now - self.paced_from) / max(1, self.executed)

    def line(self, now: float) -> str:
        """The running totals a log line ends with (no width limit: logs wrap)."""
        snap = self.snapshot(now)
        counted = self.done - self.counts[SKIPPED]
        rate = rate_text(self.counts[PASSED], counted)
        eta = f", ETA {_duration(snap.eta)}" if snap.eta is not None else ""
        cost = (
            f"; cost {cost_words(snap.cost, snap.priced, snap.costed)}"
            if snap.cost is not None
            else ""
        )
        earlier = f" ({self.recorded} recorded earlier)" if self.recorded else ""
        return (
            f"{self.done}/{self.total} {ATTEMPTS} done{earlier}: {outcomes_text(self.counts)}; "
            f"pass rate {rate}; {self.tokens} tokens{cost}; "
            f"{_duration(snap.elapsed)} elapsed{eta}"
        )


def row_text(result: Mapping[str, Any], outcome: str) -> str:
    """``row 6 run 0 below threshold (reward 0.0)``: one finished attempt."""
    if outcome == FAILED:
        why = f" ({result.get('error_type')})"
    elif outcome in (PASSED, BELOW_THRESHOLD):
        why = f" (reward {result.get('reward')})"
    else:
        why = ""
    return (
        f"row {result.get('source_row_index')} run {result.get('run_index')} "
        f"{OUTCOME_WORDS[outcome]}{why}{no_trajectory_text(result)}"
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- drawing ----------------------------------------------------------------------------

_CLEAR = "\r\x1b[2K"  # to column 0, erase the whole line
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class PinnedFile:
    """pytest's terminal file, with our status line kept below whatever pytest writes.

    pytest ends a line when the next one starts (``"\\nnext"``), so its cursor mostly sits
    at the end of an open line. The status line goes on the line below it: before pytest
    writes, the status line is erased and the cursor put back at the end of pytest's line
    (or, when pytest begins with the newline we already wrote, that newline is dropped);
    after, the status line is drawn below again. So pytest's output reads exactly as without
    us, and the one status line never scrolls.

    pytest writes only while output capture is suspended; our own writes go to a duplicate
    of the terminal's descriptor taken then, so a redraw while a row runs (capture on) still
    reaches the terminal, not the row's captured output.
    """

    def __init__(self, file: Any, fd: int, width: Callable[[], int]) -> None:
        self.file = file
        self._fd = fd
        self._width = width
        self._lock = threading.RLock()
        self._encoding = str(getattr(file, "encoding", None) or "utf-8")
        self.text = ""  # the status line as last drawn
        self._shown = False
        self._owed = False  # we ended pytest's open line with our own newline
        self._column = 0  # where pytest's cursor is on its open line

    # pytest's writer calls these
    def write(self, text: str) -> int:
        with self._lock:
            if not self._shown:
                self.file.write(text)
                self.file.flush()
                self._track(text)
                return len(text)
            prefix = _CLEAR
            if self._owed:
                self._owed = False
                if text.startswith("\n"):
                    text = text[1:]
                else:
                    prefix += self._back()
            self._raw(prefix)
            self.file.write(text)
            self.file.flush()
            self._track(text)
            self._raw(self._below())
            return len(text)

    def flush(self) -> None:
        with self._lock:
            self.file.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, ...
        return getattr(self.file, name)

    # the status line's own
    def show(self, text: str) -> None:
        with self._lock:
            self.text = text
            self._raw(_CLEAR + text if self._shown else self._below())

    def hide(self) -> None:
        with self._lock:
            if not self._shown:
                return
            self._shown = False
            out = _CLEAR
            if self._owed:
                self._owed = False
                out += self._back()
            self._raw(out)

    def _below(self) -> str:
        """Draw the status line below pytest's open line (marks it shown)."""
        self._shown = True
        if self._column:
            self._owed = True
            return "\n" + _CLEAR + self.text
        return _CLEAR + self.text

    def _back(self) -> str:
        """From the status line back to the end of pytest's open line."""
        width = max(1, self._width())
        column = self._column
        if column > width:  # the open line wrapped: its last row
            column -= width * ((column - 1) // width)
        return "\x1b[1A\r" + (f"\x1b[{column}C" if column else "")

    def _track(self, text: str) -> None:
        last = max(text.rfind("\n"), text.rfind("\r"))
        visible = _ESCAPE.sub("", text[last + 1 :])
        self._column = (0 if last >= 0 else self._column) + _cells(visible)

    def _raw(self, text: str) -> None:
        data = text.encode(self._encoding, "replace")
        while data:
            try:
                written = os.write(self._fd, data)
            except InterruptedError:
                continue
            except OSError:
                return  # the terminal went away: pytest will notice on its own writes
            data = data[written:]


def _cells(text: str) -> int:
    try:
        from _pytest._io.wcwidth import wcswidth
    except ImportError:  # pragma: no cover - pytest moved it
        return len(text)
    width = wcswidth(text)
    return width if width >= 0 else len(text)


class StatusLine:
    """The pinned status line: redrawn when its content changed, at most 4 times a second
    (the run's last result at once: ``Progress.add`` forces it).

    ``tick`` is the only way it updates; rows finishing call it, and a ticker thread calls
    it every quarter second so elapsed time, ETA and rows in flight move while no row
    finishes. ``updates`` counts redraws (tests drive ``tick`` with an injected clock).
    """

    def __init__(
        self,
        file: PinnedFile,
        snapshot: Callable[[float], Snapshot],
        *,
        clock: Clock = time.monotonic,
        width: Callable[[], int] = lambda: MAX_WIDTH,
    ) -> None:
        self.file = file
        self.snapshot = snapshot
        self.clock = clock
        self.width = width
        self.updates = 0
        self._last: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._restore: Callable[[], None] | None = None

    @classmethod
    def install(
        cls, reporter: Any, snapshot: Callable[[float], Snapshot], *, clock: Clock
    ) -> StatusLine | None:
        """Put a PinnedFile under pytest's terminal writer; None when that cannot be done."""
        from pytest_osmosis.plugin.redaction import RedactingStream

        writer = getattr(reporter, "_tw", None)
        owner, attr = writer, "_file"
        file = getattr(writer, attr, None)
        while isinstance(file, RedactingStream):
            # Below redaction, which holds back a tail that could start a secret: the line
            # must see what reaches the terminal, when it does.
            owner, attr, file = file, "target", file.target
        if writer is None or file is None or isinstance(file, PinnedFile):
            return None
        try:
            file.flush()
            fd = os.dup(file.fileno())
        except (AttributeError, ValueError, OSError):
            return None

        def width() -> int:
            try:
                return int(writer.fullwidth)
            except (TypeError, ValueError, OSError):
                return MAX_WIDTH

        pinned = PinnedFile(file, fd, width)
        setattr(owner, attr, pinned)
        status = cls(pinned, snapshot, clock=clock, width=width)

        def restore() -> None:
            if getattr(owner, attr, None) is pinned:
                setattr(owner, attr, file)
            try:
                os.close(fd)
            except OSError:
                pass

        status._restore = restore
        return status

    def tick(self, now: float | None = None, *, force: bool = False) -> bool:
        """Redraw if the budget allows and the content changed; True when it redrew."""
        with self._lock:
            if self._stop.is_set():
                return False
            now = self.clock() if now is None else now
            if not force and self._last is not None:
                if now - self._last < 1.0 / UPDATES_PER_SECOND:
                    return False
            text = status_line(self.snapshot(now), self.width())
            if text == self.file.text and not force:
                return False
            self._last = now
            self.updates += 1
            self.file.show(text)
            return True

    def start_ticker(self) -> None:
        def run() -> None:
            while not self._stop.wait(1.0 / UPDATES_PER_SECOND):
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - a status line must never break the run
                    return

        self._thread = threading.Thread(target=run, name="osmosis-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            self.file.hide()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if self._restore is not None:
            self._restore()
