"""Benchmark 13 — a CI matrix: 4 shards of 1,000 rows x 200 ms, merged (issue 27 §1).

One workspace of 1,000 rows whose workflow awaits 200 ms (no model call), ``batch_size``
64. Side A runs it unsharded; side B runs ``--osmosis-shard K/4`` for K = 1..4 one after
the other (each stands for a matrix job on a machine of its own), then
``pytest-osmosis merge``. Targets (``../shared/design.md`` §3): each shard's wall <= 0.3x
the unsharded wall; the merged run equals the unsharded one row for row (index rows but
their ids and durations) with a byte-equal ``metrics.json`` summary.

``--sleep 0.2 2`` measures each row length in turn (the target is judged on the first) and
prints each one's ratio beside its floor: rows run in waves of ``batch_size``, so a shard
can be no faster than its waves over the unsharded run's waves (5/16 for a 265-row shard
of 1,000 rows at 64), before the fixed start-up cost every process pays.

    python bench/shards.py [--items 1000] [--shards 4] [--sleep 0.2 [2 ...]] [--batch 64]
                           [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import _common as c


def _rows(run_dir: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("rollout_id", "duration_ms")} for r in rows]


def _summary(run_dir: Path) -> bytes:
    raw = (run_dir / "metrics.json").read_bytes()
    return raw[raw.index(b'"summary"') :]


def _rows_run(run: c.Run) -> int:
    """How many rows a session ran, from pytest's "N passed"."""
    found = re.findall(r"(\d+) passed", run.stdout)
    return int(found[-1]) if found else 0


def ratio_line(sleep: float, batch: int, whole: list[c.Run], parts: list[list[c.Run]]) -> str:
    """One row length's slowest shard over the unsharded wall, and the floor its waves set."""
    base = min(r.wall for r in whole)
    slowest = max(range(len(parts[0])), key=lambda k: min(run[k].wall for run in parts))
    worst = min(run[slowest].wall for run in parts)
    waves = math.ceil(_rows_run(parts[0][slowest]) / batch)
    all_waves = math.ceil(_rows_run(whole[0]) / batch)
    return (
        f"rows of {sleep:g} s: slowest shard {worst:.2f} s / unsharded {base:.2f} s = "
        f"{worst / base:.3f}x (its {waves} waves of {batch} / {all_waves}: floor "
        f"{waves / all_waves:.3f}x; fixed cost above it {worst - waves * sleep:.2f} s vs "
        f"{base - all_waves * sleep:.2f} s)"
    )


def measure(
    items: int, shards: int, sleep: float, batch: int, repeat: int
) -> tuple[list[c.Run], list[list[c.Run]], list[c.Run], list[bool]]:
    whole: list[c.Run] = []
    parts: list[list[c.Run]] = []
    merges: list[c.Run] = []
    equal: list[bool] = []
    with c.tempdir("bench-shards-") as tmp, c.model_server(0.0) as env:
        ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
        bench_env = {**env, "BENCH_SLEEP": str(sleep)}
        for i in range(repeat):
            out = tmp / f"out{i}"
            whole.append(
                c.run(
                    f"unsharded, {items} rows #{i + 1}",
                    c.osmosis_cmd("--osmosis-name", "whole", output=out),
                    cwd=ws,
                    env=bench_env,
                ).check(f"{items} passed")
            )
            these = []
            for k in range(1, shards + 1):
                these.append(
                    c.run(
                        f"shard {k}/{shards} #{i + 1}",
                        c.osmosis_cmd(
                            "--osmosis-name", "ci", "--osmosis-shard", f"{k}/{shards}", output=out
                        ),
                        cwd=ws,
                        env=bench_env,
                    ).check(" passed")
                )
            parts.append(these)
            shard_dirs = [str(out / f"ci-shard-{k}-of-{shards}") for k in range(1, shards + 1)]
            merges.append(
                c.run(
                    f"merge {shards} shards #{i + 1}",
                    [
                        c.PYTHON,
                        "-m",
                        "pytest_osmosis.cli",
                        "merge",
                        *shard_dirs,
                        "--output",
                        str(tmp / f"merged{i}"),
                        "--name",
                        "whole",
                    ],
                    cwd=ws,
                    env=bench_env,
                ).check()
            )
            merged, unsharded = tmp / f"merged{i}" / "whole", out / "whole"
            equal.append(
                _rows(merged) == _rows(unsharded) and _summary(merged) == _summary(unsharded)
            )
    return whole, parts, merges, equal


def checks(
    items: int, whole: list[c.Run], parts: list[list[c.Run]], merges: list[c.Run], equal: list[bool]
) -> list[c.Check]:
    base = min(r.wall for r in whole)
    worst = max(min(run[k].wall for run in parts) for k in range(len(parts[0])))
    shares = [min(run[k].wall for run in parts) / base for k in range(len(parts[0]))]
    notes = [
        f"unsharded {base:.2f} s wall; shards " + ", ".join(f"{s:.2f}x" for s in shares),
        f"merge of {items} rows: {min(r.wall for r in merges):.2f} s wall",
    ]
    return [
        c.Check(
            "shards: each shard's wall vs unsharded",
            f"slowest shard {worst:.2f} s vs unsharded {base:.2f} s",
            "each shard <= 0.3x the unsharded wall",
            worst / base,
            0.3,
            notes=notes,
            sdk=c.no_sdk("pytest-only"),
        ),
        c.Check(
            "shards: merged run equals the unsharded run",
            "index rows and metrics.json summary equal" if all(equal) else "DIFFERENT",
            "row for row, summary byte for byte",
            1.0 if all(equal) else 0.0,
            1.0,
            higher_is_better=True,
            sdk=c.no_sdk("pytest-only"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument(
        "--sleep", type=float, nargs="+", default=[0.2], help="row lengths in s (first: target)"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("shards and merge")
    judged = None
    lines = []
    for sleep in args.sleep:
        print(f"-- rows of {sleep:g} s")
        whole, parts, merges, equal = measure(
            args.items, args.shards, sleep, args.batch, args.repeat
        )
        c.print_runs([*whole, *(r for run in parts for r in run), *merges])
        lines.append(ratio_line(sleep, args.batch, whole, parts))
        print(lines[-1])
        judged = judged or (whole, parts, merges, equal)
    print(f"after: {c.loadavg()}")
    assert judged is not None
    found = checks(args.items, *judged)
    found[0].notes.extend(lines)
    c.finish("benchmark 13: shards and merge", found, args.json)


if __name__ == "__main__":
    main()
