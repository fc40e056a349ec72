"""``logs.txt``: the run log, with secret values redacted from every line.

Format (contract §7.8): ``<UTC ISO µs>Z <LEVEL> [<step>] <message>[ <json details>]``,
the shape ``osmosis eval download`` produces for cloud runs, so local and
downloaded runs read the same. Lines are single ``O_APPEND`` writes, so several
processes (xdist workers) may append to one log without interleaving.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.results.atomic import FILE_MODE, utc_now

REDACTED = "[REDACTED]"

#: Provider and platform keys that often sit in the environment without being
#: listed in ``[secrets]``; osmosis-ai 0.3.8 scrubs them from logs.txt on upload.
AMBIENT_SECRET_ENV_NAMES: frozenset[str] = frozenset(
    {
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "XAI_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "OPENROUTER_API_KEY",
        "CEREBRAS_API_KEY",
        "AZURE_API_KEY",
        "TOGETHER_API_KEY",
        "FIREWORKS_API_KEY",
        "GROQ_API_KEY",
        "MISTRAL_API_KEY",
        "COHERE_API_KEY",
        "DEEPSEEK_API_KEY",
        "HUGGINGFACE_API_KEY",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "OSMOSIS_TOKEN",
        "OSMOSIS_API_KEY",
        "DAYTONA_API_KEY",
        "CURSOR_API_KEY",
        "MSWEA_API_KEY",
    }
)


def ambient_secret_values(env: Mapping[str, str], *, min_length: int = 8) -> list[str]:
    """Values of :data:`AMBIENT_SECRET_ENV_NAMES` in *env* that are long enough to redact."""
    return [
        value
        for name in sorted(AMBIENT_SECRET_ENV_NAMES)
        if (value := env.get(name)) and len(value) >= min_length
    ]


class Redactor:
    """Replaces known secret values with ``[REDACTED]``, longest first.

    Substring replacement keeps the rest of the line (the status code, the frame)
    that made it worth logging. Values shorter than *min_length* are ignored so a
    short value cannot shred unrelated text.
    """

    def __init__(self, secrets: Iterable[str] = (), min_length: int = 8) -> None:
        self.min_length = min_length
        self._values: list[str] = []
        self.extend(secrets)

    def extend(self, secrets: Iterable[str]) -> None:
        """Add more values (e.g. secrets resolved after the log was opened)."""
        for value in secrets:
            if value and len(value) >= self.min_length and value not in self._values:
                self._values.append(value)
        # Longest first, so a value that contains another is redacted whole.
        self._values.sort(key=len, reverse=True)

    def redact(self, text: str) -> str:
        """*text* with every known value replaced."""
        for value in self._values:
            text = text.replace(value, REDACTED)
        return text

    def __len__(self) -> int:
        return len(self._values)


class RunLog:
    """Appends redacted lines to ``logs.txt`` (mode 0600, created if absent)."""

    def __init__(self, path: Path, redactor: Redactor | None = None) -> None:
        self.path = path
        self.redactor = redactor if redactor is not None else Redactor()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._lock = threading.Lock()

    @staticmethod
    def format_line(level: str, step: str, message: str, details: Mapping[str, Any]) -> str:
        """One log line, without redaction or newline."""
        line = f"{utc_now()} {level.upper()} [{step}] {message}"
        if details:
            encoded = json.dumps(
                dict(details),
                ensure_ascii=False,
                sort_keys=True,
                separators=(",", ":"),
                default=str,
            )
            line = f"{line} {encoded}"
        return line

    def write(self, level: str, step: str, message: str, **details: Any) -> str:
        """Append one line; returns it as written (redacted, without the newline).

        Embedded newlines are escaped so one call is always one line.
        """
        line = self.format_line(level, step, message, details)
        line = self.redactor.redact(line).replace("\r", "\\r").replace("\n", "\\n")
        data = (line + "\n").encode("utf-8", errors="replace")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        return line

    def info(self, step: str, message: str, **details: Any) -> str:
        return self.write("info", step, message, **details)

    def warning(self, step: str, message: str, **details: Any) -> str:
        return self.write("warning", step, message, **details)

    def error(self, step: str, message: str, **details: Any) -> str:
        return self.write("error", step, message, **details)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
