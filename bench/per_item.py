"""Benchmark 4 — per-item overhead (issue 4 §7, design.md §3).

An instant workflow and grader over N work items, against a plain pytest suite with the
same number of trivial tests (``@pytest.mark.parametrize`` over ``range(N)``, body
``pass``). Target: the plugin's cost per item <= 1.5 x pytest's own cost per test.

Start-up is removed by running each side twice, at N and at 1 item:

    per item = (wall(N) - wall(1)) / (N - 1)

so the plugin's fixed costs (LiteLLM import, model preflight, run directory) are not
counted; collection, the protocol, the workflow/grader and the results files are. The
same is printed for CPU time (``RUSAGE_CHILDREN``), which the other agents' load on the
machine disturbs less than wall time.

Where ``osmosis-ai`` imports, ``osmosis eval run`` runs ``--sdk-items`` (default 500: its
rows cost ~35 times ours in CPU, so 2,000 would take minutes) and 1 instant rows once each
(``_common.sdk_run``), its per-row cost taken by the same difference: ours / its.

    python bench/per_item.py [--items 2000] [--repeat 2] [--sdk-items 500]
"""

from __future__ import annotations

import argparse

import _common as c


def measure(items: int, repeat: int, sdk_items: int) -> dict[str, dict[int, list[c.Run]]]:
    """Both sides at ``items`` and 1, ``repeat`` times; the SDK at ``sdk_items`` (0: none)."""
    runs: dict[str, dict[int, list[c.Run]]] = {"plugin": {}, "pytest": {}}
    with c.tempdir("bench-per-item-") as tmp, c.model_server(0.0) as env:
        evals = {n: c.eval_workspace(tmp / f"ws{n}", n) for n in (items, 1)}
        plains = {n: c.plain_suite(tmp / f"plain{n}", n) for n in (items, 1)}
        for i in range(repeat):
            for n in (items, 1):
                r = c.run(
                    f"plugin {n} instant items #{i + 1}",
                    c.osmosis_cmd(output=tmp / f"out-{n}-{i}"),
                    cwd=evals[n],
                    env={**env, "BENCH_SLEEP": "0"},
                ).check(f"{n} passed")
                runs["plugin"].setdefault(n, []).append(r)
                p = c.run(
                    f"plain pytest {n} trivial tests #{i + 1}",
                    c.pytest_cmd("-q"),
                    cwd=plains[n],
                ).check(f"{n} passed")
                runs["pytest"].setdefault(n, []).append(p)
        if sdk_items:
            for n in (sdk_items, 1):
                if n not in evals:
                    evals[n] = c.eval_workspace(tmp / f"ws{n}", n)
            runs["sdk"] = {
                n: [
                    c.sdk_run(
                        f"osmosis eval run {n} instant rows",
                        evals[n],
                        output=tmp / f"sdk-{n}",
                        batch_size=64,
                        env={**env, "BENCH_SLEEP": "0"},
                        rows=n,
                    )
                ]
                for n in (sdk_items, 1)
            }
    return runs


def per_item(runs: dict[int, list[c.Run]], items: int, what: str) -> float:
    big = float(min(getattr(r, what) for r in runs[items]))
    one = float(min(getattr(r, what) for r in runs[1]))
    return (big - one) / (items - 1) * 1000


def checks(items: int, sdk_items: int, runs: dict[str, dict[int, list[c.Run]]]) -> list[c.Check]:
    ours_wall = per_item(runs["plugin"], items, "wall")
    base_wall = per_item(runs["pytest"], items, "wall")
    ours_cpu = per_item(runs["plugin"], items, "cpu")
    base_cpu = per_item(runs["pytest"], items, "cpu")
    start_ours = min(r.wall for r in runs["plugin"][1])
    start_base = min(r.wall for r in runs["pytest"][1])
    sdk = c.sdk_absent()
    if "sdk" in runs:
        sdk_wall = per_item(runs["sdk"], sdk_items, "wall")
        sdk_cpu = per_item(runs["sdk"], sdk_items, "cpu")
        sdk = c.versus_sdk(
            f"{sdk_wall:.3f} ms/row wall ({sdk_items} vs 1 rows) = "
            f"{sdk_wall / base_wall:.2f} x plain pytest; CPU "
            f"{sdk_cpu:.3f} ms/row (ours / its {ours_cpu / sdk_cpu:.2f}); start-up "
            f"{runs['sdk'][1][0].wall:.2f} s",
            ours_wall,
            sdk_wall,
            "wall/row",
        )
    return [
        c.Check(
            "per-item overhead",
            f"plugin {ours_wall:.3f} ms/item vs plain pytest {base_wall:.3f} ms/test "
            f"(wall, {items} vs 1 item)",
            "plugin per-item wall <= 1.5 x pytest per-test wall",
            ours_wall / base_wall,
            1.5,
            notes=[
                f"CPU per item: plugin {ours_cpu:.3f} ms vs pytest {base_cpu:.3f} ms -> ratio "
                f"{ours_cpu / base_cpu:.3f}",
                f"start-up (1 item): plugin {start_ours:.2f} s, plain pytest {start_base:.2f} s",
                "min over repeats of each (size, side) before taking differences",
            ],
            sdk=sdk,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sdk-items", type=int, default=500, help="the SDK side's N")
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("per-item overhead")
    sdk_items = args.sdk_items if c.sdk_installed() and not args.no_sdk else 0
    runs = measure(args.items, args.repeat, sdk_items)
    c.print_runs([r for side in runs.values() for rs in side.values() for r in rs])
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 4: per-item overhead", checks(args.items, sdk_items, runs), args.json)


if __name__ == "__main__":
    main()
