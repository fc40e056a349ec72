"""Benchmark 3 — against plain ``pytest -n 2`` (issue 4 §7, design.md §3).

The 200 ms workload run the way pytest runs it without the plugin: 1,000 parametrized
tests, each ``time.sleep(0.2)``, on two xdist workers, one item at a time per worker
(about 100 s). Against the plugin's one-process run of benchmark 1 (1,000 items
awaiting 200 ms, ``batch_size = 64``). Target: the plugin >= 15 x faster (outer wall,
spawn to exit, on both sides).

Where ``osmosis-ai`` imports, ``osmosis eval run`` runs the same 1,000 rows once
(``_common.sdk_run``): how much faster than ``pytest -n 2`` it is, and ours / its wall.

    python bench/vs_xdist.py [--items 1000] [--sleep 0.2] [--batch 64]
"""

from __future__ import annotations

import argparse

import _common as c


def measure(items: int, sleep: float, batch: int, sdk: bool) -> tuple[c.Run, c.Run, c.Run | None]:
    with c.tempdir("bench-vs-xdist-") as tmp:
        suite = c.plain_suite(tmp / "plain", items, sleep=sleep)
        plain = c.run(
            f"plain pytest -n 2, {items} x sleep {sleep:g} s",
            c.pytest_cmd("-q", "-n", "2"),
            cwd=suite,
        ).check(f"{items} passed")
        with c.model_server(0.0) as env:
            ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
            ours = c.run(
                f"plugin, {items} x await {sleep:g} s, batch {batch}",
                c.osmosis_cmd(output=tmp / "out"),
                cwd=ws,
                env={**env, "BENCH_SLEEP": str(sleep)},
            ).check(f"{items} passed")
            theirs = (
                c.sdk_run(
                    f"osmosis eval run, {items} x await {sleep:g} s, batch {batch}",
                    ws,
                    output=tmp / "sdk",
                    batch_size=batch,
                    env={**env, "BENCH_SLEEP": str(sleep)},
                    rows=items,
                )
                if sdk
                else None
            )
    return plain, ours, theirs


def checks(plain: c.Run, ours: c.Run, theirs: c.Run | None) -> list[c.Check]:
    sdk = c.sdk_absent()
    if theirs is not None:
        sdk = c.versus_sdk(
            f"osmosis eval run {theirs.wall:.2f} s = {plain.wall / theirs.wall:.1f} x faster "
            f"than plain pytest -n 2",
            ours.wall,
            theirs.wall,
            "wall",
        )
    return [
        c.Check(
            "vs plain pytest -n 2",
            f"plain pytest -n 2 {plain.wall:.2f} s vs plugin (1 process) {ours.wall:.2f} s",
            "plugin >= 15 x faster",
            plain.wall / ours.wall,
            15.0,
            higher_is_better=True,
            notes=[
                f"pytest 'in X s': plain {plain.pytest_seconds} s, plugin {ours.pytest_seconds} s",
                f"CPU: plain {plain.cpu:.2f} s, plugin {ours.cpu:.2f} s",
            ],
            sdk=sdk,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("vs pytest -n 2")
    sdk = c.sdk_installed() and not args.no_sdk
    plain, ours, theirs = measure(args.items, args.sleep, args.batch, sdk)
    c.print_runs([plain, ours, *([theirs] if theirs else [])])
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 3: vs plain pytest -n 2", checks(plain, ours, theirs), args.json)


if __name__ == "__main__":
    main()
