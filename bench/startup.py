"""Benchmark 6 — pytest start-up with the plugin installed but not enabled (issue 4 §7).

A one-test suite, run ``--runs`` times each way, interleaved so load drifts hit both
sides alike: ``pytest -q -p no:cacheprovider`` (the plugin loads through its ``pytest11``
entry point but ``--osmosis-eval`` is not given) against the same with ``-p no:osmosis``
(the plugin is never imported). Target: median wall <= 1.05 x. Also checks that the
plugin really was loaded in the first case and that LiteLLM was imported in neither.

    python bench/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse

import _common as c

# Reports, at the end of the session, whether the plugin and LiteLLM were imported.
PROBE = """
import sys


def pytest_unconfigure(config):
    with open("probe.txt", "w") as fh:
        fh.write(f"{'pytest_osmosis.plugin' in sys.modules} {'litellm' in sys.modules}")
"""


def measure(runs: int) -> tuple[list[c.Run], list[c.Run], dict[str, str]]:
    enabled: list[c.Run] = []
    disabled: list[c.Run] = []
    probes: dict[str, str] = {}
    with c.tempdir("bench-startup-") as tmp:
        suite = c.plain_suite(tmp / "suite", 1)
        (suite / "conftest.py").write_text(PROBE)
        for flag, label in (([], "installed"), (["-p", "no:osmosis"], "no:osmosis")):
            c.run("warm-up", c.pytest_cmd("-q", *flag), cwd=suite).check("1 passed")
            probes[label] = (suite / "probe.txt").read_text()
        for i in range(runs):
            enabled.append(
                c.run(
                    f"plugin installed, not enabled #{i + 1}", c.pytest_cmd("-q"), cwd=suite
                ).check("1 passed")
            )
            disabled.append(
                c.run(
                    f"-p no:osmosis #{i + 1}", c.pytest_cmd("-q", "-p", "no:osmosis"), cwd=suite
                ).check("1 passed")
            )
    return enabled, disabled, probes


def checks(enabled: list[c.Run], disabled: list[c.Run], probes: dict[str, str]) -> list[c.Check]:
    on, off = c.median([r.wall for r in enabled]), c.median([r.wall for r in disabled])
    on_cpu, off_cpu = c.median([r.cpu for r in enabled]), c.median([r.cpu for r in disabled])
    best = min(r.wall for r in enabled) / min(r.wall for r in disabled)
    return [
        c.Check(
            "start-up, plugin installed not enabled",
            f"median {on * 1000:.0f} ms vs {off * 1000:.0f} ms with -p no:osmosis "
            f"({len(enabled)} runs each, interleaved)",
            "<= 1.05 x pytest without the plugin",
            on / off,
            1.05,
            notes=[
                f"median CPU {on_cpu * 1000:.0f} ms vs {off_cpu * 1000:.0f} ms -> ratio "
                f"{on_cpu / off_cpu:.3f}; best-of wall ratio {best:.3f}",
                f"plugin imported / litellm imported: installed {probes['installed']}, "
                f"-p no:osmosis {probes['no:osmosis']}",
            ],
            sdk=c.no_sdk("pytest-only"),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("start-up")
    enabled, disabled, probes = measure(args.runs)
    c.print_runs([*enabled, *disabled])
    print(f"after: {c.loadavg()}")
    c.finish("benchmark 6: start-up", checks(enabled, disabled, probes), args.json)


if __name__ == "__main__":
    main()
