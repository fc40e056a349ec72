"""Benchmark 7 — flat in N, and resuming a finished run (design.md §3).

1. Per-item cost at 10,000 instant items vs at 1,000 (instant workflow and grader):
   ``per item = (wall(N) - wall(1)) / (N - 1)``, the 1-item and 1,000-item runs best of
   ``--repeat``. Target: ratio <= 1.1 (flat in N).
2. Resume: the 10,000-item run is named (``--osmosis-name``); running it again must
   re-execute no workflow (each execution appends a byte to ``BENCH_COUNT``; the file
   must stay absent) and take <= 2 x the collection time of the same workspace
   (``--collect-only -q``, outer wall).
3. Memory at scale (issue 30 item 5): ``--rss-sizes`` (default 10,000 and 100,000) instant
   rows, and a plain pytest suite of as many trivial tests beside each: wall, items/s and
   peak RSS (``/usr/bin/time -f %M``). Target: ours <= 1.15 x plain pytest's peak RSS at
   the largest size. ``--rss-only`` measures this part alone (the 100,000-row pair takes
   minutes).

Where ``osmosis-ai`` imports, ``osmosis eval run`` runs 1, ``--sdk-small`` (100) and
``--sdk-large`` (1,000) instant rows once each (a tenth of ours: its rows cost ~35 times
ours in CPU, 10,000 would take many minutes) and then its large run again under the same name
(its resume: every row already recorded), ``_common.sdk_run``: its per-row cost at both
of its sizes, its resume, and ours / its (per row at each side's large N; resume wall,
the SDK's at a tenth of the rows).

    python bench/scale.py [--small 1000] [--large 10000] [--repeat 2]
                          [--sdk-small 100] [--sdk-large 1000]
                          [--rss-sizes 10000,100000] [--rss-only]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _common as c


def measure(
    small: int, large: int, repeat: int, sdk_sizes: tuple[int, int] | None
) -> dict[str, c.Run | float | None]:
    """Ours at 1, ``small`` and ``large``, then the resume; the SDK at 1 and ``sdk_sizes``."""
    out: dict[str, c.Run | float | None] = {}
    with c.tempdir("bench-scale-") as tmp, c.model_server(0.0) as env:
        env = {**env, "BENCH_SLEEP": "0"}
        spaces = {n: c.eval_workspace(tmp / f"ws{n}", n) for n in (1, small, large)}
        for n in (1, small):
            # Best of `repeat`: these are the short runs that start-up noise distorts most.
            tries = [
                c.run(
                    f"plugin {n} instant items #{i + 1}",
                    c.osmosis_cmd(output=tmp / f"out{n}-{i}"),
                    cwd=spaces[n],
                    env=env,
                ).check(f"{n} passed")
                for i in range(repeat)
            ]
            out[f"run{n}"] = min(tries, key=lambda r: r.wall)
            out[f"cpu{n}"] = min(r.cpu for r in tries)
        output = tmp / f"out{large}"
        first_count = tmp / "count-first"
        out[f"run{large}"] = c.run(
            f"plugin {large} instant items (named run)",
            c.osmosis_cmd("--osmosis-name", "bench-resume", output=output),
            cwd=spaces[large],
            env={**env, "BENCH_COUNT": str(first_count)},
        ).check(f"{large} passed")
        out["executed_first"] = _count(first_count)
        out["collect"] = c.run(
            f"plugin --collect-only {large}",
            c.osmosis_cmd("--collect-only", output=output),
            cwd=spaces[large],
        ).check(f"{large} tests collected")
        resume_count = tmp / "count-resume"
        out["resume"] = c.run(
            f"plugin resume finished {large} (named run)",
            c.osmosis_cmd("--osmosis-name", "bench-resume", output=output),
            cwd=spaces[large],
            env={**env, "BENCH_COUNT": str(resume_count)},
        ).check(f"{large} passed")
        out["executed_resume"] = _count(resume_count)
        out["journal_lines"] = (
            sum(1 for _ in open(output / "bench-resume" / "events.jsonl", encoding="utf-8"))
            if (output / "bench-resume" / "events.jsonl").exists()
            else None
        )
        if sdk_sizes is not None:
            sdk_small, sdk_large = sdk_sizes
            for n in (1, *sdk_sizes):
                if n not in spaces:
                    spaces[n] = c.eval_workspace(tmp / f"ws{n}", n)
                out[f"sdk{n}"] = c.sdk_run(
                    f"osmosis eval run {n} instant rows",
                    spaces[n],
                    output=tmp / f"sdk{n}",
                    batch_size=64,
                    env=env,
                    rows=n,
                )
            sdk_count = tmp / "count-sdk-resume"
            out["sdk_resume"] = c.sdk_run(
                f"osmosis eval run, resume finished {sdk_large}",
                spaces[sdk_large],
                output=tmp / f"sdk{sdk_large}",
                batch_size=64,
                env={**env, "BENCH_COUNT": str(sdk_count)},
                rows=sdk_large,
            )
            out["sdk_executed_resume"] = _count(sdk_count)
    return out


def measure_rss(sizes: list[int]) -> dict[int, tuple[c.Run, c.Run]]:
    """Ours and plain pytest at each size, under ``/usr/bin/time``: (ours, plain)."""
    out: dict[int, tuple[c.Run, c.Run]] = {}
    with c.tempdir("bench-scale-rss-") as tmp, c.model_server(0.0) as env:
        env = {**env, "BENCH_SLEEP": "0"}
        for n in sizes:
            space = c.eval_workspace(tmp / f"ws{n}", n)
            ours = c.run(
                f"plugin {n} instant items (peak RSS)",
                c.osmosis_cmd(output=tmp / f"out{n}"),
                cwd=space,
                env=env,
                rss=True,
                timeout=7200,
            ).check(f"{n} passed")
            plain = c.run(
                f"plain pytest {n} trivial tests (peak RSS)",
                c.pytest_cmd("-q"),
                cwd=c.plain_suite(tmp / f"plain{n}", n),
                rss=True,
                timeout=7200,
            ).check(f"{n} passed")
            out[n] = (ours, plain)
    return out


def rss_checks(out: dict[int, tuple[c.Run, c.Run]]) -> list[c.Check]:
    """One line per size; the target is checked at the largest."""
    lines = []
    for n, (ours, plain) in sorted(out.items()):
        assert ours.maxrss_mb is not None and plain.maxrss_mb is not None
        lines.append(
            f"{n} rows: ours {ours.wall:.1f} s ({n / ours.wall:.0f} items/s), peak "
            f"{ours.maxrss_mb:.0f} MB; plain pytest {plain.wall:.1f} s ({n / plain.wall:.0f} "
            f"items/s), peak {plain.maxrss_mb:.0f} MB; ratio {ours.maxrss_mb / plain.maxrss_mb:.3f}"
        )
    n = max(out)
    ours, plain = out[n]
    assert ours.maxrss_mb is not None and plain.maxrss_mb is not None
    return [
        c.Check(
            f"peak RSS at {n} instant rows vs plain pytest",
            lines[-1],
            "<= 1.15 x plain pytest's peak RSS",
            ours.maxrss_mb / plain.maxrss_mb,
            1.15,
            notes=lines[:-1],
            sdk=c.no_sdk("pytest-only"),
        )
    ]


def _count(path: Path) -> int:
    return len(path.read_text()) if path.exists() else 0


def checks(
    small: int,
    large: int,
    out: dict[str, c.Run | float | None],
    sdk_sizes: tuple[int, int] | None,
) -> list[c.Check]:
    one, r_small, r_large = out["run1"], out[f"run{small}"], out[f"run{large}"]
    collect, resume = out["collect"], out["resume"]
    assert isinstance(one, c.Run) and isinstance(r_small, c.Run) and isinstance(r_large, c.Run)
    assert isinstance(collect, c.Run) and isinstance(resume, c.Run)
    per_small = (r_small.wall - one.wall) / (small - 1) * 1000
    per_large = (r_large.wall - one.wall) / (large - 1) * 1000
    cpu_one, cpu_small_run = out["cpu1"], out[f"cpu{small}"]
    assert isinstance(cpu_one, float) and isinstance(cpu_small_run, float)
    cpu_small = (cpu_small_run - cpu_one) / (small - 1) * 1000
    cpu_large = (r_large.cpu - cpu_one) / (large - 1) * 1000
    executed = out["executed_resume"]
    flat_sdk, resume_sdk = c.sdk_absent(), c.sdk_absent()
    sdk_small, sdk_large = sdk_sizes or (small, large)
    s_one, s_small = out.get("sdk1"), out.get(f"sdk{sdk_small}")
    s_large, s_resume = out.get(f"sdk{sdk_large}"), out.get("sdk_resume")
    if (
        isinstance(s_one, c.Run)
        and isinstance(s_small, c.Run)
        and isinstance(s_large, c.Run)
        and isinstance(s_resume, c.Run)
    ):
        per_sdk_small = (s_small.wall - s_one.wall) / (sdk_small - 1) * 1000
        per_sdk_large = (s_large.wall - s_one.wall) / (sdk_large - 1) * 1000
        flat_sdk = c.versus_sdk(
            f"{per_sdk_large:.3f} ms/row at {sdk_large} vs {per_sdk_small:.3f} at {sdk_small} "
            f"= {per_sdk_large / per_sdk_small:.3f} (wall {s_large.wall:.2f} s, "
            f"CPU {s_large.cpu:.2f} s)",
            per_large,
            per_sdk_large,
            "wall/row",
        )
        resume_sdk = c.versus_sdk(
            f"resume of its {sdk_large}-row run {s_resume.wall:.2f} s, rows re-executed "
            f"{out['sdk_executed_resume']}",
            resume.wall,
            s_resume.wall,
            f"wall, SDK {sdk_large}",
        )
    return [
        c.Check(
            f"per-item cost, {large} vs {small} instant items",
            f"{per_large:.3f} ms/item at {large} vs {per_small:.3f} ms/item at {small} (wall)",
            "<= 1.1 (flat in N)",
            per_large / per_small,
            1.1,
            notes=[
                f"CPU per item: {cpu_large:.3f} ms vs {cpu_small:.3f} ms -> ratio "
                f"{cpu_large / cpu_small:.3f}",
                f"walls: 1 item {one.wall:.2f} s, {small} {r_small.wall:.2f} s, "
                f"{large} {r_large.wall:.2f} s",
            ],
            sdk=flat_sdk,
        ),
        c.Check(
            f"resume of a finished {large}-item run",
            f"{resume.wall:.2f} s vs --collect-only {collect.wall:.2f} s; workflows re-executed: "
            f"{executed} (first run executed {out['executed_first']})",
            "no workflow re-executed and <= 2 x collection time",
            resume.wall / collect.wall if executed == 0 else float("inf"),
            2.0,
            notes=[
                f"CPU: resume {resume.cpu:.2f} s, collect-only {collect.cpu:.2f} s; "
                f"journal lines after resume: {out['journal_lines']}",
            ],
            sdk=resume_sdk,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=2, help="tries of the 1-item and small runs")
    parser.add_argument("--sdk-small", type=int, default=100, help="the SDK side's small N")
    parser.add_argument("--sdk-large", type=int, default=1000, help="the SDK side's large N")
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument(
        "--rss-sizes", default="10000,100000", help="rows of the peak-RSS runs, comma-separated"
    )
    parser.add_argument("--rss-only", action="store_true", help="measure peak RSS alone")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("scale and resume")
    found: list[c.Check] = []
    if not args.rss_only:
        sdk = c.sdk_installed() and not args.no_sdk
        sdk_sizes = (args.sdk_small, args.sdk_large) if sdk else None
        out = measure(args.small, args.large, args.repeat, sdk_sizes)
        c.print_runs([r for r in out.values() if isinstance(r, c.Run)])
        print("(the 1-item and small rows are the best of --repeat tries)")
        found += checks(args.small, args.large, out, sdk_sizes)
    rss = measure_rss([int(n) for n in args.rss_sizes.split(",") if n.strip()])
    c.print_runs([run for pair in rss.values() for run in pair])
    found += rss_checks(rss)
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 7: scale and resume", found, args.json)


if __name__ == "__main__":
    main()
