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

    python bench/xdist_helps.py [--items 1000] [--batch 64] [--delay 0.2] [--sleep 0.2]
                                [--workers 2] [--repeat 2] [--route auto|litellm]
                                [--only model,sleep]
"""

from __future__ import annotations

import argparse

import _common as c


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
    for i in range(args.repeat):
        for label, xdist, bucket in (
            ("1 process", [], single),
            (f"-n {args.workers}", ["-n", str(args.workers)], dist),
        ):
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
            bucket.append(r)
    return single, dist


def check(
    name: str, target: str, limit: float, single: list[c.Run], dist: list[c.Run], workers: int
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
                )
            )
    c.print_runs(runs)
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 11: xdist helps", checks, args.json)


if __name__ == "__main__":
    main()
