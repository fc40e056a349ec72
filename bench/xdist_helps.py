"""Benchmark 11 — xdist must help, not hurt (issue 15.6).

The same eval, one process against ``-n 2`` (two cores), runs interleaved (single, -n 2,
single, -n 2, ...), the best wall of each side compared:

- through the model: 1,000 rows, each one model call through the bridge to the loopback
  model server answering after ``--delay`` (200 ms), ``batch_size = 64``. One process is
  CPU-bound here (the bridge, the rollout's client and the model call cost milliseconds
  of CPU each), so two workers should nearly halve it. Target: ``-n 2`` wall <= 0.6 x one
  process.
- no call: 1,000 rows awaiting 200 ms, 64 in flight (32 per worker). Nothing to gain from
  a second core; target: ``-n 2`` not slower than one process (<= 1.0 x).

Outer wall (spawn to exit) on both sides, so each worker's start-up (interpreter, plugin,
collection, LiteLLM's import where rows need it) is in the ``-n 2`` number. The route the
rows' calls take is what the plugin picks for an ``openai/`` model at a loopback base
(``--route litellm`` forces LiteLLM by setting ``OPENAI_ORGANIZATION``, a header only
LiteLLM sends).

Each side's CPU is also shown by process (controller, each worker, the model server:
Linux /proc, sampled every 0.1 s), with what it bounds: every process shares the two
cores, so ``-n 2``'s CPU over the cores, divided by one process's wall, is the best ratio
it could reach. A small run of ``--fixed-items`` rows per side splits that CPU into what
a run costs whatever its size (interpreters, plugins, collection, the run directory's
finish: three processes start under ``-n 2``) and what each row costs.

    python bench/xdist_helps.py [--items 1000] [--batch 64] [--delay 0.2] [--sleep 0.2]
                                [--workers 2] [--repeat 2] [--fixed-items 16]
                                [--route auto|litellm] [--only model,sleep]
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import _common as c

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_of(pid: int) -> float | None:
    """User + system seconds of one process so far (Linux /proc), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found += [int(x) for x in fh.read().split()]
        except OSError:
            pass
    return found


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return "?"
    if any(arg.endswith(b"model_server.py") for arg in argv):
        return "model server"
    if b"pytest_osmosis.model.bridge_process" in argv:  # the session's bridge, on its own
        return "bridge process"
    if b"pytest" in argv:
        return "pytest"
    if b"-c" in argv:  # execnet's popen bootstrap: an xdist worker
        return "worker"
    return "?"


@contextmanager
def cpu_by_process(into: dict[str, float], interval: float = 0.1) -> Iterator[None]:
    """Sample this benchmark's descendants' CPU from /proc while the block runs.

    ``into`` gets the CPU each role spent in the block: "controller" (the pytest process,
    which also runs the rows without xdist), "worker 1", "worker 2"... (by start order)
    and "model server" (its delta; it serves every run). A process's last sample is taken up
    to ``interval`` before it exits, so a worker's figure can be short by that much CPU.
    Nothing is recorded where /proc is missing.
    """
    if not os.path.isdir("/proc/self/task"):
        yield
        return
    seen: dict[int, tuple[str, float, float]] = {}  # pid -> (role, first cpu, last cpu)
    done = threading.Event()

    def sample() -> None:
        todo = [os.getpid()]
        while todo:
            pid = todo.pop()
            for child in _children(pid):
                cpu = _cpu_of(child)
                if cpu is None:
                    continue
                role, first, _ = seen.get(child, (_role(child), cpu, cpu))
                seen[child] = (role, first, cpu)
                todo.append(child)

    def poll() -> None:
        while not done.wait(interval):
            sample()

    sample()
    for pid in [pid for pid, (role, _, _) in seen.items() if role != "model server"]:
        del seen[pid]  # not this run's
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        by_role = [seen[pid] for pid in sorted(seen)]
        into["controller"] = sum(last for role, _, last in by_role if role == "pytest")
        workers = [last for role, _, last in by_role if role == "worker"]
        into.update((f"worker {i}", cpu) for i, cpu in enumerate(workers, 1))
        helpers = [last for role, _, last in by_role if role == "bridge process"]
        if helpers:
            into["bridge process"] = sum(helpers)
        into["model server"] = sum(
            last - first for role, first, last in by_role if role == "model server"
        )


#: Each run's CPU by process (cpu_by_process), by run label.
CPU_BY_RUN: dict[str, dict[str, float]] = {}


#: Each workload's small runs (``--fixed-items``): CPU by process, one process and -n.
FIXED: dict[str, tuple[dict[str, float], dict[str, float]]] = {}


def cpu_notes(
    single: list[c.Run], dist: list[c.Run], workers: int, fixed: tuple[dict[str, float], ...]
) -> list[str]:
    """Where the best run of each side spent its CPU, and what that bounds on this machine.

    Every process shares the cores, the model server's included, so a run's wall is at
    least the CPU of all of them over the cores: for ``-n`` that floor, over one process's
    wall, is the best ratio it could reach, however its work were spread. With the small
    runs (``fixed``), each side's CPU splits into what a run costs whatever its size (the
    interpreters' start-up, collection, the run directory's finish) and what a row costs.
    """
    cores = os.cpu_count() or 1
    notes = []
    one_wall = min(r.wall for r in single)
    for (side, runs), small in zip(
        (("one process", single), (f"-n {workers}", dist)), fixed or ({}, {}), strict=True
    ):
        best = min(runs, key=lambda r: r.wall)
        cpu = CPU_BY_RUN.get(best.label)
        if not cpu:
            continue
        total = sum(cpu.values())
        parts = ", ".join(f"{role} {seconds:.2f}" for role, seconds in cpu.items())
        line = f"CPU by process, {side} (best): {parts} s; all {total:.2f} s"
        if runs is dist:
            line += (
                f"; / {cores} cores = {total / cores:.2f} s, a floor of "
                f"{total / cores / one_wall:.2f} x one process's wall"
            )
        notes.append(line)
        if small:
            rows = best_items(best) - FIXED_ITEMS[0]
            per_row = {
                role: (cpu[role] - small.get(role, 0.0)) / rows * 1000
                for role in cpu
                if role != "model server"
            }
            notes.append(
                f"  of which fixed ({FIXED_ITEMS[0]} rows): "
                + ", ".join(f"{role} {small.get(role, 0.0):.2f}" for role in per_row)
                + f" s; per row (CPU over all {rows} rows): "
                + ", ".join(f"{role} {ms:.2f}" for role, ms in per_row.items())
                + f" ms (all {sum(per_row.values()):.2f} ms)"
            )
    return notes


#: The small runs' size (``--fixed-items``), and each measured run's row count.
FIXED_ITEMS = [0]
ITEMS_BY_RUN: dict[str, int] = {}


def best_items(run: c.Run) -> int:
    return ITEMS_BY_RUN.get(run.label, 0)


def measure(
    args: argparse.Namespace, workload: str, env: dict[str, str], tmp: c.Path
) -> tuple[list[c.Run], list[c.Run]]:
    """``repeat`` interleaved pairs (one process, then ``-n workers``) of one workload."""
    ws = c.eval_workspace(tmp / f"ws-{workload}", args.items, batch_size=args.batch)
    if workload == "model":
        extra = {"BENCH_MODE": "bridge", "BENCH_CLIENT": args.client}
        what = f"{args.items} model calls ({args.delay * 1000:g} ms)"
    else:
        extra = {"BENCH_SLEEP": str(args.sleep)}
        what = f"{args.items} x await {args.sleep * 1000:g} ms"
    if args.route == "litellm":
        extra["OPENAI_ORGANIZATION"] = "org-bench"
    single: list[c.Run] = []
    dist: list[c.Run] = []
    if args.fixed_items:
        small_ws = c.eval_workspace(
            tmp / f"ws-{workload}-small", args.fixed_items, batch_size=args.batch
        )
        FIXED_ITEMS[0] = args.fixed_items
        small: list[dict[str, float]] = []
        for xdist in ([], ["-n", str(args.workers)]):
            cpu: dict[str, float] = {}
            with cpu_by_process(cpu):
                c.run(
                    f"{args.fixed_items} rows {' '.join(xdist)}",
                    c.osmosis_cmd(
                        f"--osmosis-output={tmp / f'out-{workload}-small-{len(xdist)}'}", *xdist
                    ),
                    cwd=small_ws,
                    env={**env, **extra},
                ).check(f"{args.fixed_items} passed")
            small.append(cpu)
        FIXED[workload] = (small[0], small[1])
    for i in range(args.repeat):
        for label, xdist, bucket in (
            ("1 process", [], single),
            (f"-n {args.workers}", ["-n", str(args.workers)], dist),
        ):
            cpu = {}
            with cpu_by_process(cpu):
                r = c.run(
                    f"{label}, {what} #{i + 1}",
                    # --osmosis-output=DIR, joined: the space form makes a worker re-run its
                    # session without its workerinput once the controller created DIR.
                    c.osmosis_cmd(
                        f"--osmosis-output={tmp / f'out-{workload}-{len(xdist)}-{i}'}", *xdist
                    ),
                    cwd=ws,
                    env={**env, **extra},
                ).check(f"{args.items} passed")
            CPU_BY_RUN[r.label] = cpu
            ITEMS_BY_RUN[r.label] = args.items
            bucket.append(r)
    return single, dist


def check(
    name: str,
    target: str,
    limit: float,
    single: list[c.Run],
    dist: list[c.Run],
    workers: int,
    fixed: tuple[dict[str, float], ...] = (),
) -> c.Check:
    one, many = min(r.wall for r in single), min(r.wall for r in dist)
    return c.Check(
        name,
        f"-n {workers} {many:.2f} s vs one process {one:.2f} s (best of {len(dist)} each)",
        target,
        many / one,
        limit,
        notes=[
            "wall each: one process "
            + ", ".join(f"{r.wall:.2f}" for r in single)
            + f" s; -n {workers} "
            + ", ".join(f"{r.wall:.2f}" for r in dist)
            + " s",
            f"CPU (all processes, best): one process {min(r.cpu for r in single):.2f} s, "
            f"-n {workers} {min(r.cpu for r in dist):.2f} s",
            f"pytest 'in X s' (best): one process "
            f"{min(r.pytest_seconds or 0 for r in single):.2f} s, -n {workers} "
            f"{min(r.pytest_seconds or 0 for r in dist):.2f} s",
            *cpu_notes(single, dist, workers, fixed),
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--delay", type=float, default=0.2, help="model server delay, s")
    parser.add_argument("--sleep", type=float, default=0.2, help="no-call workload's await, s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--fixed-items",
        type=int,
        default=16,
        help="rows of one small run per side, to split CPU into fixed and per row (0: none)",
    )
    parser.add_argument(
        "--client",
        choices=("httpx", "aiohttp", "httpx-per-call", "bridge_client"),
        default="httpx",
        help="the rollout's HTTP client in the through-the-model workload",
    )
    parser.add_argument(
        "--route",
        choices=("auto", "litellm"),
        default="auto",
        help="auto: the route the plugin picks; litellm: force the calls through LiteLLM",
    )
    parser.add_argument(
        "--only", default="model,sleep", help="comma-separated workloads: model, sleep"
    )
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    only = set(args.only.split(","))
    c.header("xdist helps")
    checks: list[c.Check] = []
    runs: list[c.Run] = []
    with c.tempdir("bench-xdist-helps-") as tmp:
        if "model" in only:
            with c.model_server(args.delay) as env:
                single, dist = measure(args, "model", env, tmp)
            runs += single + dist
            checks.append(
                check(
                    f"xdist: -n {args.workers} through the model (route {args.route})",
                    f"-n {args.workers} wall <= 0.6 x one process",
                    0.6,
                    single,
                    dist,
                    args.workers,
                    FIXED.get("model", ()),
                )
            )
        if "sleep" in only:
            with c.model_server(0.0) as env:  # answers the preflight only
                single, dist = measure(args, "sleep", env, tmp)
            runs += single + dist
            checks.append(
                check(
                    f"xdist: -n {args.workers} no model call, 200 ms rows",
                    f"-n {args.workers} wall <= 1.0 x one process",
                    1.0,
                    single,
                    dist,
                    args.workers,
                    FIXED.get("sleep", ()),
                )
            )
    c.print_runs(runs)
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 11: xdist helps", checks, args.json)


if __name__ == "__main__":
    main()
