"""Benchmark 11 — instructions per work item under callgrind (issue 13, issue 15 target 8).

Load-independent: the machine is shared, so wall and CPU time per item wander by tens of
percent between runs, but the instructions the process executes do not. An instant
workflow and grader (no model call) over N rows, run as

    valgrind --tool=callgrind python -m pytest --osmosis-eval -q -p no:cacheprovider

at N = ``--small`` (50) and N = ``--large`` (350); per item = (I(large) - I(small)) /
(large - small). Each side is measured for this checkout and for ``--baseline`` (6514c34,
the commit before issue 13's redesign), checked out in a temporary ``git worktree``, in the
same conditions; target: this checkout <= the baseline. ``--commit SHA`` (repeatable)
prints other commits beside them.

Fixed costs drop out by difference, so they need not run instrumented: callgrind starts
with instrumentation off (``--instr-atstart=no``, ~5x slower than native instead of ~50x),
a conftest in the workspace imports LiteLLM the way the session does (GC paused, then
frozen) while it is off, and turns it on (``callgrind_control -i on``) at
``pytest_sessionstart``, before the plugin's own start-up, which opens the run directory
and reads the dataset. Everything from there to exit is counted: collection, every
item's protocol, the workflow and grader on the executor's thread, the results files and
the end of the session. ``PYTHONHASHSEED=0``. Each commit's package is byte-compiled
before its runs, so no run pays for compiling a module the other does not. Counts are
not exactly repeatable (the loop thread's wake-ups follow the scheduler); how much they
vary run to run has not been measured yet, so read differences under ~1 % of I(large)
as noise.

    python bench/instructions.py [--small 50] [--large 350] [--baseline 6514c34]
                                 [--commit SHA ...] [--json FILE]

About 8 minutes per commit (measured at load 5 on this 2-core machine). ``--baseline ''``
measures this checkout only (the check's ratio is then 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import _common as c

DEFAULT_BASELINE = "6514c34"

# Loaded from the workspace's rootdir; inert without BENCH_CALLGRIND (a plain run).
TOGGLE = '''
"""Benchmark 11: fixed costs run uninstrumented; counting starts at session start."""
import gc
import os
import subprocess

import pytest

if os.environ.get("BENCH_CALLGRIND"):
    # The session imports LiteLLM the same way (GC paused, then frozen); here it is done
    # before counting starts, and the session then finds it imported.
    gc.disable()
    import litellm  # noqa: F401
    gc.freeze()
    gc.enable()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionstart(session):
    if os.environ.get("BENCH_CALLGRIND"):
        subprocess.run(
            ["callgrind_control", "-i", "on", str(os.getpid())],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    yield
'''


@dataclass
class Measured:
    """One commit's instruction counts at the two sizes."""

    label: str
    small: int
    large: int
    items: int  # large - small

    @property
    def per_item(self) -> float:
        return (self.large - self.small) / self.items


def instructions(
    src: Path, workspace: Path, rows: int, out: Path, env: dict[str, str], python: str
) -> int:
    """Instructions counted by one callgrind run of the eval session in ``workspace``."""
    profile = out.with_suffix(".callgrind")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={profile}",
        python,
        "-m",
        "pytest",
        "--osmosis-eval",
        "-q",
        "-p",
        "no:cacheprovider",
        "--osmosis-output",
        str(out),
    ]
    full_env = {**os.environ, **c.OFFLINE_ENV, **env}
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        full_env.pop(name, None)
    full_env.update(
        PYTHONPATH=str(src),  # the measured commit's plugin source, over any installed one
        PYTHONHASHSEED="0",
        BENCH_SLEEP="0",
        BENCH_CALLGRIND="1",
    )
    proc = subprocess.run(cmd, cwd=workspace, env=full_env, capture_output=True, text=True)
    if proc.returncode != 0 or f"{rows} passed" not in proc.stdout:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).splitlines()[-30:])
        raise SystemExit(f"callgrind run failed (rc {proc.returncode}) in {workspace}:\n{tail}")
    for line in profile.read_text(errors="replace").splitlines():
        if line.startswith("totals:") or line.startswith("summary:"):
            total = int(line.split()[1])
            profile.unlink()
            return total
    raise SystemExit(f"no totals in {profile}")


@contextlib.contextmanager
def checkout(commit: str, where: Path) -> Iterator[Path]:
    """``commit`` in a temporary detached git worktree (removed afterwards)."""
    git = ["git", "-C", str(c.REPO)]
    subprocess.run(
        [*git, "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run([*git, "worktree", "prune"], capture_output=True)


def short(commit: str) -> str:
    found = subprocess.run(
        ["git", "-C", str(c.REPO), "rev-parse", "--short", commit],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not found:
        raise SystemExit(f"commit {commit!r} is not in this repository")
    return found


def measure_all(
    commits: list[str], small: int, large: int, python: str
) -> tuple[Measured, list[Measured]]:
    """This checkout, then each commit, each at both sizes, in one set of workspaces."""
    with c.tempdir("bench-instructions-") as tmp, c.model_server(0.0) as env:
        workspaces = {}
        for n in (small, large):
            ws = c.eval_workspace(tmp / f"ws{n}", n)
            (ws / "conftest.py").write_text(TOGGLE)
            workspaces[n] = ws

        def one(label: str, src: Path) -> Measured:
            # Bytecode first, uncounted: a fresh checkout (the baseline's worktree) would
            # otherwise compile the modules the session imports lazily inside the first,
            # small run only, which lowers that commit's per-item figure by difference.
            subprocess.run(
                [python, "-m", "compileall", "-q", str(src / "pytest_osmosis")],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            counts = {}
            for n in (small, large):
                counts[n] = instructions(
                    src, workspaces[n], n, tmp / f"out-{label}-{n}", env, python
                )
                print(f"  {label:>16} {n:5} rows: {counts[n]:,} instructions", flush=True)
            return Measured(label, counts[small], counts[large], large - small)

        here = one(c.plugin_version(), c.REPO)
        others = []
        for commit in commits:
            with checkout(commit, tmp / f"src-{short(commit)}") as src:
                others.append(one(short(commit), src))
    return here, others


def checks(here: Measured, baseline: Measured | None, others: list[Measured]) -> list[c.Check]:
    notes = [
        f"{m.label}: {m.per_item / 1e6:.3f} M/item (I(small) {m.small / 1e9:.3f} G, "
        f"I(large) {m.large / 1e9:.3f} G)"
        for m in [here, *others]
    ]
    if baseline is None:
        measured = f"{here.per_item / 1e6:.3f} M instructions/item at {here.label}"
        ratio = 1.0
    else:
        measured = (
            f"{here.per_item / 1e6:.3f} M instructions/item at {here.label} vs "
            f"{baseline.per_item / 1e6:.3f} M at {baseline.label}"
        )
        ratio = here.per_item / baseline.per_item
    return [
        c.Check(
            "instructions per item (callgrind)",
            measured,
            "per-item instructions <= the baseline commit's (issue 13: no slower)",
            ratio,
            1.0,
            notes=notes,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--large", type=int, default=350)
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help="the commit this checkout must not exceed ('' for none)",
    )
    parser.add_argument(
        "--commit", action="append", default=[], help="also measure this commit (repeatable)"
    )
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (callgrind) is not installed: apt-get install valgrind")
    c.header("instructions per item")
    commits = ([args.baseline] if args.baseline else []) + args.commit
    here, others = measure_all(commits, args.small, args.large, c.PYTHON)
    print(f"after: {c.loadavg()}")
    baseline = others[0] if args.baseline else None
    c.finish("benchmark 11: instructions per item", checks(here, baseline, others), args.json)


if __name__ == "__main__":
    main()
