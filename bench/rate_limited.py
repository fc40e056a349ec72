"""Benchmark 10 — a rate-limited provider (issue 15, target 7).

The loopback model server plays a provider that accepts 20 requests/s (a token bucket
holding one second's worth) and answers 429 with ``Retry-After`` beyond that. 400 rows,
one model call each, 64 rows in flight. Ideal wall: 400 / 20 = 20 s. Targets: wall at
most 1.15 x the ideal, no row failed, at most 1.2 requests sent per row (counted by the
server, the preflight's one call included), and the 429s received shown in the results
table (and equal to the server's count).

Where ``osmosis-ai`` imports, ``osmosis eval run``'s own local runner runs the same
workspace against a fresh server, driven offline in process by ``_common.sdk_cmd`` (its
LiteLLM bridge, its rollout server in a child process).

Wall is outer wall (spawn to exit). The server also reports the span from its first
request (the preflight) to its last, and the same run against the server without a rate
limit gives the fixed costs (its wall less its span: interpreter, LiteLLM import,
collection, shutdown), which the notes take out of the rate-limited wall.

    python bench/rate_limited.py [--rows 400] [--rate 20] [--batch 64] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import _common as c

# One rollout for both runners: ours imports the backend; `osmosis eval run` executes the
# file as a script, so the server starts under __main__. One client per process.
ROLLOUT = """
import os

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowConfig, AgentWorkflowOutput, Grader, LocalBackend,
    get_rollout_context,
)

_client = None


class BenchWorkflow(AgentWorkflow):
    async def run(self, ctx):
        global _client
        if _client is None:
            _client = httpx.AsyncClient(timeout=600)
        rollout = get_rollout_context()
        response = await _client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers={"Authorization": f"Bearer {rollout.api_key}"},
            json={"model": "bench", "messages": ctx.prompt},
        )
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class BenchGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


backend = LocalBackend(
    workflow=BenchWorkflow, grader=BenchGrader, workflow_config=AgentWorkflowConfig(name="bench")
)

""" + c.SERVES_ITSELF


def workspace(root: Path, rows: int, batch: int) -> Path:
    c.eval_workspace(root, rows, batch_size=batch)
    (root / "rollouts" / "bench" / "main.py").write_text(ROLLOUT)
    return root


def stats(url: str) -> dict[str, Any]:
    base = url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(base + "/stats", timeout=10) as response:
        return dict(json.loads(response.read()))


def server(rate: float, delay: float) -> Any:
    """The model server as its own process, rate-limited (a fresh bucket per side)."""
    proc = subprocess.Popen(
        [
            c.PYTHON,
            str(c.MODEL_SERVER),
            "--port",
            "0",
            "--delay",
            str(delay),
            "--rate-limit",
            str(rate),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        raise SystemExit(f"model server did not start (said {url!r})")
    return proc, url


def measure(label: str, argv: list[str], root: Path, rate: float, delay: float) -> dict[str, Any]:
    proc, url = server(rate, delay)
    try:
        env = {"OPENAI_API_BASE": url, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-bench"}
        run = c.run(label, argv, cwd=root, env=env, timeout=1800)
        seen = stats(url)
    finally:
        proc.terminate()
        proc.wait(10)
    return {"run": run, **seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0, help="the provider's requests/s")
    parser.add_argument("--batch", type=int, default=64, help="rows in flight")
    parser.add_argument("--delay", type=float, default=0.2, help="the model's answer time, s")
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("rate_limited")
    ideal = args.rows / args.rate
    print(
        f"{args.rows} rows, one call each, {args.batch} in flight; provider {args.rate:g} req/s, "
        f"answers in {args.delay:g} s; ideal {ideal:.1f} s"
    )
    results: dict[str, dict[str, Any]] = {}
    with c.tempdir("bench-ratelimit-") as tmp:
        ours_root = workspace(tmp / "ours", args.rows, args.batch)
        out = ours_root / "out"
        ours = measure(
            "pytest --osmosis-eval",
            c.osmosis_cmd(output=out),
            ours_root,
            args.rate,
            args.delay,
        )
        metrics = c.metrics_of(out)
        summary = metrics.get("summary", {})
        found = re.search(r"rate limit (\d+) calls answered 429", ours["run"].stdout)
        ours["failed"] = int(summary.get("failed", 0))
        ours["reported_429"] = int(found.group(1)) if found else 0
        ours["duration"] = c.duration_s(metrics)
        results["ours"] = ours
        # The same run without a rate limit: what this machine needs for it at all (on a
        # loaded machine that, not the provider, can be the bound).
        free_root = workspace(tmp / "free", args.rows, args.batch)
        free = measure(
            "pytest --osmosis-eval, no limit",
            c.osmosis_cmd(output=free_root / "out"),
            free_root,
            0.0,
            args.delay,
        )
        free.update(failed=0, reported_429=0, duration=None)
        results["free"] = free
        if not args.no_sdk and c.sdk_installed():
            sdk_root = workspace(tmp / "sdk", args.rows, args.batch)
            sdk = measure(
                "osmosis eval run (in process)",
                c.sdk_cmd(sdk_root, output=sdk_root / "sdk-evals", batch_size=args.batch),
                sdk_root,
                args.rate,
                args.delay,
            )
            sdk["failed"] = int(c.sdk_result(sdk["run"]).get("failed", -1))
            sdk["reported_429"] = None
            sdk["duration"] = None
            results["sdk"] = sdk
    print(
        f"\n{'side':32} {'wall s':>7} {'cpu s':>6} {'/ideal':>7} {'requests':>9} {'/row':>6} "
        f"{'429s':>6} {'shown':>6} {'failed':>6}"
    )
    for r in results.values():
        run = r["run"]
        print(
            f"{run.label[:32]:32} {run.wall:7.2f} {run.cpu:6.2f} {run.wall / ideal:7.3f} "
            f"{r['requests_total']:9d} "
            f"{r['requests_total'] / args.rows:6.2f} {r['rate_limited']:6d} "
            f"{'-' if r['reported_429'] is None else r['reported_429']:>6} {r['failed']:6d}"
        )
        if run.rc not in (0, 1):
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-15:])
            print(f"    exit {run.rc}:\n{tail}")
    ours = results["ours"]
    run = ours["run"]
    checks = [
        c.Check(
            "rate-limited provider: wall / ideal",
            f"{run.wall:.2f} s outer wall vs {ideal:.1f} s ideal"
            + (f" (run directory {ours['duration']:.2f} s)" if ours["duration"] else ""),
            f"<= 1.15 x {args.rows} / {args.rate:g} req/s",
            run.wall / ideal,
            1.15,
        ),
        c.Check(
            "rate-limited provider: requests per row",
            f"{ours['requests_total']} requests for {args.rows} rows, {ours['rate_limited']} "
            f"answered 429, {ours['reported_429']} shown in the results table, "
            f"{ours['failed']} rows failed",
            "<= 1.2, no row failed, the 429s shown",
            ours["requests_total"] / args.rows
            if ours["failed"] == 0 and ours["reported_429"] == ours["rate_limited"]
            else float("inf"),
            1.2,
        ),
    ]
    span = ours["span_s"]
    checks[0].notes.append(
        f"first to last request at the provider: {span:.2f} s = {span / ideal:.3f} x ideal "
        f"(the preflight's call first; start-up and shutdown left out); without a limit "
        f"{results['free']['span_s']:.2f} s"
    )
    free_run = results["free"]["run"]
    fixed = free_run.wall - results["free"]["span_s"]
    checks[0].notes.append(
        f"the same run without a rate limit: {free_run.wall:.2f} s outer wall, so "
        f"{fixed:.2f} s of start-up and shutdown; less those, the rate-limited run took "
        f"{run.wall - fixed:.2f} s = {(run.wall - fixed) / ideal:.3f} x ideal"
    )
    checks[0].sdk = checks[1].sdk = c.sdk_absent()
    if "sdk" in results:
        sdk = results["sdk"]
        checks[0].sdk = c.versus_sdk(
            f"{sdk['run'].wall:.2f} s = {sdk['run'].wall / ideal:.2f} x ideal, "
            f"{sdk['failed']} rows failed",
            run.wall,
            sdk["run"].wall,
            "wall",
        )
        checks[1].sdk = c.versus_sdk(
            f"{sdk['requests_total']} requests = {sdk['requests_total'] / args.rows:.2f} a row, "
            f"{sdk['rate_limited']} answered 429 (not shown), {sdk['failed']} rows failed",
            ours["requests_total"],
            sdk["requests_total"],
            "requests",
        )
    c.finish("rate-limited provider", checks, args.json)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
