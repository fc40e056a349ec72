"""Benchmark 1 — harness efficiency (issue 4 §7, design.md §3).

1,000 work items whose workflow awaits 200 ms (no model call; the grader is instant),
``batch_size = 64``, one process. Target: wall <= 1.15 x ideal, where

    ideal = items x 0.2 s / 64 + wall of the same session with 0 ms waits.

Both sessions are timed from the outside (spawn of ``python -m pytest`` to exit), so the
ideal includes interpreter start-up, LiteLLM's import, the model preflight, collection
and the results directory; pytest's own "in X s" and metrics.json's ``duration_ms`` are
printed next to it for reference. The loopback model server answers the preflight only.

Where ``osmosis-ai`` imports, ``osmosis eval run`` runs the same two sessions once each
(``_common.sdk_run``): its own efficiency against its own ideal, and ours / its wall.

    python bench/harness_efficiency.py [--items 1000] [--sleep 0.2] [--batch 64] [--repeat 2]
"""

from __future__ import annotations

import argparse

import _common as c


def measure(
    items: int, sleep: float, batch: int, repeat: int, sdk: bool
) -> tuple[list[c.Run], list[c.Run], dict[str, c.Run]]:
    """Alternate 0 ms and ``sleep`` sessions ``repeat`` times; returns (zero runs, sleep
    runs, the SDK's ``zero`` and ``slow`` runs when ``sdk``)."""
    zero: list[c.Run] = []
    slow: list[c.Run] = []
    theirs: dict[str, c.Run] = {}
    with c.tempdir("bench-harness-") as tmp, c.model_server(0.0) as env:
        ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
        for i in range(repeat):
            for label, seconds, bucket in (
                ("0 ms", 0.0, zero),
                (f"{sleep * 1000:g} ms", sleep, slow),
            ):
                out = tmp / f"out-{label.replace(' ', '')}-{i}"
                r = c.run(
                    f"plugin {items} items x {label} #{i + 1}",
                    c.osmosis_cmd(output=out),
                    cwd=ws,
                    env={**env, "BENCH_SLEEP": str(seconds)},
                ).check(f"{items} passed")
                r.metrics_duration = c.duration_s(c.metrics_of(out))  # type: ignore[attr-defined]
                bucket.append(r)
        if sdk:
            for key, seconds in (("zero", 0.0), ("slow", sleep)):
                theirs[key] = c.sdk_run(
                    f"osmosis eval run {items} x {seconds * 1000:g} ms",
                    ws,
                    output=tmp / f"sdk-{key}",
                    batch_size=batch,
                    env={**env, "BENCH_SLEEP": str(seconds)},
                    rows=items,
                )
    return zero, slow, theirs


def checks(
    items: int,
    sleep: float,
    batch: int,
    zero: list[c.Run],
    slow: list[c.Run],
    theirs: dict[str, c.Run] | None,
) -> list[c.Check]:
    sleep_floor = items * sleep / batch
    best_zero = min(r.wall for r in zero)
    best_slow = min(r.wall for r in slow)
    ideal = sleep_floor + best_zero
    ratio = best_slow / ideal
    med_ratio = c.median([r.wall for r in slow]) / (sleep_floor + c.median([r.wall for r in zero]))
    ps_zero = min(r.pytest_seconds or 0 for r in zero)
    ps_slow = min(r.pytest_seconds or 0 for r in slow)
    md_zero = min(getattr(r, "metrics_duration", None) or 0 for r in zero)
    md_slow = min(getattr(r, "metrics_duration", None) or 0 for r in slow)
    sdk = c.sdk_absent()
    if theirs:
        sdk_ideal = sleep_floor + theirs["zero"].wall
        sdk = c.versus_sdk(
            f"wall {theirs['slow'].wall:.2f} s vs its ideal {sdk_ideal:.2f} s "
            f"(0 ms session {theirs['zero'].wall:.2f} s) = "
            f"{theirs['slow'].wall / sdk_ideal:.3f} x; CPU {theirs['slow'].cpu:.2f} s "
            f"vs ours {min(r.cpu for r in slow):.2f} s",
            best_slow,
            theirs["slow"].wall,
            "wall",
        )
    return [
        c.Check(
            "harness efficiency (1 process)",
            f"wall {best_slow:.2f} s vs ideal {ideal:.2f} s "
            f"(= {items} x {sleep:g} s / {batch} = {sleep_floor:.2f} s"
            f" + 0 ms session {best_zero:.2f} s)",
            "wall <= 1.15 x ideal",
            ratio,
            1.15,
            notes=[
                f"best of {len(slow)} per side (outer wall); median ratio {med_ratio:.3f}",
                f"pytest 'in X s': 0 ms {ps_zero:.2f} s, {sleep * 1000:g} ms {ps_slow:.2f} s -> "
                f"ratio {ps_slow / (sleep_floor + ps_zero):.3f}",
                f"metrics.json duration: 0 ms {md_zero:.2f} s, {sleep * 1000:g} ms {md_slow:.2f} s"
                f" -> ratio {md_slow / (sleep_floor + md_zero):.3f}",
                f"excess over ideal {best_slow - ideal:+.2f} s = "
                f"{(best_slow - ideal) / items * 1000:+.2f} ms per item",
            ],
            sdk=sdk,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("harness efficiency")
    sdk = c.sdk_installed() and not args.no_sdk
    zero, slow, theirs = measure(args.items, args.sleep, args.batch, args.repeat, sdk)
    c.print_runs([*zero, *slow, *theirs.values()])
    print(f"after: {c.loadavg()}")
    c.finish(
        "benchmark 1: harness efficiency",
        checks(args.items, args.sleep, args.batch, zero, slow, theirs),
        args.json,
    )


if __name__ == "__main__":
    main()
