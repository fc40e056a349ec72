"""Benchmark 3 — against plain ``pytest -n 2`` (issue 4 §7, design.md §3).

The 200 ms workload run the way pytest runs it without the plugin: 1,000 parametrized
tests, each ``time.sleep(0.2)``, on two xdist workers, one item at a time per worker
(about 100 s). Against the plugin's one-process run of benchmark 1 (1,000 items
awaiting 200 ms, ``batch_size = 64``). Target: the plugin >= 15 x faster (outer wall,
spawn to exit, on both sides).

    python bench/vs_xdist.py [--items 1000] [--sleep 0.2] [--batch 64]
"""

from __future__ import annotations

import argparse

import _common as c


def measure(items: int, sleep: float, batch: int) -> tuple[c.Run, c.Run]:
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
    return plain, ours


def checks(plain: c.Run, ours: c.Run) -> list[c.Check]:
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
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("vs pytest -n 2")
    plain, ours = measure(args.items, args.sleep, args.batch)
    c.print_runs([plain, ours])
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 3: vs plain pytest -n 2", checks(plain, ours), args.json)


if __name__ == "__main__":
    main()
