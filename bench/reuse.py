"""Benchmark 14 — ``--osmosis-reuse``: a run of 1,000 unchanged rows recorded from the last one
(issue 27 §4).

1,000 rows, each making one model call through the bridge to the loopback model server
answering after 200 ms, ``batch_size`` 64. The first run pays for every row; the second
(``--osmosis-reuse first``) changes nothing and should record every row from the first.
Targets (``../shared/design.md`` §3): the reused run makes 0 model calls (the server's own
count) and costs <= 0.1x its first run; the cost compared is the tokens it spends (what a
provider bills), with wall and CPU printed beside it.

    python bench/reuse.py [--items 1000] [--sleep 0.2] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _common as c
from rate_limited import stats


def _tokens(run_dir: Path) -> int:
    """Tokens the session's own rows spent: the index rows it did not reuse."""
    rows = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    return sum(int(r.get("tokens") or 0) for r in rows if not r.get("reused"))


def measure(items: int, sleep: float, batch: int) -> dict[str, object]:
    with c.tempdir("bench-reuse-") as tmp, c.model_server(sleep) as env:
        ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
        bench_env = {**env, "BENCH_MODE": "bridge"}
        out = tmp / "out"
        before = stats(env["OPENAI_API_BASE"])["requests_total"]
        first = c.run(
            f"first run, {items} rows",
            c.osmosis_cmd("--osmosis-name", "first", output=out),
            cwd=ws,
            env=bench_env,
        ).check(f"{items} passed")
        middle = stats(env["OPENAI_API_BASE"])["requests_total"]
        reused = c.run(
            f"--osmosis-reuse first, {items} rows",
            c.osmosis_cmd("--osmosis-name", "again", "--osmosis-reuse", "first", output=out),
            cwd=ws,
            env=bench_env,
        ).check(f"{items} reused, 0 run")
        after = stats(env["OPENAI_API_BASE"])["requests_total"]
        return {
            "first": first,
            "reused": reused,
            "first_calls": middle - before,
            "reused_calls": after - middle,
            "first_tokens": _tokens(out / "first"),
            "reused_tokens": _tokens(out / "again"),
        }


def checks(m: dict[str, object]) -> list[c.Check]:
    first, reused = m["first"], m["reused"]
    assert isinstance(first, c.Run) and isinstance(reused, c.Run)
    first_tokens, reused_tokens = int(m["first_tokens"]), int(m["reused_tokens"])  # type: ignore[call-overload]
    notes = [
        f"first run {first.wall:.2f} s wall / {first.cpu:.2f} s CPU, {m['first_calls']} model "
        f"calls, {first_tokens} tokens",
        f"reused run {reused.wall:.2f} s wall / {reused.cpu:.2f} s CPU, {m['reused_calls']} "
        f"model calls, {reused_tokens} tokens",
        f"wall ratio {reused.wall / first.wall:.3f}, CPU ratio {reused.cpu / first.cpu:.3f}",
    ]
    return [
        c.Check(
            "reuse: model calls of an unchanged run",
            f"{m['reused_calls']} calls (first run {m['first_calls']})",
            "0 model calls",
            float(m["reused_calls"]),  # type: ignore[arg-type]
            0.0,
            notes=notes,
            sdk=c.no_sdk("pytest-only"),
        ),
        c.Check(
            "reuse: cost vs its first run (tokens)",
            f"{reused_tokens} tokens vs {first_tokens}",
            "<= 0.1x its first run",
            reused_tokens / max(1, first_tokens),
            0.1,
            sdk=c.no_sdk("pytest-only"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("reuse")
    m = measure(args.items, args.sleep, args.batch)
    c.print_runs([m["first"], m["reused"]])  # type: ignore[list-item]
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 14: --osmosis-reuse", checks(m), args.json)


if __name__ == "__main__":
    main()
