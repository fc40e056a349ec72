"""Shared test fixtures: the loopback model server, the network guard, offline LiteLLM.

No test may reach the internet. The guard (tests/netguard/) raises before any
non-loopback connect or DNS lookup, records it, and the hook below fails the test
that did it; subprocesses get the same guard through PYTHONPATH + sitecustomize.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Coroutine, Generator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

_TESTS = Path(__file__).resolve().parent
_NETGUARD_DIR = _TESTS / "netguard"

# Before anything imports LiteLLM: never fetch the cost map, tokenizers or headers.
os.environ["LITELLM_OFFLINE_MODE"] = "true"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

# A suite started where Ctrl-C is ignored (a background job of a non-interactive shell:
# SIG_IGN survives exec) would pass that on to every session its tests interrupt, which
# would then run to the end. Python's own handler here gives each child its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The browser tests' plugin module (fixtures `browser`, `watched`): rewrite its asserts.
pytest.register_assert_rewrite("chromium_page")

from model_server import ModelServer  # noqa: E402

try:  # the hook saying what a green run did not cover (absent in copies of this conftest)
    from lane_skips import pytest_terminal_summary  # noqa: F401
except ImportError:
    pass

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # pragma: no cover - hypothesis is in the test extras
    pass
else:
    # CI replays the same examples on every run (a gate must not fail on a new random
    # draw); local runs keep exploring. .ci/run sets HYPOTHESIS_PROFILE=ci.
    _hypothesis_settings.register_profile("ci", derandomize=True, database=None)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

T = TypeVar("T")


def _load_netguard() -> ModuleType:
    existing = sys.modules.get("osmosis_netguard")
    if existing is not None:  # already installed by sitecustomize in this process
        return existing
    spec = importlib.util.spec_from_file_location(
        "osmosis_netguard", _NETGUARD_DIR / "osmosis_netguard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["osmosis_netguard"] = module
    spec.loader.exec_module(module)
    return module


netguard = _load_netguard()
netguard.install()
_log_fd, _log_path = tempfile.mkstemp(prefix="osmosis-netguard-", suffix=".log")
os.close(_log_fd)
netguard.watch_log(_log_path)
_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(_NETGUARD_DIR) not in _pythonpath:  # xdist workers inherit it from the controller
    os.environ["PYTHONPATH"] = os.pathsep.join([str(_NETGUARD_DIR), *_pythonpath])


def pytest_unconfigure(config: pytest.Config) -> None:
    try:  # each process (controller, xdist worker) made its own log
        os.unlink(_log_path)
    except OSError:
        pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Turn any recorded non-loopback attempt during this phase into a test failure."""
    report = yield
    found = netguard.drain()
    if found:
        text = "\n".join(found)
        if report.failed:
            report.sections.append(("network guard", text))
        else:
            report.outcome = "failed"
            report.longrepr = text
    return report


@pytest.fixture
def network_guard() -> ModuleType:
    """The guard module; `with network_guard.expected() as caught:` for tests of it."""
    return netguard


async def _cancel_pending() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _LoopThread:
    """One long-lived event loop on its own thread, the way the plugin drives the bridge."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="test-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run `coro` on the loop thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        # LiteLLM leaves a logging-worker task waiting on this loop; cancel what is
        # left so closing the loop does not raise "Event loop is closed" in it later.
        self.run(_cancel_pending())
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="session")
def model_loop() -> Iterator[_LoopThread]:
    """Session event loop on a thread: `model_loop.run(coro)`. LiteLLM keeps per-loop
    state, so all model calls of a process share this one loop, as in the plugin."""
    runner = _LoopThread()
    yield runner
    runner.close()


@pytest.fixture
def model_server(model_loop: _LoopThread) -> Iterator[ModelServer]:
    """A fresh deterministic OpenAI-compatible server on 127.0.0.1 (see model_server.py)."""
    server = ModelServer().start(loop=model_loop.loop)
    yield server
    server.stop()


#: Where a session's bridge runs (model/bridge_process.py), and the environment that puts it
#: there: in this process as each test set it up, or in a process of its own, which needs
#: rows that reach the model through LiteLLM (an organization header only LiteLLM sends).
BRIDGE_PLACEMENTS: dict[str, dict[str, str]] = {
    "in-process": {},
    "bridge-process": {"OSMOSIS_BRIDGE_PROCESS": "1", "OPENAI_ORGANIZATION": "org-osmosis-test"},
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "bridge_placements: run each test that starts a session (uses model_env) with the "
        "bridge in process and in a process of its own (tests named *xdist*: workers keep "
        "theirs in process)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        metafunc.definition.get_closest_marker("bridge_placements") is not None
        and "model_env" in metafunc.fixturenames
        and "xdist" not in metafunc.function.__name__
    ):
        metafunc.parametrize("bridge_placement", list(BRIDGE_PLACEMENTS), indirect=True)


@pytest.fixture
def bridge_placement(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``in-process`` unless a test is parametrized over BRIDGE_PLACEMENTS."""
    placement: str = getattr(request, "param", "in-process")
    for key, value in BRIDGE_PLACEMENTS[placement].items():
        monkeypatch.setenv(key, value)
    return placement


@pytest.fixture
def model_env(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, bridge_placement: str
) -> ModelServer:
    """The model server, with LiteLLM's OpenAI variables pointing at it (and the OpenAI
    Agents SDK's tracing off: it would export each run's spans to api.openai.com)."""
    for key, value in model_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    return model_server
