"""Benchmark 5 — collecting 100,000 rows (issue 4 §7, design.md §3).

``pytest --osmosis-eval --collect-only -q`` over a 100,000-row JSONL dataset (rows of
about 250 bytes, the size ``research/pytest-engineering.md`` §1.3 measured with). Targets:
wall <= 3 s and peak RSS <= 300 MB. Wall is spawn to exit of the whole process; RSS is
the process's own peak (``/usr/bin/time -f %M``). A plain pytest suite of the same
number of parametrized tests is collected once alongside, for scale (no target).

    python bench/collection.py [--rows 100000] [--row-bytes 250] [--repeat 2]
"""

from __future__ import annotations

import argparse

import _common as c


def measure(rows: int, row_bytes: int, repeat: int) -> tuple[list[c.Run], list[c.Run]]:
    ours: list[c.Run] = []
    plain: list[c.Run] = []
    with c.tempdir("bench-collect-") as tmp:
        ws = c.eval_workspace(tmp / "ws", rows, row_bytes=row_bytes)
        suite = c.plain_suite(tmp / "plain", rows)
        for i in range(repeat):
            ours.append(
                c.run(
                    f"plugin --collect-only {rows} rows #{i + 1}",
                    c.osmosis_cmd("--collect-only"),
                    cwd=ws,
                    rss=True,
                ).check(f"{rows} tests collected")
            )
        # Once: plain pytest is there for scale (no target) and takes ~10 s a run.
        plain.append(
            c.run(
                f"plain pytest --collect-only {rows}",
                c.pytest_cmd("-q", "--collect-only"),
                cwd=suite,
                rss=True,
            ).check(f"{rows} tests collected")
        )
    return ours, plain


def checks(rows: int, ours: list[c.Run], plain: list[c.Run]) -> list[c.Check]:
    wall = min(r.wall for r in ours)
    rss = min(r.maxrss_mb or 0 for r in ours)
    p_wall = min(r.wall for r in plain)
    p_rss = min(r.maxrss_mb or 0 for r in plain)
    scale = (
        f"plain pytest parametrize x {rows}: {p_wall:.2f} s, {p_rss:.0f} MB "
        f"(plugin / plain: wall {wall / p_wall:.2f}x, RSS {rss / p_rss:.2f}x)"
    )
    spread = (
        f"walls {', '.join(f'{r.wall:.2f}' for r in ours)} s; CPU {min(r.cpu for r in ours):.2f} s"
    )
    return [
        c.Check(
            f"collect {rows} rows: wall",
            f"{wall:.2f} s (best of {len(ours)})",
            "<= 3 s",
            wall / 3.0,
            1.0,
            notes=[spread, scale],
            sdk=c.no_sdk("pytest-only"),
        ),
        c.Check(
            f"collect {rows} rows: peak RSS",
            f"{rss:.0f} MB",
            "<= 300 MB",
            rss / 300.0,
            1.0,
            sdk=c.no_sdk("pytest-only"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--row-bytes", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("collection")
    ours, plain = measure(args.rows, args.row_bytes, args.repeat)
    c.print_runs([*ours, *plain])
    for r in [*ours, *plain]:
        print(f"  {r.label}: peak RSS {r.maxrss_mb:.0f} MB")
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 5: collection", checks(args.rows, ours, plain), args.json)


if __name__ == "__main__":
    main()
