"""Provider exceptions as one line: what the bridge, its preflight and its judges report.

LiteLLM's errors are long, multi-line and may quote a key; a rollout, a log line and
the session's failure message get one short line instead, and the exception chain
tells a refused connection from a real provider error.
"""

from __future__ import annotations

import errno
import re

from pytest_osmosis.results.redact import scrub

# Contract §5.5: these LiteLLM exceptions mean the configuration is wrong, not flaky.
_PREFLIGHT_FATAL = frozenset(
    {
        "AuthenticationError",
        "BudgetExceededError",
        "NotFoundError",
        "UnsupportedParamsError",
        "APIConnectionError",
        "BadRequestError",
        "PermissionDeniedError",
        "UnprocessableEntityError",
    }
)
# LiteLLM reports a refused connection or a missing OpenAI key as an
# InternalServerError; the cause chain tells them apart from a real provider 500.
_CONNECT_ERRORS = frozenset(
    {"APIConnectionError", "ConnectError", "ClientConnectorError", "ConnectTimeout"}
)
_CREDENTIAL_HINT = re.compile(r"api[ _-]?key|credential", re.IGNORECASE)


def provider_line(text: str, secret_values: tuple[str, ...] = ()) -> str:
    """Provider text as one line: no traceback, no ``litellm.`` prefix, no secret (uncut)."""
    flat = " ".join(text.split("Traceback (most recent call last)", 1)[0].split())
    if flat.startswith("litellm."):
        flat = flat[len("litellm.") :]
    return scrub(flat, secret_values)


def _one_line(exc: BaseException, secret_values: tuple[str, ...] = ()) -> str:
    """A provider error as one short line, with anything that looks like a secret removed."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    return provider_line(text, secret_values)[:500]


def _chain(exc: BaseException) -> list[BaseException]:
    links: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(links) < 20 and all(link is not seen for seen in links):
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


def _endpoint_of(chain: list[BaseException]) -> str:
    """host:port of a failed connect (aiohttp's error carries them), for the message."""
    for link in chain:
        host, port = getattr(link, "host", None), getattr(link, "port", None)
        if isinstance(host, str) and host:
            return f"{host}:{port}" if port else host
    return "the provider endpoint"


def _out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is this process running out of file descriptors."""
    return any(
        isinstance(link, OSError) and link.errno in (errno.EMFILE, errno.ENFILE)
        for link in _chain(exc)
    )
