"""Kill -9 at random moments (issue 6, point 3): a named run survives SIGKILL and resumes.

A seeded random schedule kills the whole session (its process group, xdist workers
included) 20 times: after a random delay (which lands anywhere: start-up, preflight,
mid-row, between journal appends) or as soon as the journal reached a random count.
Each time the same command resumes the run. At the end every (row, attempt) is in
``index.jsonl`` exactly once, the journal holds exactly one complete record per work
item, no row was sent to the model again after its results were journalled (rows are
told apart by unique questions; a row killed in flight may legitimately run twice, since
nothing of it was recorded), the run is ``finished``, and the SDK's own upload planner
accepts it.

Sessions are forked from a warm "zygote" process that has already imported pytest,
the plugin and LiteLLM (3-9 s per fresh interpreter), so 20 kills fit in well under a
minute; each session is still its own process running ``pytest.main``, killed without
any chance to clean up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from sdk_planner import sdk_judge
from workspaces import calc_rows, read_index, write_workspace

SEED = 20260611
KILLS = 20

ZYGOTE = r"""
import json, os, sys, threading
import litellm, pytest, xdist, httpx, aiohttp  # the expensive imports, done once
import pytest_osmosis.plugin, pytest_osmosis.plugin.session, pytest_osmosis.model.bridge
import pytest_osmosis.plugin.collect, pytest_osmosis.results, pytest_osmosis.plugin.xdist
assert threading.active_count() == 1, threading.enumerate()  # fork-safe: one thread

def reply(payload):
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()

reply({"ready": True})
for line in sys.stdin:
    command = json.loads(line)
    if command["op"] == "run":
        pid = os.fork()
        if pid == 0:
            os.setpgrp()  # the test kills the whole group: this session and its workers
            out = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.chdir(command["cwd"])
            os.environ.update(command["env"])
            code = 3
            try:
                code = int(pytest.main(command["args"]))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        reply({"pid": pid})
    elif command["op"] == "poll":
        try:
            pid, status = os.waitpid(command["pid"], 0 if command.get("block") else os.WNOHANG)
        except ChildProcessError:
            reply({"done": True, "code": None, "signal": None})
            continue
        if pid == 0:
            reply({"done": False})
        else:
            reply({
                "done": True,
                "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            })
"""


class Zygote:
    """A warm process that forks pytest sessions on request and reaps them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the zygote died"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def run(self, cwd: Path, args: list[str], log: Path, env: dict[str, str]) -> int:
        """Fork a session running ``pytest.main(args)`` in *cwd*; returns its pid."""
        reply = self._ask(op="run", cwd=str(cwd), args=args, log=str(log), env=env)
        pid: int = reply["pid"]
        return pid

    def poll(self, pid: int, *, block: bool = False) -> dict[str, Any]:
        return self._ask(op="poll", pid=pid, block=block)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    warm = Zygote()
    yield warm
    warm.close()


@pytest.fixture
def server(model_loop: Any) -> Iterator[ModelServer]:
    model = ModelServer(delay=0.25).start(loop=model_loop.loop)
    yield model
    model.stop()


def journal_records(run_dir: Path) -> list[dict[str, Any]]:
    """Complete journal lines (a torn last line, left by a kill, is not a record)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def questions(server: ModelServer) -> Counter[str]:
    return Counter(
        body["messages"][-1]["content"]
        for body in list(server.bodies)
        if body["messages"][-1]["content"] != "hi"  # the preflight
    )


def kill_and_resume(
    zygote: Zygote,
    server: ModelServer,
    root: Path,
    *,
    rows: int,
    n: int,
    kills: int,
    extra: tuple[str, ...] = (),
    max_delay: float,
) -> tuple[Path, list[str]]:
    """Run the named run under ``kills`` random SIGKILLs, then to completion; check it."""
    rng = random.Random(SEED + len(extra))
    args = ["--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "k", "-q", *extra]
    run_dir = root / ".osmosis" / "evals" / "k"
    # Per row, the model requests seen when each work item of that row was first journalled.
    seen_when_done: dict[int, int] = {}
    moments: list[str] = []
    landed = 0
    attempt = 0
    while landed < kills:
        attempt += 1
        assert attempt <= kills * 3, f"the run finished before {kills} kills landed: {moments}"
        before = len(journal_records(run_dir))
        log = root / f"session-{attempt}.log"
        pid = zygote.run(root, args, log, server.env())
        if rng.random() < 0.5:
            delay = rng.uniform(0.0, max_delay)
            what = f"after {delay:.2f} s"
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not zygote.poll(pid)["done"]:
                time.sleep(0.01)
        else:
            target = before + rng.randint(1, 3)
            what = f"at journal record {target}"
            deadline = time.monotonic() + 60
            while len(journal_records(run_dir)) < target and not zygote.poll(pid)["done"]:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.005)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = zygote.poll(pid, block=True)
        if status["signal"] == signal.SIGKILL:
            landed += 1
            moments.append(what)
        else:
            assert status["code"] in (0, 1), log.read_text()
            moments.append(f"{what}: exited {status['code']} before the kill")
        time.sleep(0.3)  # requests already on the wire still reach the server
        asked = questions(server)
        for record in journal_records(run_dir):
            row = record["row_index"]
            done = sum(1 for r in journal_records(run_dir) if r["row_index"] == row)
            if done >= n and row not in seen_when_done:
                seen_when_done[row] = asked[f"What is {row} + 7?"]
    final = root / "final.log"
    pid = zygote.run(root, args, final, server.env())
    status = zygote.poll(pid, block=True)
    assert status["code"] in (0, 1), final.read_text()

    index = read_index(run_dir)
    keys = [(r["row_index"], r["run_index"]) for r in index]
    assert keys == [(r, i) for r in range(rows) for i in range(n)], final.read_text()
    records = journal_records(run_dir)
    assert Counter((r["row_index"], r["run_index"]) for r in records) == Counter(keys)
    assert {r["rollout_id"] for r in records} == {r["rollout_id"] for r in index}
    assert all(r["status"] == "success" for r in index), index
    asked = questions(server)
    repeated = {
        row: (count, asked[f"What is {row} + 7?"])
        for row, count in seen_when_done.items()
        if asked[f"What is {row} + 7?"] != count
    }
    assert not repeated, f"rows run again after they were journalled: {repeated}"
    assert all(asked[f"What is {row} + 7?"] >= n for row in range(rows))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert metrics["summary"]["total_samples"] == rows * n
    verdict = sdk_judge(run_dir)
    assert verdict["accepted"], verdict
    return run_dir, moments


def _workspace(root: Path, rows: int, n: int) -> None:
    write_workspace(
        root,
        rows=calc_rows([(f"What is {i} + 7?", str(i + 7)) for i in range(rows)]),
        evaluation={"n": n, "batch_size": 2},
    )


def test_twenty_random_kills_lose_nothing_and_run_nothing_twice(
    zygote: Zygote, server: ModelServer, tmp_path: Path
) -> None:
    rows, n = 36, 2
    _workspace(tmp_path, rows, n)
    run_dir, moments = kill_and_resume(
        zygote, server, tmp_path, rows=rows, n=n, kills=KILLS, max_delay=2.5
    )
    print("kill moments:", moments)
    assert sum(1 for m in moments if "before the kill" not in m) == KILLS
    assert (run_dir / "logs.txt").exists()


def test_random_kills_under_xdist(zygote: Zygote, server: ModelServer, tmp_path: Path) -> None:
    rows, n = 16, 2
    _workspace(tmp_path, rows, n)
    _, moments = kill_and_resume(
        zygote, server, tmp_path, rows=rows, n=n, kills=5, extra=("-n", "2"), max_delay=12.0
    )
    print("kill moments:", moments)


# -- the xdist controller killed: its workers stop at once -----------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_of_a_killed_controller_stop_and_call_no_model(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """SIGKILL of the controller while each worker's row waits on the model: the workers
    notice and exit on their own (nobody can tell them), and when the model then answers,
    no row makes its next call (each row would make three)."""
    from workspaces import HELD, PID_ROLLOUT, Background, gone, pid_rows, wait_until

    root = pytester.path
    write_workspace(
        root,
        rows=pid_rows(root, 2, calls=3),
        rollout_source=PID_ROLLOUT,
        evaluation={"batch_size": 2},  # one row per worker
    )
    model_env.hold = HELD
    session = Background(
        pytester, "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "orphan", "-n", "2"
    )
    wait_until(lambda: model_env.holding == 2, "a row of each worker waits on the model")
    workers = {int(p.name) for p in (root / "pids").iterdir()}
    assert len(workers) == 2
    (controller,) = {_parent(pid) for pid in workers}
    calls = model_env.requests_total
    os.kill(controller, signal.SIGKILL)
    # Each worker says it noticed (on the stderr it shares with its controller) and exits.
    # Without the watch, execnet only shuts a worker down 15 s later (interrupt, then exit);
    # an answer in those 15 s would be followed by the row's next (paid) call.
    stderr = root / "stderr"
    wait_until(
        lambda: stderr.read_text().count("the xdist controller is gone") == 2,
        "both workers noticed",
        120,
    )
    wait_until(lambda: all(gone(pid) for pid in workers), "the workers are gone", 120)
    model_env.hold = ""  # the rows' calls are answered now: nobody is left to call again
    session.join()
    assert model_env.requests_total == calls
    run_dir = root / ".osmosis" / "evals" / "orphan"
    assert not (run_dir / "index.jsonl").exists() or not read_index(run_dir)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[1])


# -- without xdist: a row that kills the interpreter -----------------------------------


def test_a_row_that_kills_the_session_is_recorded_by_the_next_one(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """Row 1 calls ``os._exit`` (one process, no xdist): the next session records it
    ``worker_crashed``, naming it, runs the others, and the run finishes, uploadable."""
    from workspaces import PID_ROLLOUT, pid_rows

    root = pytester.path
    armed = root / "armed"
    armed.touch()
    rows = pid_rows(root, 3)
    rows[1]["metadata"]["exit"] = str(armed)
    write_workspace(root, rows=rows, rollout_source=PID_ROLLOUT, evaluation={"batch_size": 1})
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "dies")
    first = pytester.runpytest_subprocess(*args)
    assert first.ret == 7, first.stdout.str()
    second = pytester.runpytest_subprocess(*args)
    out = second.stdout.str()
    assert second.ret == 1, out
    run_dir = root / ".osmosis" / "evals" / "dies"
    records = {r["row_index"]: (r["status"], r.get("error_type")) for r in read_index(run_dir)}
    assert records == {
        0: ("success", None),
        1: ("failed", "worker_crashed"),
        2: ("success", None),
    }, out
    assert "called os._exit(7) and ended the previous session" in (run_dir / "logs.txt").read_text()
    crashed = [line for line in out.splitlines() if "row 1 run 0:" in line]
    assert crashed and "rollout_trials" not in crashed[0], out  # it left no trial directory
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "finished"
    assert sdk_judge(run_dir)["accepted"]
    armed.unlink()
    third = pytester.runpytest_subprocess(*args, "--osmosis-retry-failed")
    third.assert_outcomes(passed=3)


FINISHED_AHEAD_ROLLOUT = r"""
import asyncio
import os
from pathlib import Path

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        meta = ctx.metadata
        if meta.get("dies"):
            # Wait (by events, not time) until the other rows' trajectories are written,
            # then give their tasks a few loop turns to complete, and end the process.
            trials = Path(meta["run_dir"], "rollout_trials")
            while len(list(trials.glob("*/trajectory.json"))) < int(meta["others"]):
                await asyncio.sleep(0.02)
            for _ in range(50):
                await asyncio.sleep(0)
            os._exit(7)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "ok"}])


class AlwaysRight(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)
"""


def test_rows_finished_ahead_of_a_row_calling_os_exit_are_kept(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """Row 0 ends the process after rows 1 and 2 finished ahead of it (started at once,
    not reported yet): their results are journalled before the process ends, so the next
    session records row 0 ``worker_crashed`` and runs nothing else again."""
    root = pytester.path
    run_dir = root / ".osmosis" / "evals" / "ahead"
    rows = [
        {"user_prompt": f"row {i}", "ground_truth": "ok", "metadata": {"i": i}} for i in range(3)
    ]
    rows[0]["metadata"].update(dies=True, run_dir=str(run_dir), others=2)
    write_workspace(
        root, rows=rows, rollout_source=FINISHED_AHEAD_ROLLOUT, evaluation={"batch_size": 3}
    )
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "ahead")
    first = pytester.runpytest_subprocess(*args, "--osmosis-concurrency", "3")
    assert first.ret == 7, first.stdout.str()
    journal = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert sorted(r["row_index"] for r in journal) == [1, 2], journal
    second = pytester.runpytest_subprocess(*args)
    out = second.stdout.str()
    assert second.ret == 1, out
    records = {r["row_index"]: (r["status"], r.get("error_type")) for r in read_index(run_dir)}
    assert records == {
        0: ("failed", "worker_crashed"),
        1: ("success", None),
        2: ("success", None),
    }, out
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert len(lines) == 3, lines  # rows 1 and 2 were not run (and journalled) again


# -- Ctrl-C twice during the preflight wait --------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_a_second_interrupt_during_the_preflight_exits_at_once_and_resumably(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """The model holds the preflight's request. The first SIGINT says how to leave at
    once; the second one leaves: one line, no traceback, exit 2, every row pending."""
    from workspaces import wait_until

    root = pytester.path
    write_workspace(root)
    model_env.hold = "hi"  # the preflight's message (no row's question contains it)
    log = root / "session.log"
    args = ["--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "ctrlc"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args], cwd=root, stdout=out, stderr=out
        )
    try:
        wait_until(lambda: model_env.holding == 1, "the preflight waits on the model")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: b"Ctrl-C again" in log.read_bytes(), "the first interrupt is seen")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: proc.poll() is not None, "the session exits", 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert text.count("exiting now") == 1, text
    model_env.hold = ""
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2)
