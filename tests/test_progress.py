"""Live progress: a pinned status line on a terminal, one line per finished row in logs.

The status line is tested three ways: its content through the function that renders it
(``progress.status_line``), its drawing by replaying what it writes into a terminal
emulator (pyte), and a real session on a pseudo-terminal whose every frame is checked.
"""

from __future__ import annotations

import json
import os
import re
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyte
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_server import ModelServer
from workspaces import MIXED_ROWS, run_session, write_workspace

from pytest_osmosis.core.outcome import BELOW_THRESHOLD, FAILED, PASSED, SKIPPED
from pytest_osmosis.plugin.progress import (
    MAX_WIDTH,
    UPDATES_PER_SECOND,
    PinnedFile,
    Progress,
    Snapshot,
    StatusLine,
    mode_for,
    status_line,
)

pytest_plugins = ["pytester"]

BASE = ("--osmosis-eval", "-p", "no:cacheprovider")

MIXED = MIXED_ROWS  # one of each outcome, and two errors

STATUS = re.compile(r"^osmosis \d+/\d+  ")


class FakeWriter:
    def __init__(self) -> None:
        self.hasmarkup = False
        self.width_of_current_line = 0
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        self.lines.append(text)


class FakeReporter:
    def __init__(self) -> None:
        self._tw = FakeWriter()
        self.currentfspath = None

    @property
    def lines(self) -> list[str]:
        return [line for line in self._tw.lines if line]


RESULTS = [
    {
        "status": "success",
        "reward": 1.0,
        "passed": True,
        "tokens": 10,
        "source_row_index": 0,
        "run_index": 0,
    },
    {
        "status": "success",
        "reward": 0.0,
        "passed": False,
        "tokens": 10,
        "source_row_index": 1,
        "run_index": 0,
    },
    {
        "status": "failed",
        "error_type": "agent_error",
        "passed": False,
        "source_row_index": 2,
        "run_index": 0,
    },
    {"status": "skipped", "passed": False, "tokens": 5, "source_row_index": 3, "run_index": 0},
]


# ------------------------------------------------------------------------ log lines


def test_off_a_terminal_every_row_gets_one_line() -> None:
    reporter = FakeReporter()
    progress = Progress(reporter, total=4, mode="log")
    for result in RESULTS:
        progress.add(result)
    assert len(reporter.lines) == 4
    assert reporter.lines[0].startswith("osmosis: row 0 run 0 passed (reward 1.0)  [1/4 attempts")
    assert reporter.lines[1].startswith("osmosis: row 1 run 0 below threshold (reward 0.0)")
    assert reporter.lines[2].startswith("osmosis: row 2 run 0 errored (agent_error)")
    assert (
        "[3/4 attempts done: 1 passed, 1 below threshold, 1 errored, 0 skipped; "
        "pass rate 33.3%; 20 tokens;" in reporter.lines[2]
    )
    assert reporter.lines[3].startswith("osmosis: row 3 run 0 skipped  [4/4 attempts done")
    assert "ETA" in reporter.lines[2] and "ETA" not in reporter.lines[3]
    assert "$" not in "".join(reporter.lines)  # no result carried a cost


def test_quiet_logs_get_the_totals_once_a_minute_and_verbose_logs_none() -> None:
    clock = [0.0]
    quiet = FakeReporter()
    progress = Progress(quiet, total=200, mode="log", verbosity=-1, clock=lambda: clock[0])
    for step in range(200):
        clock[0] = step * 1.0  # a row a second for 200 s
        progress.add(RESULTS[0])
    assert [line.split(":")[1] for line in quiet.lines] == [
        " 61/200 attempts done",
        " 121/200 attempts done",
        " 181/200 attempts done",
    ]
    verbose = FakeReporter()
    progress = Progress(verbose, total=4, mode="log", verbosity=1)
    for result in RESULTS:
        progress.add(result)
    assert verbose.lines == []  # pytest's own line per item is the row's line


def test_the_eta_is_the_pace_since_the_first_result() -> None:
    clock = [0.0]
    progress = Progress(FakeReporter(), total=21, mode="line", clock=lambda: clock[0])
    clock[0] = 60.0  # a minute of start-up (an xdist worker importing LiteLLM) is no row's
    progress.add(RESULTS[0])
    assert progress.snapshot().eta == pytest.approx(60.0 * 20)  # one result: all it knows
    for _ in range(10):
        clock[0] += 2.0  # then a row every 2 s
        progress.add(RESULTS[0])
    assert progress.snapshot().eta == pytest.approx(2.0 * 10)


def test_a_cost_is_shown_once_results_carry_one() -> None:
    reporter = FakeReporter()
    progress = Progress(reporter, total=2, mode="log")
    progress.add({**RESULTS[0], "cost_usd": 0.0125})
    progress.add({**RESULTS[1], "cost_usd": 0.0100})
    assert "; 20 tokens; cost $0.022500 for 2 of 2 priced attempts; " in reporter.lines[1]
    assert status_line(progress.snapshot()).count("$0.02") == 1


# ------------------------------------------------------------------ the status line


def snap(**fields: Any) -> Snapshot:
    values: dict[str, Any] = {
        "done": 37,
        "total": 120,
        "counts": {PASSED: 30, BELOW_THRESHOLD: 4, FAILED: 2, SKIPPED: 1},
        "tokens": 12_345,
        "elapsed": 62.0,
        "eta": 190.0,
        "in_flight": 8,
        "cost": None,
    }
    values.update(fields)
    return Snapshot(**values)


def test_the_status_line_says_the_counts_in_the_results_tables_words() -> None:
    few = snap(counts={PASSED: 3, BELOW_THRESHOLD: 0, FAILED: 0, SKIPPED: 0}, done=3)
    assert status_line(few) == (
        "osmosis 3/120  3 passed  8 in flight  12.3k tokens  1m02s elapsed  ETA 3m10s"
    )
    # After a resume the counts are the run's: what earlier sessions recorded is counted.
    resumed = Progress(
        FakeReporter(),
        total=5,
        recorded={PASSED: 1, BELOW_THRESHOLD: 1},
        recorded_tokens=12,
        mode="log",
        clock=lambda: 10.0,
        started=7.0,
    )
    assert status_line(resumed.snapshot()) == (
        "osmosis 2/5  1 passed  1 below threshold  12 tokens  3s elapsed"
    )
    resumed.add(RESULTS[2])
    # (80 characters with its tokens: the least useful part gives way)
    assert status_line(resumed.snapshot()) == (
        "osmosis 3/5  1 passed  1 below threshold  1 errored  3s elapsed  ETA 0s"
    )


def test_what_does_not_fit_80_columns_is_given_up_least_useful_first() -> None:
    full = status_line(snap(cost=0.04))
    # Everything would take 114 columns: tokens, elapsed, in flight and cost give way.
    assert full == "osmosis 37/120  30 passed  4 below threshold  2 errored  1 skipped  ETA 3m10s"
    assert status_line(snap(cost=0.04), width=200) == full  # never wider than 80 columns
    assert status_line(snap(cost=0.04), width=60) == (
        "osmosis 37/120  30 passed  4 below threshold  2 errored ..."
    )
    no_errors = snap(counts={PASSED: 37, BELOW_THRESHOLD: 0, FAILED: 0, SKIPPED: 0}, cost=0.04)
    assert status_line(no_errors) == (
        "osmosis 37/120  37 passed  8 in flight  $0.04  1m02s elapsed  ETA 3m10s"
    )
    # The xdist controller does not know the rows in flight; no ETA before a row is done.
    two_errors = {PASSED: 30, BELOW_THRESHOLD: 0, FAILED: 2, SKIPPED: 0}
    assert status_line(snap(counts=two_errors, in_flight=None, eta=None, tokens=950)) == (
        "osmosis 37/120  30 passed  2 errored  950 tokens  1m02s elapsed"
    )


@settings(max_examples=300, deadline=None)
@given(
    done=st.integers(0, 10**7),
    counts=st.lists(st.integers(0, 10**7), min_size=4, max_size=4),
    tokens=st.integers(0, 10**13),
    elapsed=st.floats(0, 10**7),
    eta=st.none() | st.floats(0, 10**8),
    in_flight=st.none() | st.integers(0, 10**5),
    cost=st.none() | st.floats(0, 10**6),
    width=st.integers(20, 300),
)
def test_the_status_line_always_fits(
    done: int,
    counts: list[int],
    tokens: int,
    elapsed: float,
    eta: float | None,
    in_flight: int | None,
    cost: float | None,
    width: int,
) -> None:
    keys = (PASSED, BELOW_THRESHOLD, FAILED, SKIPPED)
    line = status_line(
        Snapshot(
            done=done,
            total=done * 2,
            counts=dict(zip(keys, counts, strict=True)),
            tokens=tokens,
            elapsed=elapsed,
            eta=eta,
            in_flight=in_flight,
            cost=cost,
        ),
        width,
    )
    assert len(line) <= min(width, MAX_WIDTH) - 1
    assert line.startswith("osmosis ") and "\n" not in line


def test_auto_draws_the_line_only_where_it_can_be_redrawn(tmp_path: Path) -> None:
    class Tty:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    def reporter(tty: bool) -> Any:
        fake = FakeReporter()
        fake._tw._file = Tty(tty)  # type: ignore[attr-defined]
        return fake

    term = {"TERM": "xterm-256color"}
    assert mode_for("auto", reporter(True), capture="fd", environ=term) == "line"
    assert mode_for("auto", reporter(False), capture="fd", environ=term) == "log"  # CI logs
    assert mode_for("auto", reporter(True), capture="fd", environ={"TERM": "dumb"}) == "log"
    assert mode_for("auto", reporter(True), capture="no", environ=term) == "log"  # -s
    assert mode_for("auto", None, capture="fd", environ=term) == "off"  # -p no:terminal
    assert mode_for("line", reporter(False), capture="fd", environ=term) == "line"
    assert mode_for("off", reporter(True), capture="fd", environ=term) == "off"


# ---------------------------------------------------------------- drawing it pinned


class Terminal:
    """What a PinnedFile writes (pytest's text and our escapes) replayed on a screen."""

    def __init__(self, path: Path, width: int = 80) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        self.pytest_file = open(fd, "w", encoding="utf-8")  # noqa: SIM115
        self.pinned = PinnedFile(self.pytest_file, os.dup(fd), lambda: width)
        self.width = width

    def screen(self) -> pyte.HistoryScreen:
        screen = pyte.HistoryScreen(self.width, 12, history=200)
        screen.set_mode(pyte.modes.LNM)  # a tty's newline also returns the carriage
        pyte.ByteStream(screen).feed(self.path.read_bytes())
        return screen


def shown(screen: pyte.HistoryScreen) -> list[str]:
    history = ["".join(line[x].data for x in range(screen.columns)) for line in screen.history.top]
    return [line.rstrip() for line in [*history, *screen.display] if line.strip()]


def test_pytest_output_reads_as_without_the_line_and_the_line_stays_below(
    tmp_path: Path,
) -> None:
    term = Terminal(tmp_path / "tty")
    pinned = term.pinned
    pinned.write("collected 3 items\n")
    pinned.write("\nconfigs/eval/calc.toml ")
    pinned.show("osmosis 0/3  0 passed")
    pinned.write(".")
    pinned.show("osmosis 1/3  1 passed")
    pinned.write(".")
    pinned.write("F")
    screen = term.screen()
    assert shown(screen) == [
        "collected 3 items",
        "configs/eval/calc.toml ..F",
        "osmosis 1/3  1 passed",
    ]
    # The cursor rests on the status line, the last one.
    assert screen.display[screen.cursor.y].rstrip() == "osmosis 1/3  1 passed"
    pinned.show("osmosis 3/3  2 passed  1 errored")
    pinned.write("\n=== FAILURES ===")  # pytest starts its next line with the newline
    pinned.write("\nrow_2_run_0 failed\n")  # and sometimes ends one with it
    assert shown(term.screen()) == [
        "collected 3 items",
        "configs/eval/calc.toml ..F",
        "=== FAILURES ===",
        "row_2_run_0 failed",
        "osmosis 3/3  2 passed  1 errored",
    ]
    pinned.hide()
    pinned.write("done")
    assert shown(term.screen()) == [
        "collected 3 items",
        "configs/eval/calc.toml ..F",
        "=== FAILURES ===",
        "row_2_run_0 failed",
        "done",
    ]


def test_a_status_line_updates_at_most_four_times_a_second(tmp_path: Path) -> None:
    clock = [1000.0]
    term = Terminal(tmp_path / "tty")
    progress = Progress(FakeReporter(), total=2000, mode="line", clock=lambda: clock[0])
    status = StatusLine(term.pinned, progress.snapshot, clock=lambda: clock[0])
    progress.status = status
    status.tick(force=True)
    for step in range(2000):  # a row every 5 ms for 10 s, each asking for a redraw
        clock[0] = 1000.0 + (step + 1) * 0.005
        progress.add(RESULTS[step % 2])
        status.tick()  # and the ticker asking too
    assert UPDATES_PER_SECOND == 4
    # 10 s at 4 a second (plus the first): the line kept up, never faster than allowed.
    assert 38 <= status.updates <= 41
    draws = term.path.read_bytes().count(b"\r\x1b[2Kosmosis ")
    assert draws == status.updates
    assert shown(term.screen()) == [status_line(progress.snapshot(clock[0]))]
    before = status.updates
    status.tick(clock[0] + 0.1)
    assert status.updates == before  # nothing changed and no time passed: no redraw


def test_the_last_result_is_drawn_at_once(tmp_path: Path) -> None:
    """Within a quarter second of the last redraw: the session's end may come before the
    ticker's next turn, and the line must not have ended on a count short of the run."""
    clock = [1000.0]
    term = Terminal(tmp_path / "tty")
    progress = Progress(FakeReporter(), total=2, mode="line", clock=lambda: clock[0])
    status = StatusLine(term.pinned, progress.snapshot, clock=lambda: clock[0])
    progress.status = status
    status.tick(force=True)
    clock[0] += 0.01
    progress.add(RESULTS[0])
    assert status.updates == 1  # the rate holds it back
    clock[0] += 0.01
    progress.add(RESULTS[1])
    assert status.updates == 2
    assert shown(term.screen()) == [status_line(progress.snapshot(clock[0]))]
    assert shown(term.screen())[0].startswith("osmosis 2/2  ")


# ------------------------------------------------------------- sessions, off a terminal


#: The log line of each MIXED row (without its totals), in row order.
MIXED_ROW_LINES = [
    "osmosis: row 0 run 0 passed (reward 1.0)",
    "osmosis: row 1 run 0 below threshold (reward 0.0)",
    "osmosis: row 2 run 0 errored (agent_error)",
    "osmosis: row 3 run 0 errored (agent_error)",
    "osmosis: row 4 run 0 skipped",
]


def run_section(output: str) -> list[str]:
    """The lines a session prints while its rows run (after the header, before summaries)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"(collected|\d+ workers) ", line))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("====="))
    return [line for line in lines[start + 1 : end] if line.strip()]


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_off_a_terminal_a_row_is_one_line_and_quiet_is_quieter(
    pytester: pytest.Pytester, model_env: Any, xdist: tuple[str, ...]
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    result = run_session(pytester, *BASE, "--osmosis-name", "logs", *xdist)
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    lines = run_section(result.stdout.str())
    rows = [line for line in lines if line.startswith("osmosis: row ")]
    assert len(rows) == 5
    # At most one more: the config's path (pytest names the file once), no letters.
    assert len(lines) <= len(rows) + 1, lines
    assert sorted(line.split("  [")[0] for line in rows) == MIXED_ROW_LINES
    assert "[5/5 attempts done: 1 passed, 1 below threshold, 2 errored, 1 skipped;" in rows[-1]
    # pytest's short summary still names each failure with its word (pytest 8.4 without the message).
    result.stdout.fnmatch_lines(["FAILED *calc.toml::row_1_run_0*"])

    quiet = run_session(pytester, *BASE, "--osmosis-name", "quiet", "-q", *xdist)
    quiet.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    assert "osmosis: row" not in quiet.stdout.str()  # a short run: no totals line either
    letters = [line for line in quiet.outlines if re.fullmatch(r"[.FsE]+ *\[100%\]", line)]
    assert len(letters) == 1, quiet.outlines  # pytest's letters, on one line


def test_interleaved_reports_show_every_row_once(pytester: pytest.Pytester, model_env: Any) -> None:
    """Under xdist two workers' reports interleave (A's report, B's report, then A's and B's
    ends): each row's line is still shown once. Replayed here in that order, in process."""
    write_workspace(pytester.path, rows=MIXED)
    pytester.makeconftest(
        """
        import pytest
        from _pytest.runner import runtestprotocol

        held = []

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(item, nextitem):
            held.append((item, runtestprotocol(item, nextitem=nextitem, log=False)))
            if len(held) == 2 or nextitem is None:
                for each, _ in held:
                    each.ihook.pytest_runtest_logstart(nodeid=each.nodeid, location=each.location)
                for each, reports in held:
                    for report in reports:
                        each.ihook.pytest_runtest_logreport(report=report)
                for each, _ in held:
                    each.ihook.pytest_runtest_logfinish(nodeid=each.nodeid, location=each.location)
                held.clear()
            return True
        """
    )
    result = pytester.runpytest(*BASE, "--osmosis-progress", "log")
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    rows = [line for line in run_section(result.stdout.str()) if line.startswith("osmosis: row ")]
    assert sorted(line.split("  [")[0] for line in rows) == MIXED_ROW_LINES
    assert "[5/5 attempts done: 1 passed, 1 below threshold, 2 errored, 1 skipped;" in rows[-1]


def test_progress_off_leaves_pytest_alone_and_a_bad_value_is_one_line(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    off = pytester.runpytest(*BASE, "--osmosis-progress", "off")
    off.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    assert "osmosis: row" not in off.stdout.str()
    off.stdout.fnmatch_lines(["configs/eval/calc.toml .FEEs*"])
    bad = pytester.runpytest(*BASE, "--osmosis-progress", "bar")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(
        ["ERROR: --osmosis-progress: must be one of auto, line, log, off, got 'bar'"]
    )
    silent = pytester.runpytest(*BASE, "-p", "no:terminal")
    assert silent.ret == pytest.ExitCode.TESTS_FAILED
    assert silent.outlines == []


# --------------------------------------------------------- a session on a real terminal


@pytest.fixture
def slow_model(model_loop: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    """A model that takes 0.4 s a call: a row outlasts the line's quarter-second budget."""
    server = ModelServer(delay=0.4).start(loop=model_loop.loop)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    yield server
    server.stop()


def run_on_a_terminal(
    cwd: Path, *args: str, columns: int = 80, term: str = "xterm-256color"
) -> bytes:
    """A pytest session on a pseudo-terminal of ``columns`` x 24: everything it wrote."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TERM=term, PY_COLORS="0")
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=cwd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + 300  # a budget for a hung session, not a timing check
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the session closed the terminal
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(master)
        process.wait(timeout=60)
    return bytes(output)


def frames(output: bytes, columns: int = 80) -> Iterator[pyte.HistoryScreen]:
    """The screen after each write the session made (replayed in small pieces)."""
    screen = pyte.HistoryScreen(columns, 24, history=2000)
    stream = pyte.ByteStream(screen)
    for piece in re.split(rb"(?=\r\x1b\[2K)", output):
        stream.feed(piece)
        yield screen


def test_on_a_terminal_one_status_line_is_redrawn_in_place_below_pytest(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    named = (*BASE, "--osmosis-name", "tty", "--osmosis-concurrency", "1")
    pytester.runpytest(*named, "-k", "row_0_run_0 or row_1_run_0").assert_outcomes(
        passed=1, failed=1
    )
    output = run_on_a_terminal(pytester.path, *named)
    drawn = [
        text.decode()
        for text in re.findall(rb"\r\x1b\[2K(osmosis [^\r\n\x1b]*)", output)
    ]
    # Drawn in place (carriage return, erase line), several times, each fitting 80 columns.
    assert len(set(drawn)) >= 2, output
    assert all(len(text) <= 79 for text in drawn)
    # The first is up before a row runs; after the resume, the run's counts, in our words.
    assert drawn[0].startswith("osmosis 2/5  1 passed  1 below threshold  ")
    assert any(
        text.startswith(("osmosis 4/5  1 passed  1 below threshold  2 errored", "osmosis 5/5  "))
        for text in drawn[1:]
    )
    statuses = 0
    for screen in frames(output):
        lines = [line.rstrip() for line in screen.display]
        at = [y for y, line in enumerate(lines) if STATUS.match(line)]
        assert len(at) <= 1, lines  # never two status lines
        if at:
            statuses += 1
            assert at == [screen.cursor.y], lines  # pinned: the line the cursor is on
            assert all(not line.strip() for line in lines[at[0] + 1 :])  # nothing below it
    assert statuses >= 2
    # Once the session ends, no status line is left anywhere in the scrollback, and pytest's
    # output reads as it does without one.
    final = shown(screen)
    assert not [line for line in final if STATUS.match(line)], final
    # (replayed rows show their letters too)
    assert any(re.fullmatch(r"configs/eval/calc.toml \.FEEs +\[100%\]", line) for line in final)
    assert any(line.startswith("outcomes   1 passed, 1 below threshold, 2 errored") for line in final)
    assert json.loads((pytester.path / ".osmosis" / "evals" / "tty" / "metrics.json").read_text())[
        "summary"
    ]["total_samples"] == 5


def test_under_xdist_only_the_controller_draws_the_line(
    pytester: pytest.Pytester, slow_model: ModelServer
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    output = run_on_a_terminal(pytester.path, *BASE, "-n", "2")
    drawn = [text.decode() for text in re.findall(rb"\r\x1b\[2K(osmosis [^\r\n\x1b]*)", output)]
    assert drawn and drawn[0].startswith("osmosis 0/5  0 passed  ")
    # The controller does not know the rows in flight on its workers: the line leaves it out.
    assert not [text for text in drawn if "in flight" in text]
    for screen in frames(output):
        lines = [line.rstrip() for line in screen.display]
        at = [y for y, line in enumerate(lines) if STATUS.match(line)]
        assert at in ([], [screen.cursor.y]), lines
    final = shown(screen)
    assert not [line for line in final if STATUS.match(line)], final
    assert any(line.startswith("outcomes   1 passed, 1 below threshold, 2 errored") for line in final)


def test_a_dumb_terminal_gets_log_lines(pytester: pytest.Pytester, model_env: Any) -> None:
    write_workspace(pytester.path, rows=MIXED[:2])
    output = run_on_a_terminal(pytester.path, *BASE, term="dumb").decode()
    assert "\x1b[2K" not in output
    assert "osmosis: row 1 run 0 below threshold (reward 0.0)" in output
