"""Benchmark: does the regression gate decide well? (issue 25)

Simulates pairs of runs over the same rows and applies the gate's own rule
(``gate.shows_regression`` on ``report.compare.paired_test`` and Newcombe's interval, at
``--osmosis-max-regression 0``) to each pair, paired and unpaired side by side:

- at a true drop of 0 the share of pairs the gate fails is its false-fail rate, which
  must stay at or below alpha (0.05) for both tests (the script exits 1 otherwise);
- at a true drop of 5, 10 and 20 points the share it fails is its power.

The rows: each trial draws a fresh dataset whose rows' true pass probabilities ``q`` come
from Beta(0.5, 0.5) (mean 50%, U-shaped: most rows nearly always or nearly never pass, some
are flaky; about a quarter of the rows flip between two runs of the same rollout at n = 1).
The baseline's attempts pass with probability ``q``; the current run's with
``q * (1 - drop / mean(q))``, so its true pass rate is exactly ``drop`` lower (every row
a little worse, none better). Deterministic for a given ``--seed``.

    python bench/gate_power.py [--trials 2000] [--seed 25]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_osmosis.gate import shows_regression  # noqa: E402
from pytest_osmosis.report.compare import paired_test  # noqa: E402
from pytest_osmosis.report.stats import ALPHA, newcombe_difference  # noqa: E402

DROPS = (0.0, 0.05, 0.10, 0.20)
SIZES = (30, 100, 300)
ATTEMPTS = (1, 3)


def one_pair(rng: random.Random, rows: int, n: int, drop: float) -> tuple[bool, bool]:
    """(paired fails, unpaired fails) for one simulated baseline/current pair."""
    q = [rng.betavariate(0.5, 0.5) for _ in range(rows)]
    mean = sum(q) / rows
    scale = max(0.0, 1.0 - drop / mean) if mean > 0 else 1.0
    changes: list[Fraction] = []
    totals = [0, 0, 0, 0]  # current passes, attempts; baseline passes, attempts
    for p in q:
        before = sum(rng.random() < p for _ in range(n))
        after = sum(rng.random() < p * scale for _ in range(n))
        changes.append(Fraction(after - before, n))
        totals[0] += after
        totals[1] += n
        totals[2] += before
        totals[3] += n
    paired = paired_test(changes, n == 1)
    difference, low, high = newcombe_difference(*totals)
    unpaired = {"difference": difference, "ci95_low": low, "ci95_high": high}
    return (
        shows_regression("paired", paired, unpaired, 0.0),
        shows_regression("unpaired", paired, unpaired, 0.0),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    print(f"gate power: {args.trials} trials per cell, alpha {ALPHA:g}, seed {args.seed}")
    print("share of pairs the gate fails (--osmosis-max-regression 0): paired / unpaired")
    header = f"{'rows':>5} {'n':>2}  " + "  ".join(
        f"{f'drop {drop * 100:.0f} pp':>15}" for drop in DROPS
    )
    print(header)
    worst = 0.0
    for rows in SIZES:
        for n in ATTEMPTS:
            cells = []
            for drop in DROPS:
                paired = unpaired = 0
                for _ in range(args.trials):
                    p, u = one_pair(rng, rows, n, drop)
                    paired += p
                    unpaired += u
                cells.append(f"{paired / args.trials:6.1%} / {unpaired / args.trials:6.1%}")
                if drop == 0.0:
                    worst = max(worst, paired / args.trials, unpaired / args.trials)
            print(f"{rows:>5} {n:>2}  " + "  ".join(f"{cell:>15}" for cell in cells))
    verdict = "ok" if worst <= ALPHA else "TOO HIGH"
    print(f"false-fail rate at drop 0: at most {worst:.2%} (alpha {ALPHA:.0%}): {verdict}")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0 if worst <= ALPHA else 1


if __name__ == "__main__":
    sys.exit(main())
