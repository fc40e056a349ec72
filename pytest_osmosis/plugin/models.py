"""The session's model pool: one loopback bridge per model, the model-call caches, and the
model check (preflight) before any row starts.

One per process; rows ask it for their model's bridge, the controller asks it to check
every model a run may call. Nothing here knows about items, budgets or run directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_osmosis.core.errors import ModelPreflightError, OsmosisError

if TYPE_CHECKING:
    from pytest_osmosis.execution.dispatch import Dispatch
    from pytest_osmosis.execution.executor import Executor
    from pytest_osmosis.model.bridge import Bridge
    from pytest_osmosis.model.bridge_process import RemoteBridge
    from pytest_osmosis.model.cache import CallCache
    from pytest_osmosis.plugin.session import ControllerRun, SessionOptions

#: A start-up milestone around a phase (``EvalSession.phase``).
Phase = Callable[[str], contextlib.AbstractContextManager[None]]


class ModelPool:
    """The bridges and caches of one process, and the preflight of the models rows call."""

    def __init__(self, config: pytest.Config, options: SessionOptions, phase: Phase) -> None:
        self.config = config
        self.options = options
        self.phase = phase
        self._bridges: dict[str, Bridge | RemoteBridge] = {}
        self._bridge_lock: asyncio.Lock | None = None
        self._caches: dict[Path, CallCache] = {}  # output root -> its model-call cache
        self.pending: dict[str, int] = {}
        """Pending attempts per model (the controller sets it before the preflight)."""
        self._remote: dict[str, RemoteBridge] = {}
        """Models whose bridge runs in a process of its own (model/bridge_process.py)."""

    def judge_models(self, dispatch: Dispatch) -> list[str]:
        """Judge models a rollout's calls may name: its grader's, ini osmosis_judge_models."""
        declared = dispatch.judge_model
        return [*self.options.judge_models, *([declared] if declared else [])]

    async def bridge(self, model_path: str) -> Bridge | RemoteBridge:
        """The loopback bridge for ``model_path``: the one the preflight started in a
        process of its own, else started in this process on first use."""
        from pytest_osmosis.model.bridge import Bridge
        from pytest_osmosis.model.routes import resolve_route

        # No surprise downloads from a test run: LiteLLM's bundled cost map and tokenizers
        # (set LITELLM_LOCAL_MODEL_COST_MAP=False to fetch the latest map).
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        started = self._bridges.get(model_path)
        if started is not None:  # every row after the first: no lock to take
            return started
        if self._bridge_lock is None:
            self._bridge_lock = asyncio.Lock()
        async with self._bridge_lock:
            if model_path not in self._bridges:
                offline = self.options.cache_mode == "replay"
                if offline:  # answers come from the cache: no key, no engine to start
                    from pytest_osmosis.model.cache import offline_route

                    route = offline_route(model_path)
                else:
                    route = await asyncio.get_running_loop().run_in_executor(
                        None, resolve_route, model_path
                    )
                bridge = Bridge(route)
                bridge.offline = offline
                await bridge.start()
                self._bridges[model_path] = bridge
            return self._bridges[model_path]

    def call_cache(self, output_root: Path) -> CallCache | None:
        """The model-call cache beside the runs under `output_root` (None when it is off).

        Opened once per process and root; ``replay`` refuses a missing file (ConfigError).
        """
        mode = self.options.cache_mode
        if mode == "off":
            return None
        cache = self._caches.get(output_root)
        if cache is None:
            from pytest_osmosis.model.cache import CallCache, cache_path

            cache = CallCache(cache_path(output_root), mode, self.options.cache_max_age_s)
            cache.open()
            self._caches[output_root] = cache
        return cache

    def models_to_check(
        self, run: ControllerRun, *, regrading: bool, rollout: Dispatch | None
    ) -> list[str]:
        """The models a run's rows may call, which the preflight checks before any row.

        The run's model; none under ``--osmosis-cache replay`` (no call reaches a model;
        ``use`` may call one for a request it has not seen, so its model is checked); under
        a regrade only the judge models its grader declares (the workflow does not run).
        """
        cache = self.call_cache(run.plan.output_root)
        if cache is not None and cache.replay:
            return []
        if not regrading:
            return [run.plan.settings.model_path]
        return [] if rollout is None else self.judge_models(rollout)

    def preflight(
        self,
        model_paths: list[str],
        executor: Callable[[], Executor],
        runs: Iterable[ControllerRun],
        *,
        in_process: bool,
    ) -> None:
        """Check each model before any row starts (:meth:`models_to_check`); raises
        :class:`ModelPreflightError`.

        ``in_process`` (a process that runs rows) imports LiteLLM here, on a thread of its own
        while the models are checked, unless no row needs it; an xdist controller checks
        OpenAI-compatible routes directly and others in a child process (model/preflight.py).
        """
        if not model_paths:
            return
        # Imported here first, so the check never waits for LiteLLM's thread to finish
        # importing a module both need (aiohttp's client above all).
        import aiohttp  # noqa: F401

        import pytest_osmosis.model.preflight  # noqa: F401
        from pytest_osmosis.model.litellm import litellm_ready, start_import

        if in_process:
            self._place(model_paths)
        needing = sorted(path for path in set(model_paths) if self.rows_need_litellm(path))
        try:
            if in_process and needing:
                start_import()
            executor().call(self._preflight_all(model_paths, list(runs), in_process))
            if in_process and needing and not litellm_ready():
                self._import_litellm(needing[0])
        except KeyboardInterrupt:
            from pytest_osmosis.model.preflight import interrupted

            interrupted()
            raise

    def rows_need_litellm(self, model_path: str) -> bool:
        """Whether rows reach this model through LiteLLM, or need its prices (a cost budget).

        ``osmosis/embedded`` and endpoints over plain HTTP are called directly
        (model/direct.py::rows_go_direct); a call LiteLLM would rewrite still imports it then.
        """
        from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH

        if model_path == EMBEDDED_MODEL_PATH or model_path in self._remote:
            return False  # a bridge of its own process imports LiteLLM there
        from pytest_osmosis.model.direct import rows_go_direct
        from pytest_osmosis.model.preflight import unknown_provider
        from pytest_osmosis.model.routes import resolve_route

        route = resolve_route(model_path)
        if unknown_provider(route) is not None:
            return False  # no row runs: the preflight refuses it without LiteLLM
        prices = self.options.gate.values.get("max_cost") is not None
        return prices or not rows_go_direct(route)

    def _place(self, model_paths: list[str]) -> None:
        """Decide, once per model, whether its rows' bridge runs in a process of its own
        (model/bridge_process.py::placement); such a bridge is started by the preflight."""
        from pytest_osmosis.model.bridge_process import RemoteBridge, placement
        from pytest_osmosis.model.preflight import unknown_provider
        from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, resolve_route

        offline = self.options.cache_mode == "replay"
        for model_path in sorted(set(model_paths) - self._remote.keys()):
            if model_path == EMBEDDED_MODEL_PATH or model_path in self._bridges:
                continue
            if model_path not in self.pending:
                continue  # a judge model, or a regrade: rows do not call it as the run's model
            try:
                route = resolve_route(model_path)
            except Exception:  # noqa: BLE001 - the preflight says what is wrong with it
                continue
            if unknown_provider(route) is not None:
                continue
            if placement(route, self.pending[model_path], offline=offline) == "process":
                self._remote[model_path] = RemoteBridge(route)

    def _import_litellm(self, model_path: str) -> None:
        """Wait for LiteLLM (rows call the model through it): a failed import is one line."""
        from pytest_osmosis.model.litellm import import_litellm

        try:
            with self.phase("importing LiteLLM"):
                import_litellm()
        except ModelPreflightError as exc:
            raise ModelPreflightError(f"model preflight failed for {model_path!r}: {exc}") from None

    async def _preflight_all(
        self, model_paths: list[str], runs: list[ControllerRun], in_process: bool
    ) -> None:
        """Check each model (needing its route only: no bridge is started for it here)."""
        from pytest_osmosis.model.preflight import check_model
        from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, resolve_route

        loop = asyncio.get_running_loop()
        for model_path in sorted(set(model_paths)):
            try:
                loading = model_path == EMBEDDED_MODEL_PATH
                with self.phase(f"loading {model_path}") if loading else contextlib.nullcontext():
                    route = await loop.run_in_executor(None, resolve_route, model_path)
                remote = self._remote.get(model_path)
                with self.phase(f"checking model {model_path}"):
                    if remote is not None:  # checked there, as this process would have
                        warning = await self._check_remote(model_path, remote)
                    else:
                        warning = await check_model(route, in_process=in_process)
            except Exception as exc:  # noqa: BLE001 - anything here means the model is unusable
                text = str(exc)
                if not isinstance(exc, OsmosisError):
                    text = f"{type(exc).__name__}: {' '.join(text.split())}"
                if not text.startswith("model preflight failed"):
                    text = f"model preflight failed for {model_path!r}: {text}"
                raise ModelPreflightError(text) from None
            if warning:
                for run in runs:
                    if run.plan.settings.model_path == model_path:
                        run.log.warning("preflight", warning)

    async def _check_remote(self, model_path: str, remote: RemoteBridge) -> str | None:
        from pytest_osmosis.model.preflight import unknown_provider

        refused = unknown_provider(remote.route)
        if refused is not None:
            from pytest_osmosis.core.errors import ModelPreflightError

            raise ModelPreflightError(refused)
        await remote.start()
        self._bridges[model_path] = remote  # closed with the others, checked or not
        await remote.preflight()
        return remote.preflight_warning

    def close(self, executor: Executor | None) -> None:
        """Close the bridges (and bridge_client()'s pools) on the loop, before it closes."""
        from pytest_osmosis.model.bridge_process import RemoteBridge

        if executor is not None:
            clients = sys.modules.get("pytest_osmosis.model.client")
            if clients is not None:  # some rollout used bridge_client(): close its pool
                try:
                    executor.call(clients.close_pools(), timeout=5)
                except Exception:  # noqa: BLE001 - shutting down; nothing to report to
                    pass
        for bridge in list(self._bridges.values()):
            if isinstance(bridge, RemoteBridge):
                bridge.stop()  # not on the loop: it waits for the helper's cache to be written
            elif executor is not None:
                try:
                    executor.call(bridge.close(), timeout=5)
                except Exception:  # noqa: BLE001 - shutting down; nothing to report to
                    pass

    def close_caches(self) -> None:
        """After the loop: what the bridges queued is written before the session ends."""
        caches, self._caches = list(self._caches.values()), {}
        for cache in caches:
            cache.close()  # what the bridges queued is written before the session ends
