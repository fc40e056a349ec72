"""Run every benchmark one after the other and print one table of ratios vs targets.

Each benchmark runs in its own process (``python bench/<name>.py --json ...``), so a
crash in one does not hide the others; their own output streams through as they run.
They run sequentially, never in parallel: on a 2-core machine they would measure each
other. Roughly 10 minutes in all.

    python bench/run_all.py [--only startup,collection,...] [--skip vs_xdist]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--skip", help="comma-separated benchmark names")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    skip = set(args.skip.split(",")) if args.skip else set()
    rows: list[tuple[str, str, dict[str, object] | None, float]] = []
    for name, number in BENCHMARKS:
        if (only is not None and name not in only) or name in skip:
            continue
        print(f"\n######## {number}. {name} ########", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
            out = Path(fh.name)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), "--json", str(out)])
        took = time.perf_counter() - start
        checks = json.loads(out.read_text()) if proc.returncode == 0 and out.stat().st_size else []
        out.unlink()
        if not checks:
            rows.append((number, name, None, took))
        for check in checks:
            rows.append((number, name, check, took))
    print("\n" + "=" * 100)
    print(f"{'#':2} {'target':48} {'ratio':>8} {'limit':>8}  {'verdict':8} {'took':>6}")
    print("-" * 100)
    for number, name, check, took in rows:
        if check is None:
            print(f"{number:2} {name:48} {'-':>8} {'-':>8}  {'ERROR':8} {took:5.0f}s")
            continue
        sign = ">=" if check["higher_is_better"] else "<="
        verdict = "met" if check["ok"] else "MISSED"
        print(
            f"{number:2} {str(check['name'])[:48]:48} {float(check['ratio']):8.3f} "  # type: ignore[arg-type]
            f"{sign}{float(check['limit']):6g}  {verdict:8} {took:5.0f}s"  # type: ignore[arg-type]
        )
        print(f"{'':3}{check['measured']}")
    print("=" * 100)


if __name__ == "__main__":
    main()
