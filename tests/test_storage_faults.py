"""Storage that fails under a run (issue 14): temporaries a killed writer left, a full
disk, the run directory deleted by a cleanup job.

Each is met by the session that owns the run lock: dead writers' temporaries are removed
when it opens the run (a live writer's are kept); a full disk or a deleted run directory
stops the session in one line with exit 4, the journal holding exactly the results
recorded before, and (for a full disk) the next session resumes and finishes the run.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import CALC_ROLLOUT, calc_rows, only_run_dir, write_workspace

pytest_plugins = ["pytester"]

ARGS = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "run")


def journal_lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)


def six_rows() -> list[dict[str, object]]:
    return calc_rows([(f"What is {i} + {i}?", str(2 * i)) for i in range(6)])


# --------------------------------------------------------------------------- #
# 1. Temporaries of dead writers
# --------------------------------------------------------------------------- #

_STALLED_WRITER = r"""
import os, sys, time
from pathlib import Path
from pytest_osmosis.results import atomic

def stall(src, dst):
    print("ready", flush=True)
    time.sleep(600)

os.replace = stall  # killed between writing the temporary and renaming it
atomic.atomic_write_bytes(Path(sys.argv[1]), b'{"row_index": 0}\n' * 50)
"""


def killed_writer(destination: Path) -> tuple[int, Path]:
    """A process killed (SIGKILL) while writing *destination*: its pid and its temporary."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _STALLED_WRITER, str(destination)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    (temporary,) = destination.parent.glob(f".{destination.name}.{writer.pid}.*.tmp")
    return writer.pid, temporary


def test_the_next_session_removes_temporaries_of_dead_writers_and_keeps_live_ones(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path)
    assert pytester.runpytest(*ARGS).ret == pytest.ExitCode.OK
    run_dir = only_run_dir(pytester.path)
    index_before = (run_dir / "index.jsonl").read_bytes()
    dead_pid, dead_index = killed_writer(run_dir / "index.jsonl")
    # A row killed while writing its trajectory: its rollout id was never journalled.
    trial = run_dir / "rollout_trials" / "0badc0ffee0badc0ffee0badc0ffee0"
    trial.mkdir()
    (run_dir / "trajectories").mkdir(exist_ok=True)
    dead = [
        dead_index,
        trial / f".trajectory.json.{dead_pid}.3.tmp",
        run_dir / "trajectories" / f".row_0_run_0.json.{dead_pid}.7.tmp",
    ]
    for path in dead[1:]:
        path.write_text("{")
    # The rollout's own files are not ours to remove, whatever their name.
    (trial / "artifacts").mkdir(exist_ok=True)
    artifact = trial / "artifacts" / f".notes.txt.{dead_pid}.0.tmp"
    artifact.write_text("the rollout's")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live_temporary = run_dir / f".metrics.json.{live.pid}.0.tmp"
        live_temporary.write_text("{")
        # A finished run re-run (nothing runs) still cleans: it holds the run lock.
        result = pytester.runpytest(*ARGS)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert [path for path in dead if path.exists()] == []
        assert live_temporary.exists()
        assert artifact.exists()
    finally:
        live.kill()
        live.wait()
    assert (run_dir / "index.jsonl").read_bytes() == index_before
    logs = (run_dir / "logs.txt").read_text()
    assert "removed 3 temporary file(s) left by interrupted writers" in logs
    assert f".index.jsonl.{dead_pid}." in logs


# --------------------------------------------------------------------------- #
# 2. A full disk
# --------------------------------------------------------------------------- #


class FullDisk:
    """``os.write`` for a disk that fills up: after *after* journal records (``"journal"``)
    or *after* trajectories (``"trajectory"``), every write into the results tree fails
    with ENOSPC.

    ``where`` is the first write that meets the full disk: ``"journal"`` (an append, which
    writes half its line first, as a real short write does) or ``"trajectory"`` (a row's
    trajectory.json, written where the row ran). Each counts its own kind of write: rows
    run ahead, so how many journal records exist when a trajectory is written is not fixed.
    """

    def __init__(self, root: Path, *, after: int, where: str) -> None:
        self.root = str(root / ".osmosis" / "evals") + os.sep
        self.after = after
        self.where = where
        self.enabled = True
        self.full = False
        self.journal_writes = 0
        self.trajectory_writes = 0
        self.journal_writes_when_full: int | None = None
        self._write: Callable[[int, bytes], int] = os.write

    def _fill(self) -> None:
        self.full = True
        self.journal_writes_when_full = self.journal_writes

    def __call__(self, fd: int, data: bytes) -> int:
        if not self.enabled:
            return self._write(fd, data)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return self._write(fd, data)
        if not path.startswith(self.root):
            return self._write(fd, data)
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        journal = path.endswith(os.sep + "events.jsonl")
        trajectory = os.sep + "rollout_trials" + os.sep in path and ".trajectory.json." in path
        if self.where == "journal" and journal and self.journal_writes >= self.after:
            self._fill()
            return self._write(fd, bytes(data)[: max(1, len(data) // 2)])
        if self.where == "trajectory" and trajectory:
            if self.trajectory_writes >= self.after:
                self._fill()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.trajectory_writes += 1
        if journal:
            self.journal_writes += 1
        return self._write(fd, data)


@pytest.mark.parametrize("where", ["journal", "trajectory"])
def test_a_full_disk_stops_the_session_in_one_line_and_the_run_resumes(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    write_workspace(pytester.path, rows=six_rows())
    disk = FullDisk(pytester.path, after=2, where=where)
    monkeypatch.setattr(os, "write", disk)
    result = pytester.runpytest(*ARGS)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert disk.full and disk.journal_writes_when_full is not None
    run_dir = only_run_dir(pytester.path)
    shown = [line for line in out.splitlines() if "No space left on device" in line]
    assert len(shown) == 1, out
    # The journal append meets it on the thread that records; a trajectory meets it on
    # the row's, so the line names the trial, or the run's log if that was written first.
    assert str(run_dir / "events.jsonl" if where == "journal" else run_dir) in shown[0]
    assert "free space, then run the same command again to resume" in shown[0]
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert "failed" not in result.parseoutcomes(), out  # no row is blamed for the disk
    before = journal_lines(run_dir)
    assert len(before) == disk.journal_writes_when_full
    assert len(before) >= (2 if where == "journal" else 0)
    assert all(line.endswith(b"\n") for line in before)  # the torn append was cut off

    disk.enabled = False  # space freed
    resumed = pytester.runpytest(*ARGS)
    assert resumed.ret == pytest.ExitCode.OK, resumed.stdout.str()
    after = journal_lines(run_dir)
    assert after[: len(before)] == before and len(after) == 6
    assert "discarded a partial final record" not in (run_dir / "logs.txt").read_text()
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict


# --------------------------------------------------------------------------- #
# 3. The run directory deleted during the session
# --------------------------------------------------------------------------- #

DELETING_ROLLOUT = CALC_ROLLOUT.replace("import asyncio\n", "import asyncio\nimport shutil\n", 1)
DELETING_ROLLOUT = DELETING_ROLLOUT.replace(
    '        if do == "workflow_raise":\n',
    '        if do == "delete_run":  # a cleanup job, as seen from inside a row\n'
    "            shutil.rmtree(ctx.artifacts_dir.parents[2])\n"
    '        if do == "workflow_raise":\n',
    1,
)


def test_the_run_directory_deleted_during_the_session_stops_it_in_one_line(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    assert DELETING_ROLLOUT.count("delete_run") == 1
    rows = calc_rows([("What is 1 + 1?", "2"), ("What is 2 + 2?", "4", "delete_run")])
    rows += calc_rows([("What is 3 + 3?", "6"), ("What is 4 + 4?", "8")])
    write_workspace(
        pytester.path, rows=rows, rollout_source=DELETING_ROLLOUT, evaluation={"batch_size": 1}
    )
    result = pytester.runpytest(*ARGS)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    run_dir = pytester.path / ".osmosis" / "evals" / "run"
    shown = [line for line in out.splitlines() if "deleted or replaced" in line]
    assert len(shown) == 1, out
    assert f"the run directory {run_dir} was deleted or replaced during the session" in shown[0]
    assert "Traceback" not in out and "INTERNALERROR" not in out
    # Nothing claims the run finished: no snapshot was written into a recreated directory.
    assert not (run_dir / "metrics.json").exists()
    assert not (run_dir / "events.jsonl").exists()


def test_under_xdist_the_deleted_run_directory_stops_the_session_in_one_line(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    rows = calc_rows([("What is 1 + 1?", "2"), ("What is 2 + 2?", "4", "delete_run")])
    rows += calc_rows([(f"What is {i} + {i}?", str(2 * i)) for i in range(3, 7)])
    write_workspace(pytester.path, rows=rows, rollout_source=DELETING_ROLLOUT)
    result = pytester.runpytest_subprocess(*ARGS, "-n", "2")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    run_dir = pytester.path / ".osmosis" / "evals" / "run"
    shown = [line for line in out.splitlines() if "deleted or replaced" in line]
    assert len(shown) == 1, out
    assert f"the run directory {run_dir} was deleted or replaced during the session" in shown[0]
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert not (run_dir / "metrics.json").exists()
