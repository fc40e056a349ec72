"""Benchmark 9 — the model-call cache (issue 16): replaying vs calling the model.

1,000 rows, each making one model call through the bridge (the ``bridge`` mode of the
benchmark rollout), ``batch_size = 64``. Side A calls the loopback model server answering
after 200 ms (``--osmosis-cache off``); side B replays the same calls from the cache
(``--osmosis-cache replay``, filled by one ``record`` session first). Wall and CPU per row
are taken by difference between N and a small run, as in benchmark 2, so start-up drops
out. Targets: a cache hit (key + lookup + JSON decode, timed in process against the
cache the sessions wrote) under 0.3 ms, and under 10% of a replayed row's CPU.

    python bench/cache_replay.py [--items 1000] [--small 100] [--batch 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json

import _common as c

LOOKUPS = """
import asyncio, json, sys, time
from pathlib import Path

from pytest_osmosis.model.cache import CallCache, cache_path

root, items = Path(sys.argv[1]), int(sys.argv[2])
cache = CallCache(cache_path(root), "replay").open()


async def refuse():
    raise AssertionError("a replayed call reached the model")


async def main():
    bodies = [
        {"model": "bench", "messages": [{"role": "user", "content": f"What is {i} + 1?"}]}
        for i in range(items)
    ]
    attempts = [cache.attempt("bench", i, 0) for i in range(items)]
    await attempts[0].serve("openai/bench", bodies[0], refuse)  # warm: the page cache
    attempts = [cache.attempt("bench", i, 0) for i in range(items)]
    c0, t0 = time.process_time(), time.perf_counter()
    for attempt, body in zip(attempts, bodies):
        answer, hit = await attempt.serve("openai/bench", body, refuse)
        assert hit, body
    c1, t1 = time.process_time(), time.perf_counter()
    print(json.dumps({"hits": items, "cpu_s": c1 - c0, "wall_s": t1 - t0}))


asyncio.run(main())
"""


def measure(items: int, small: int, batch: int, repeat: int) -> dict[str, dict[int, list[c.Run]]]:
    runs: dict[str, dict[int, list[c.Run]]] = {"live": {}, "replay": {}, "lookup": {}}
    with c.tempdir("bench-cache-") as tmp, c.model_server(0.2) as env:
        ws_by_n = {n: c.eval_workspace(tmp / f"ws{n}", n, batch_size=batch) for n in (items, small)}
        out = tmp / "out"  # one output root: every session shares its cache
        bench_env = {**env, "BENCH_MODE": "bridge"}
        c.run(
            f"record {items} calls into the cache",
            c.osmosis_cmd("--osmosis-cache", "record", "--osmosis-name", "record", output=out),
            cwd=ws_by_n[items],
            env=bench_env,
        ).check(f"{items} passed")
        script = tmp / "lookups.py"
        script.write_text(LOOKUPS)
        for i in range(repeat):
            for n in (items, small):
                for side, mode in (("live", "off"), ("replay", "replay")):
                    r = c.run(
                        f"{side} ({mode}), {n} rows #{i + 1}",
                        c.osmosis_cmd(
                            "--osmosis-cache", mode, "--osmosis-name", f"{side}-{n}-{i}", output=out
                        ),
                        cwd=ws_by_n[n],
                        env=bench_env,
                    ).check(f"{n} passed")
                    runs[side].setdefault(n, []).append(r)
            lookup = c.run(
                f"{items} cache hits in process #{i + 1}",
                [c.PYTHON, str(script), str(out), str(items)],
                cwd=tmp,
                env={"PYTHONPATH": str(c.REPO)},
            ).check('"hits"')
            runs["lookup"].setdefault(items, []).append(lookup)
    return runs


def checks(items: int, small: int, runs: dict[str, dict[int, list[c.Run]]]) -> list[c.Check]:
    per: dict[str, dict[str, float]] = {}
    for side in ("live", "replay"):
        big, little = runs[side][items], runs[side][small]
        per[side] = {
            "cpu_ms": (min(r.cpu for r in big) - min(r.cpu for r in little))
            / (items - small)
            * 1000,
            "wall_ms": (min(r.wall for r in big) - min(r.wall for r in little))
            / (items - small)
            * 1000,
            "wall": min(r.wall for r in big),
            "cpu": min(r.cpu for r in big),
        }
    phases = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs["lookup"][items]]
    hit_ms = min(p["cpu_s"] for p in phases) / items * 1000
    hit_wall_ms = min(p["wall_s"] for p in phases) / items * 1000
    live, replay = per["live"], per["replay"]
    notes = [
        f"per row (marginal, {items} vs {small} rows): live wall {live['wall_ms']:.2f} ms, "
        f"CPU {live['cpu_ms']:.2f} ms; replay wall {replay['wall_ms']:.2f} ms, "
        f"CPU {replay['cpu_ms']:.2f} ms",
        f"whole sessions of {items} rows: live {live['wall']:.2f} s wall / {live['cpu']:.2f} s "
        f"CPU; replay {replay['wall']:.2f} s wall / {replay['cpu']:.2f} s CPU",
        f"a hit in process: {hit_ms:.3f} ms CPU, {hit_wall_ms:.3f} ms wall "
        "(sha256 of the canonical request, one SELECT by key, json.loads of the answer)",
    ]
    return [
        c.Check(
            "cache: CPU per hit",
            f"{hit_ms:.3f} ms per hit ({items} hits in process)",
            "a hit <= 0.3 ms",
            hit_ms / 0.3,
            1.0,
            notes=notes,
            sdk=c.no_sdk("no-cache"),
        ),
        c.Check(
            "cache: a hit's share of a replayed row's CPU",
            f"{hit_ms:.3f} ms of {replay['cpu_ms']:.2f} ms per replayed row",
            "<= 10% of a replayed row's CPU",
            hit_ms / replay["cpu_ms"],
            0.10,
            sdk=c.no_sdk("no-cache"),
        ),
        c.Check(
            "cache: replayed row vs live row, wall",
            f"replay {replay['wall_ms']:.2f} ms vs live {live['wall_ms']:.2f} ms per row",
            "replaying is faster than calling the 200 ms model (informational)",
            replay["wall_ms"] / live["wall_ms"],
            1.0,
            sdk=c.no_sdk("no-cache"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("model-call cache")
    runs = measure(args.items, args.small, args.batch, args.repeat)
    c.print_runs([r for side in runs.values() for rs in side.values() for r in rs])
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 9: model-call cache", checks(args.items, args.small, runs), args.json)


if __name__ == "__main__":
    main()
