"""Real Chromium for the report's browser tests, as a pytest plugin module.

Playwright (from PyPI) drives Debian's ``chromium`` through ``executable_path``: no
browser is downloaded. Pages are file:// URLs; every request a page makes is recorded and
must be file:, data: or about:, and console errors or uncaught exceptions fail the test.
Use it with ``pytest_plugins = ["chromium_page"]`` and the ``watched`` fixture.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = next(
    (
        found
        for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
        if (found := shutil.which(name))
    ),
    None,
)
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # even a stray lookup resolves nowhere
]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium binary on PATH (Debian: apt-get install chromium); the report's "
    "browser checks need a real browser",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


class Watched:
    """A page and what went wrong on it: console errors, exceptions, non-local requests."""

    def __init__(self, browser: Any, width: int = 1500, height: int = 950) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.problems.append(f"exception: {error}"))
        self.page.on("request", self._request)

    def _console(self, message: Any) -> None:
        if message.type in ("error", "assert"):
            self.problems.append(f"console.{message.type}: {message.text}")

    def _request(self, request: Any) -> None:
        if not request.url.startswith(("file:", "data:", "about:")):
            self.problems.append(f"network request: {request.url}")

    def open(self, path: Path, fragment: str = "") -> Any:
        self.page.goto(path.as_uri() + fragment)
        return self.page

    def drawer_text(self) -> str:
        self.page.wait_for_selector("#detail:not([hidden])")
        return str(self.page.inner_text("#detail"))


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    page = Watched(browser)
    yield page
    page.context.close()
    assert page.problems == []
