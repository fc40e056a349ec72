"""The HTML report in a real headless Chromium, driven over the DevTools protocol.

No Playwright: Debian's ``chromium`` is started with ``--remote-debugging-port=0`` and a
fresh profile; we talk to it with aiohttp's websocket client. The page is a file://
URL and the browser runs with background networking off; the test also records every
request the page makes and requires them all to be file: or data: URLs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from reference_paths import REFERENCE_RUN

from pytest_osmosis.report import write_report_for_run

REFERENCE = REFERENCE_RUN
CHROMIUM = next(
    (
        found
        for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
        if (found := shutil.which(name))
    ),
    None,
)
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary on PATH (Debian: apt-get "
        "install chromium); the report's browser checks need a real browser",
    ),
    pytest.mark.skipif(not REFERENCE.is_dir(), reason="reference run not available"),
]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # even a stray lookup resolves nowhere
]


def copy_run(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    for path in [destination, *destination.rglob("*")]:
        mode = os.lstat(path).st_mode
        os.chmod(path, mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    return destination


@pytest.fixture
def report(tmp_path: Path) -> Path:
    return write_report_for_run(copy_run(REFERENCE, tmp_path / "evals" / "reference-run"))


def index_of(report: Path) -> list[dict[str, Any]]:
    lines = (report.parent / "index.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


class Page:
    """One page target: send commands, collect events."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next = 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        await self.ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=30)
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    async def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {method} event within {timeout} s")
            self.events.append(await self.ws.receive_json(timeout=remaining))

    async def js(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and non-local requests seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if not url.startswith(("file:", "data:", "about:")):
                    found.append(f"network request: {url}")
        return found


@asynccontextmanager
async def browser(tmp_path: Path) -> AsyncIterator[Page]:
    """A fresh headless Chromium with an about:blank page we are attached to."""
    assert CHROMIUM is not None
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    process = subprocess.Popen(
        [
            CHROMIUM,
            *FLAGS,
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"chromium did not start (exit {process.poll()})")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as session:
            targets: list[dict[str, Any]] = []
            while not [t for t in targets if t.get("type") == "page"]:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = await response.json()
                if time.monotonic() > deadline:
                    raise AssertionError("chromium opened no page")
                await asyncio.sleep(0.05)
            target = next(t for t in targets if t.get("type") == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for domain in ("Runtime", "Log", "Network", "Page"):
                    await page.send(f"{domain}.enable")
                yield page
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


async def open_report(page: Page, report: Path) -> None:
    await page.send("Page.navigate", url=report.as_uri())
    await page.wait_event("Page.loadEventFired")
    assert await page.js("document.body.getAttribute('data-ready')") == "1"


VISIBLE_KEYS = (
    "Array.from(document.querySelectorAll('#rows tbody tr'))"
    ".filter(tr => !tr.hidden && tr.offsetParent !== null).map(tr => tr.dataset.key)"
)


def test_page_loads_cleanly_and_draws_the_plots(report: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with browser(tmp_path) as page:
            await open_report(page, report)
            plots = await page.js(
                "Array.from(document.querySelectorAll('svg.plot')).map(svg => {"
                " const box = svg.getBoundingClientRect();"
                " return [svg.dataset.plot, svg.querySelectorAll('rect.bar, circle.point').length,"
                " Math.round(box.width), Math.round(box.height)]; })"
            )
            assert [p[0] for p in plots] == ["reward", "pass-at-k", "per-row", "duration"]
            for name, marks, width, height in plots:
                assert marks > 0, name
                assert width > 200 and height > 100, (name, width, height)
            # pass@k has one point per k: n = 2 here.
            assert plots[1][1] == 2
            # The per-row chart has one bar per dataset row.
            assert plots[2][1] == 6
            assert await page.js(VISIBLE_KEYS) == [
                f"{r['row_index']}.{r['run_index']}" for r in index_of(report)
            ]
            assert await page.js("document.getElementById('count').textContent") == (
                "12 of 12 attempts shown"
            )
            assert page.problems() == []

    asyncio.run(scenario())


def test_filters_show_exactly_the_matching_attempts(report: Path, tmp_path: Path) -> None:
    index = index_of(report)

    def keys(rows: list[dict[str, Any]]) -> list[str]:
        return [f"{r['row_index']}.{r['run_index']}" for r in rows]

    async def select(page: Page, element: str, value: str) -> None:
        await page.js(
            f"(() => {{ const el = document.getElementById({json.dumps(element)});"
            f" el.value = {json.dumps(value)};"
            " el.dispatchEvent(new Event(el.tagName === 'SELECT' ? 'change' : 'input'));"
            " })()"
        )

    async def scenario() -> None:
        async with browser(tmp_path) as page:
            await open_report(page, report)
            await select(page, "f-outcome", "failed")
            failed = [r for r in index if r["status"] == "failed"]
            assert len(failed) == 4
            assert await page.js(VISIBLE_KEYS) == keys(failed)
            await select(page, "f-error", "grader_failed")
            assert await page.js(VISIBLE_KEYS) == keys(
                [r for r in failed if r["error_type"] == "grader_failed"]
            )
            await select(page, "f-error", "")
            await select(page, "f-outcome", "")
            await select(page, "f-max", "0.5")
            assert await page.js(VISIBLE_KEYS) == keys(
                [r for r in index if r.get("reward") is not None and r["reward"] <= 0.5]
            )
            await select(page, "f-max", "")
            await select(page, "f-search", index[6]["rollout_id"][:10])
            assert await page.js(VISIBLE_KEYS) == keys([index[6]])
            await select(page, "f-search", "")
            # Sorting by reward, descending on the second click, keeps every row.
            await page.js("document.querySelector('th[data-sort=reward]').click()")
            await page.js("document.querySelector('th[data-sort=reward]').click()")
            shown = await page.js(VISIBLE_KEYS)
            rewards = {f"{r['row_index']}.{r['run_index']}": r.get("reward") for r in index}
            graded = [rewards[k] for k in shown if rewards[k] is not None]
            assert graded == sorted(graded, reverse=True)
            assert sorted(shown) == sorted(rewards)
            assert page.problems() == []

    asyncio.run(scenario())


def test_clicking_an_attempt_opens_its_trajectory(report: Path, tmp_path: Path) -> None:
    row = index_of(report)[0]
    trajectory = json.loads(
        (report.parent / "rollout_trials" / row["rollout_id"] / "trajectory.json").read_text()
    )

    async def scenario() -> None:
        async with browser(tmp_path) as page:
            await open_report(page, report)
            assert await page.js("document.getElementById('detail').hidden") is True
            await page.js("document.querySelector('#rows tbody tr[data-key=\"0.0\"] td').click()")
            for _ in range(100):
                if await page.js("!document.getElementById('detail').hidden"):
                    break
                await asyncio.sleep(0.02)
            detail = await page.js("document.getElementById('detail').innerText")
            assert "Row 0 · attempt 0" in detail
            steps = await page.js(
                "Array.from(document.querySelectorAll('#detail .step pre.msg'))"
                ".map(p => p.textContent)"
            )
            assert steps == [s["message"] for s in trajectory["steps"]]
            assert "12 prompt / 3 completion" in detail
            assert "answer.txt" in detail and "logs/trace.json" in detail
            assert await page.js("location.hash") == "#row=0.0"
            visible = await page.js(
                "(() => { const r = document.getElementById('detail').getBoundingClientRect();"
                " return r.width > 300 && r.height > 300; })()"
            )
            assert visible
            # A failed attempt without a trajectory says so, and names its error type.
            await page.js("location.hash = 'row=5.1'")
            for _ in range(100):
                if "Row 5 · attempt 1" in await page.js(
                    "document.getElementById('detail').innerText"
                ):
                    break
                await asyncio.sleep(0.02)
            detail = await page.js("document.getElementById('detail').innerText")
            assert "grader_failed" in detail and "No trajectory" in detail
            await page.js("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
            assert await page.js("document.getElementById('detail').hidden") is True
            assert page.problems() == []

    asyncio.run(scenario())


def test_command_line_screenshot(report: Path, tmp_path: Path) -> None:
    """The way docs/report.png is made: Chromium's own --screenshot of a deep link."""
    assert CHROMIUM is not None
    shot = tmp_path / "report.png"
    profile = tmp_path / "shot-profile"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={shot}",
            "--window-size=1400,1000",
            "--hide-scrollbars",
            report.as_uri() + "#row=0.0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
        check=True,
        start_new_session=True,
    )
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1400, 1000)
