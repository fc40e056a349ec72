"""Run every benchmark under each interpreter and print one table of ratios vs targets.

Each benchmark runs in its own process (``python bench/<name>.py --json ...``), so a
crash in one does not hide the others; their own output streams through as they run.
They run one after the other, never in parallel (on a 2-core machine they would measure
each other): every benchmark under every ``--python`` in turn, so load drifts reach the
configurations alike. A configuration is labelled by whether ``osmosis_ai`` imports in
it; where it does, each benchmark also measures ``osmosis eval run`` on the same
workload (the SDK column: ours / the SDK's, or ``n/a`` and one word why).

    python bench/run_all.py [--python PATH ...] [--only startup,collection,...] [--skip vs_xdist]
                            [--smoke]

With the defaults, about 20 minutes for the two configurations on this machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    ("harness_efficiency", "1"),
    ("through_bridge", "2"),
    ("vs_xdist", "3"),
    ("per_item", "4"),
    ("collection", "5"),
    ("startup", "6"),
    ("scale", "7"),
    ("first_result", "8"),
    ("cache_replay", "9"),
    ("rate_limited", "10"),
    ("xdist_helps", "11"),
    ("instructions", "12"),
    ("shards", "13"),
    ("reuse", "14"),
    ("ssh_workers", "16"),
)

# --smoke: sizes that only show every script runs and writes its checks (the ratios
# then mean nothing). A benchmark not named here runs with its defaults.
SMOKE = {
    "harness_efficiency": ["--items", "20", "--repeat", "1", "--sleep", "0.05"],
    "through_bridge": ["--items", "20", "--small", "5", "--repeat", "1", "--sdk-items", "20"],
    "vs_xdist": ["--items", "20", "--sleep", "0.05"],
    "per_item": ["--items", "20", "--repeat", "1", "--sdk-items", "20"],
    "collection": ["--rows", "1000", "--repeat", "1"],
    "startup": ["--runs", "1"],
    "scale": ["--small", "10", "--large", "30", "--repeat", "1", "--sdk-small", "10"]
    + ["--sdk-large", "30"],
    "first_result": ["--runs", "1"],
    "cache_replay": ["--items", "20", "--small", "5", "--repeat", "1"],
    "rate_limited": ["--rows", "20", "--rate", "20"],
    "xdist_helps": ["--items", "40", "--repeat", "1", "--sleep", "0.05"],
    "instructions": ["--small", "10", "--large", "30"],
    "shards": ["--items", "40", "--sleep", "0.05"],
    "reuse": ["--items", "20", "--sleep", "0.05"],
    "ssh_workers": ["--items", "40", "--repeat", "1", "--sleep", "0.05"],
}

PROBE = (
    "import sys\n"
    "try:\n"
    "    import osmosis_ai\n"
    "    from importlib.metadata import version\n"
    "    sdk = 'SDK ' + version('osmosis-ai')\n"
    "except ImportError:\n"
    "    sdk = 'no SDK'\n"
    "print(f'{sys.version_info[0]}.{sys.version_info[1]} {sdk}')\n"
)


@dataclass
class Config:
    """One interpreter: the benchmarks run under it, its SDK (if any) beside them."""

    python: str
    label: str


@dataclass
class Outcome:
    """One benchmark under one configuration."""

    checks: list[dict[str, Any]]
    took: float
    rc: int


def configuration(python: str) -> Config:
    found = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"{python} does not run: {found.stderr.strip()}")
    return Config(python, found.stdout.strip())


def run_one(config: Config, name: str, extra: list[str]) -> Outcome:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    start = time.perf_counter()
    argv = [config.python, str(HERE / f"{name}.py"), "--json", str(out), *extra]
    proc = subprocess.run(argv)
    took = time.perf_counter() - start
    checks = json.loads(out.read_text()) if proc.returncode == 0 and out.stat().st_size else []
    out.unlink()
    return Outcome(list(checks), took, proc.returncode)


def sdk_cell(check: dict[str, Any]) -> str:
    """The SDK column of one check (see ``_common.Sdk.cell``)."""
    sdk = check.get("sdk")
    if not sdk:
        return "-"
    if sdk.get("na"):
        return f"n/a ({sdk['na']})"
    if sdk.get("ratio") is None:
        return "-"
    return f"{float(sdk['ratio']):.2f}x {sdk.get('of', '')}".strip()


def verdict_cell(check: dict[str, Any] | None, outcome: Outcome) -> tuple[str, str, str]:
    if check is None:
        return "-", "ERROR" if outcome.rc != 0 or not outcome.checks else "-", "-"
    return f"{float(check['ratio']):.3f}", "met" if check["ok"] else "MISSED", sdk_cell(check)


def print_table(configs: list[Config], results: dict[str, list[Outcome]]) -> None:
    numbers = dict(BENCHMARKS)
    cw = 38  # one configuration's columns: ratio, verdict, SDK
    width = 3 + 40 + 9 + len(configs) * (cw + 3)
    print("\n" + "=" * width)
    head = f"{'#':2} {'target':40} {'limit':>8}"
    sub = f"{'':2} {'':40} {'':>8}"
    for config in configs:
        head += f" | {config.label[:cw]:{cw}}"
        sub += f" | {'ratio':>7} {'verdict':7} {'SDK: ours / SDK':22}"
    print(head)
    print(sub)
    print("-" * width)
    for name, outcomes in results.items():
        number = numbers.get(name, "+")
        names: list[str] = []
        for outcome in outcomes:
            names += [str(ch["name"]) for ch in outcome.checks if ch["name"] not in names]
        if not names:
            names = [name]
        for check_name in names:
            per = [
                next((ch for ch in o.checks if ch["name"] == check_name), None) for o in outcomes
            ]
            first = next((ch for ch in per if ch is not None), None)
            limit = "-"
            if first is not None:
                sign = ">=" if first["higher_is_better"] else "<="
                limit = f"{sign}{float(first['limit']):g}"
            line = f"{number:2} {check_name[:40]:40} {limit:>8}"
            for check, outcome in zip(per, outcomes, strict=True):
                ratio, verdict, sdk = verdict_cell(check, outcome)
                line += f" | {ratio:>7} {verdict:7} {sdk[:22]:22}"
            print(line)
            for config, check in zip(configs, per, strict=True):
                if check is None:
                    continue
                print(f"{'':3}[{config.label}] {check['measured']}")
                side = check.get("sdk") or {}
                if side.get("figure"):
                    print(f"{'':3}[{config.label}] SDK: {side['figure']}")
        took = ", ".join(f"{c.label} {o.took:.0f}s" for c, o in zip(configs, outcomes, strict=True))
        print(f"{'':3}took: {took}")
    print("=" * width)
    total = [sum(outs[i].took for outs in results.values()) for i in range(len(configs))]
    print(
        "total: "
        + ", ".join(f"{c.label} {t / 60:.1f} min" for c, t in zip(configs, total, strict=True))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        action="append",
        help="an interpreter to run every benchmark under (repeatable; default: this one)",
    )
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--skip", help="comma-separated benchmark names")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: every script runs, numbers mean nothing"
    )
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    skip = set(args.skip.split(",")) if args.skip else set()
    configs = [configuration(p) for p in (args.python or [sys.executable])]
    results: dict[str, list[Outcome]] = {}
    for name, number in BENCHMARKS:
        if (only is not None and name not in only) or name in skip:
            continue
        results[name] = []
        for config in configs:
            print(f"\n######## {number}. {name} [{config.label}] ########", flush=True)
            extra = SMOKE.get(name, []) if args.smoke else []
            results[name].append(run_one(config, name, extra))
    print_table(configs, results)


if __name__ == "__main__":
    main()
