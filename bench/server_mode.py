"""Benchmark — server mode (issue 24, design.md §3).

1,000 work items whose workflow awaits 200 ms, ``batch_size = 64``, one process, run three
ways in one invocation: the plugin in process, the plugin in server mode (the rollout on
its own server, driven over the rollout protocol as ``osmosis eval run`` drives it), and
``osmosis eval run`` itself (``_common.sdk_run``). Targets: server mode's wall <= 1.3 x
in-process mode's and <= 0.5 x the SDK's. Then start-up to the first result on a terminal
(a 5-row smoke run, ``first_result.on_a_terminal``): server mode's <= the SDK's.

The rollout servers run on this interpreter (no ``pyproject.toml``: no uv sync), as the
SDK's side does with ``server_interpreter``; both need ``osmosis-ai`` and ``uvicorn``.

    python bench/server_mode.py [--items 1000] [--sleep 0.2] [--batch 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import sys

import _common as c
import first_result as fr


def measure(items: int, sleep: float, batch: int, repeat: int, sdk: bool) -> dict[str, list[c.Run]]:
    runs: dict[str, list[c.Run]] = {"in-process": [], "server": [], "sdk": []}
    with c.tempdir("bench-server-") as tmp, c.model_server(0.0) as env:
        ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
        slow = {**env, "BENCH_SLEEP": str(sleep)}
        for i in range(repeat):
            for mode in ("in-process", "server"):
                out = tmp / f"out-{mode}-{i}"
                runs[mode].append(
                    c.run(
                        f"plugin {mode} {items} x {sleep * 1000:g} ms #{i + 1}",
                        c.osmosis_cmd("--osmosis-execution", mode, output=out),
                        cwd=ws,
                        env=slow,
                    ).check(f"{items} passed")
                )
            if not sdk:
                continue
            runs["sdk"].append(
                c.sdk_run(
                    f"osmosis eval run {items} x {sleep * 1000:g} ms #{i + 1}",
                    ws,
                    output=tmp / f"sdk-{i}",
                    batch_size=batch,
                    env=slow,
                    rows=items,
                )
            )
    return runs


def first_results(repeat: int, sdk: bool) -> dict[str, list[float]]:
    """Seconds from spawn to the first result on a terminal: ours in server mode, the SDK's."""
    seen: dict[str, list[float]] = {"server": [], "sdk": []}
    with c.tempdir("bench-server-first-") as tmp, c.model_server(0.05) as env:
        root = fr.workspace(tmp / "ws", "openai/bench")
        argv = [c.PYTHON, "-m", "pytest", "--osmosis-eval", "-v", "-p", "no:cacheprovider"]
        for i in range(repeat):
            ours = fr.on_a_terminal(
                f"server #{i + 1}",
                [*argv, "--osmosis-execution", "server", "--osmosis-fresh"],
                root,
                env,
            )
            at = ours.first(r"\b(PASSED|FAILED|ERROR)\b|osmosis [1-9]\d*/")
            if ours.rc != 0 or at is None:
                raise SystemExit(f"server mode's smoke run failed:\n{ours.text()[-3000:]}")
            seen["server"].append(at)
            if not sdk:
                continue
            theirs = fr.theirs(root, env, f"sdk #{i + 1}")
            first = theirs.first(r"^FIRST RESULT")
            if theirs.rc != 0 or first is None:
                raise SystemExit(f"the SDK's smoke run failed:\n{theirs.text()[-3000:]}")
            seen["sdk"].append(first)
    return seen


def checks(runs: dict[str, list[c.Run]], first: dict[str, list[float]]) -> list[c.Check]:
    inproc = min(r.wall for r in runs["in-process"])
    server = min(r.wall for r in runs["server"])
    cpu = {mode: min(r.cpu for r in group) for mode, group in runs.items() if group}
    checks = [
        c.Check(
            "server mode vs in process",
            f"wall {server:.2f} s vs {inproc:.2f} s in process",
            "wall <= 1.3 x in-process",
            server / inproc,
            1.3,
            notes=[
                f"CPU (with children): server {cpu['server']:.2f} s, "
                f"in process {cpu['in-process']:.2f} s",
                f"median of {len(runs['server'])}: "
                f"{c.median([r.wall for r in runs['server']]):.2f} s vs "
                f"{c.median([r.wall for r in runs['in-process']]):.2f} s",
            ],
        ),
    ]
    if not runs["sdk"]:
        return checks
    sdk = min(r.wall for r in runs["sdk"])
    ours_first, sdk_first = min(first["server"]), min(first["sdk"])
    return [
        *checks,
        c.Check(
            "server mode vs osmosis eval run",
            f"wall {server:.2f} s vs the SDK's {sdk:.2f} s",
            "wall <= 0.5 x the SDK's",
            server / sdk,
            0.5,
            notes=[f"CPU (with children): the SDK {cpu['sdk']:.2f} s"],
        ),
        c.Check(
            "server mode start-up to first result",
            f"{ours_first:.2f} s vs the SDK's {sdk_first:.2f} s (5 rows, one call a row)",
            "<= the SDK's",
            ours_first / sdk_first,
            1.0,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    if not c.sdk_installed():
        sys.exit("server mode needs osmosis-ai and uvicorn in this interpreter")
    c.header("server mode")
    runs = measure(args.items, args.sleep, args.batch, args.repeat, not args.no_sdk)
    first = first_results(max(1, args.repeat), not args.no_sdk)
    c.print_runs([run for group in runs.values() for run in group])
    print(f"first result (s): {first}")
    print(f"after: {c.loadavg()}")
    c.finish("benchmark: server mode", checks(runs, first), args.json)


if __name__ == "__main__":
    main()
