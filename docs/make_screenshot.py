"""Regenerate docs/report.png, docs/compare.png and docs/runs.png from real eval runs.

    python docs/make_screenshot.py [--keep DIR]

Offline: the model is tests/model_server.py on 127.0.0.1, the rollout below asks it
arithmetic (one row through a calculator tool call), and a few rows are flaky or
broken on purpose so every part of the report has something to show. Three runs are
made (two of an older "model" that gets two sums wrong, then the current one), so the
comparison and runs.html have something to compare. Playwright drives Debian's
chromium (no browser download).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from model_server import ModelServer, ToolRule  # noqa: E402
from workspaces import write_workspace  # noqa: E402

ROLLOUT = """
import asyncio
import json
import random

import httpx

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from pytest_osmosis.rollout import get_rollout_context

TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "a times b",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}}}}}]


class CalcAgent(AgentWorkflow):
    async def run(self, ctx):
        do = (ctx.metadata or {}).get("do", "")
        await asyncio.sleep(random.uniform(0.05, 0.6))
        if do == "crash":
            raise RuntimeError("calculator backend unavailable")
        rollout = get_rollout_context()
        messages = list(ctx.prompt)
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(3):
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "agent", "messages": messages, "tools": TOOLS},
                )
                body = response.json()
                reply = body["choices"][0]["message"]
                messages.append({**reply, "usage": body["usage"]})
                if not reply.get("tool_calls"):
                    break
                for call in reply["tool_calls"]:
                    args = json.loads(call["function"]["arguments"])
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": str(args["a"] * args["b"])})
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "answer.txt").write_text(messages[-1]["content"] or "")
            (ctx.artifacts_dir / "notes.json").write_text(json.dumps({"turns": len(messages)}))
        return AgentWorkflowOutput(messages=messages)


class Grader_(Grader):
    async def grade(self, ctx):
        do = (ctx.metadata or {}).get("do", "")
        if do == "skip":
            ctx.sample.remove_sample = True
            return
        answer = (ctx.sample.messages[-1].get("content") or "").strip()
        if do == "flaky":
            ctx.set_reward(random.choice([0.0, 0.25, 0.5, 1.0, 1.0]))
            return
        passed = answer == ctx.label
        ctx.sample.extra_fields["explanation"] = (
            f"the answer {answer!r} is the label" if passed
            else f"expected {ctx.label!r}, the agent answered {answer!r}"
        )
        ctx.set_reward(1.0 if passed else 0.0)


backend = LocalBackend(workflow=CalcAgent, grader=Grader_)
"""

ROWS = [
    ("What is 2 + 2?", "4"),
    ("What is 3 * 5?", "15"),
    ("What is 7 - 9?", "-2"),
    ("What is 12 times 34?", "408"),
    ("What is 1 / 3?", "0.333333"),
    ("What is 6 * 7?", "42"),
    ("What is 10 + 5?", "16"),
    ("What is 9 * 9?", "81", "flaky"),
    ("What is 8 + 8?", "16", "flaky"),
    ("What is 5 - 5?", "0", "crash"),
    ("What is 4 + 4?", "8", "skip"),
    ("What is 100 / 4?", "25"),
]


#: (run name, model, scripted wrong answers): the older model gets two sums wrong.
RUNS = [
    ("arith-monday", "openai/calc-model-v1", {"3 * 5": "35", "6 * 7": "48"}),
    ("arith-tuesday", "openai/calc-model-v1", {"3 * 5": "35"}),
    ("arith-nightly", "openai/calc-model-v2", {}),
]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def _workspace(base: Path) -> None:
    rows = []
    for spec in ROWS:
        row: dict[str, object] = {"user_prompt": spec[0], "ground_truth": spec[1]}
        if len(spec) > 2:
            row["metadata"] = {"do": spec[2]}
        rows.append(row)
    write_workspace(
        base,
        name="arith",
        rows=rows,
        rollout_source=ROLLOUT,
        evaluation={"n": 4},
        model_path="openai/calc-model",
        dataset="arith-12",
        rollout="calc-agent",
    )


def _shoot(page: object, url: str, out: Path, *, then: str | None = None) -> None:
    page.goto(url)  # type: ignore[attr-defined]
    page.wait_for_selector("body[data-ready='1'], #runs")  # type: ignore[attr-defined]
    if then:
        page.evaluate(then)  # type: ignore[attr-defined]
        page.wait_for_timeout(200)  # type: ignore[attr-defined]
    page.screenshot(path=str(out))  # type: ignore[attr-defined]
    print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", type=Path, help="build the workspace here and keep it")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where the PNGs go")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is not installed (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    base = args.keep or Path(tempfile.mkdtemp(prefix="osmosis-shot-"))
    base.mkdir(parents=True, exist_ok=True)
    _workspace(base)
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with ModelServer() as server:
        server.tool_rules = [ToolRule("times", "multiply", {"a": 12, "b": 34})]
        env.update(server.env())
        for name, model, wrong in RUNS:
            server.replies = dict(wrong)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "--osmosis-eval",
                    "--osmosis-name",
                    name,
                    "--osmosis-model",
                    model,
                    "--osmosis-report",
                    "-p",
                    "no:cacheprovider",
                    "-q",
                ],
                cwd=base,
                env=env,
                check=False,
                stdout=subprocess.DEVNULL,
            )

    def command(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest_osmosis", *argv],
            cwd=base,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    report = Path(command("report", "latest"))
    compared = Path(command("report", "latest", "--compare", "arith-monday"))
    index = Path(command("report", "--index"))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        # The table with its input, label and answer columns; the drawer on the row
        # whose answer is wrong ("10 + 5" is labelled 16), with the grader's explanation.
        _shoot(
            page,
            report.as_uri() + "#row=6.0",
            args.docs / "report.png",
            then="(() => { const f = document.getElementById('f-outcome');"
            " f.value = 'not_passed'; f.dispatchEvent(new Event('change'));"
            " document.getElementById('attempts').scrollIntoView(); })()",
        )
        _shoot(
            page,
            compared.as_uri() + "#cmp=1",
            args.docs / "compare.png",
            then="document.getElementById('row-by-row').scrollIntoView({block: 'center'})",
        )
        page.set_viewport_size({"width": 1200, "height": 760})
        _shoot(page, index.as_uri(), args.docs / "runs.png")
        browser.close()
    if args.keep is None:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
