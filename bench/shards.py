"""Benchmark 13 — a CI matrix: 4 shards of 1,000 rows x 200 ms, merged (issue 27 §1).

One workspace of 1,000 rows whose workflow awaits 200 ms (no model call), ``batch_size``
64. Side A runs it unsharded; side B runs ``--osmosis-shard K/4`` for K = 1..4 one after
the other (each stands for a matrix job on a machine of its own), then
``pytest-osmosis merge``. Targets (``../shared/design.md`` §3): each shard's wall <= 0.3x
the unsharded wall; the merged run equals the unsharded one row for row (index rows but
their ids and durations) with a byte-equal ``metrics.json`` summary.

    python bench/shards.py [--items 1000] [--shards 4] [--sleep 0.2] [--batch 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _common as c


def _rows(run_dir: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("rollout_id", "duration_ms")} for r in rows]


def _summary(run_dir: Path) -> bytes:
    raw = (run_dir / "metrics.json").read_bytes()
    return raw[raw.index(b'"summary"') :]


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
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("shards and merge")
    whole, parts, merges, equal = measure(
        args.items, args.shards, args.sleep, args.batch, args.repeat
    )
    c.print_runs([*whole, *(r for run in parts for r in run), *merges])
    print(f"after: {c.loadavg()}")
    c.finish(
        "benchmark 13: shards and merge", checks(args.items, whole, parts, merges, equal), args.json
    )


if __name__ == "__main__":
    main()
