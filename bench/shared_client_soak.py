"""Soak — one shared ``httpx.AsyncClient`` through the bridge loses no call (issue 26 §4).

Rows make one model call each through one module-level ``httpx.AsyncClient`` with httpx's
default limits (the shape of a rollout that keeps one client), 64 rows in flight. Every
tenth row's answer takes ``--slow`` seconds, the others ``--delay``: the load rises and falls,
so pooled connections sit idle for seconds and are then reused, around httpx's 5 s expiry.
When the bridge closed idle connections at that same 5 s, a request sent on one as it was
closed failed its row (``httpx.ReadError``: 1 in 1,000 rows). Target: 0 rows errored.

    python bench/shared_client_soak.py [--rows 10000] [--batch 64] [--delay 0.2] [--slow 5.0]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import tempfile
from pathlib import Path

import _common as c


def _model_server(
    delay: float, slow: float, config_dir: Path
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """The loopback model server, every tenth row (prompt "What is N0 + 1?") slow."""
    config = config_dir / "model.json"
    config.write_text(json.dumps({"delay": delay, "delays": {"0 + 1?": slow}}))
    proc = subprocess.Popen(
        [c.PYTHON, str(c.MODEL_SERVER), "--port", "0", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise SystemExit(f"model server did not start (said {url!r})")
    env = {"OPENAI_API_BASE": url, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-bench-soak"}
    return proc, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--slow", type=float, default=5.0)
    parser.add_argument("--json", help="write the checks here as JSON")
    args = parser.parse_args()
    c.header(f"shared httpx client soak: {args.rows} rows, {args.batch} in flight")
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as name:
        root = Path(name)
        workspace = c.eval_workspace(root / "ws", args.rows, batch_size=args.batch)
        proc, env = _model_server(args.delay, args.slow, root)
        try:
            output = root / "out"
            run = c.run(
                "pytest --osmosis-eval (shared httpx client)",
                c.osmosis_cmd(output=output),
                cwd=workspace,
                env={**env, "BENCH_MODE": "bridge", "BENCH_CLIENT": "httpx"},
                timeout=3600,
            )
        finally:
            proc.terminate()
            proc.wait(10)
        c.print_runs([run])
        (run_dir,) = [p for p in output.iterdir() if not p.name.startswith(".")]
        rows = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    errors = collections.Counter(
        row.get("error_type") or row["status"] for row in rows if row["status"] != "success"
    )
    checks = [
        c.Check(
            "rows errored through one shared httpx client",
            f"{sum(errors.values())} of {len(rows)} rows ({dict(errors) or 'none'}); "
            f"{run.wall:.0f} s wall",
            "0 rows errored, every row recorded",
            ratio=float(sum(errors.values()) + (args.rows - len(rows))),
            limit=0.0,
        )
    ]
    c.finish("shared client soak", checks, args.json)


if __name__ == "__main__":
    main()
