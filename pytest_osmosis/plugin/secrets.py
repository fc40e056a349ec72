"""``[secrets]``: resolve the values (what keeps them out of output is ``plugin/redaction.py``).

Resolution follows the SDK (contract §9.4): ``--osmosis-secrets-file`` (dotenv, ``-``
reads stdin) first, then the environment (non-empty values only); the names nobody
supplied stop the session together, in one line. Values found only in the file are
exported into ``os.environ`` so LiteLLM and in-process rollouts can read them.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

import pytest

from pytest_osmosis.core.errors import OsmosisError

STDIN = "-"
#: The largest secrets file read (a dotenv file is a few hundred bytes; this is generous).
MAX_SECRETS_FILE_BYTES = 1024 * 1024
_OPTION = "--osmosis-secrets-file"


class MissingSecretsError(OsmosisError):
    """A ``[secrets]`` name has no value in the secrets file or the environment."""


class SecretsFileError(OsmosisError):
    """The secrets file cannot be read or has a line that is not ``NAME=value``."""


# --------------------------------------------------------------------------- #
# Resolution
# --------------------------------------------------------------------------- #


def parse_dotenv(text: str, *, label: str) -> dict[str, str]:
    """``NAME=value`` pairs: ``#`` comments, optional ``export``, one pair of quotes stripped.

    Errors name the line, never its content: every line of this file is a secret.
    """
    values: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, separator, value = stripped.partition("=")
        name = name.strip()
        if name.startswith("export") and name[6:7].isspace():
            name = name[6:].strip()
        if not separator or not name.isidentifier():
            raise SecretsFileError(
                f"{_OPTION} {label}: line {lineno} is not NAME=value with NAME an identifier "
                "(values spanning several lines are not supported)"
            )
        values[name] = _unquote(value.strip())
    return values


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def read_dotenv(
    source: str,
    *,
    base_dir: Path | None = None,
    read_stdin: Callable[[], str] | None = None,
) -> dict[str, str]:
    """Parse the secrets file *source* (``-``: stdin, read with *read_stdin*)."""
    if source == STDIN:
        try:
            text = (read_stdin or _read_stdin_bounded)()
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise SecretsFileError(f"{_OPTION} -: cannot read stdin: {exc}") from None
        if len(text) > MAX_SECRETS_FILE_BYTES:
            raise SecretsFileError(_too_big("- (stdin)"))
        return parse_dotenv(text, label="(stdin)")
    path = Path(source)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    data = _read_regular_file(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SecretsFileError(f"{_OPTION} {path}: is not UTF-8 text") from None
    return parse_dotenv(text, label=str(path))


def _read_regular_file(path: Path) -> bytes:
    """The bytes of *path*: a regular file of at most :data:`MAX_SECRETS_FILE_BYTES`.

    A FIFO, a device (``/dev/zero``) or a directory is refused before reading, so the
    session can neither block on it nor read without bound.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SecretsFileError(
            f"{_OPTION} {path}: cannot read it ({exc.strerror or exc})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretsFileError(
                f"{_OPTION} {path}: is not a regular file ({_file_kind(info.st_mode)}); "
                "pass a dotenv file, or - for stdin"
            )
        if info.st_size > MAX_SECRETS_FILE_BYTES:
            raise SecretsFileError(_too_big(str(path)))
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRETS_FILE_BYTES:
            chunk = os.read(fd, MAX_SECRETS_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SECRETS_FILE_BYTES:  # it grew while being read
            raise SecretsFileError(_too_big(str(path)))
        return b"".join(chunks)
    except OSError as exc:
        raise SecretsFileError(
            f"{_OPTION} {path}: cannot read it ({exc.strerror or exc})"
        ) from None
    finally:
        os.close(fd)


def _too_big(label: str) -> str:
    return (
        f"{_OPTION} {label}: is larger than {MAX_SECRETS_FILE_BYTES // 1024 // 1024} MiB "
        "(a dotenv file of NAME=value lines is expected)"
    )


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"


_DOTENV_KEY = pytest.StashKey[dict[str, dict[str, str]]]()


def resolve_secrets(
    names: Sequence[str],
    secrets_file: str | None,
    *,
    config: pytest.Config | None = None,
    config_path: Path | str | None = None,
    environ: MutableMapping[str, str] | None = None,
    read_stdin: Callable[[], str] | None = None,
    export: bool = True,
) -> dict[str, str]:
    """The value of every name, by first hit: *secrets_file*, then the environment.

    With *config*, a relative file is taken from the invocation directory, stdin is read
    past pytest's capture, and each file is read once per session (stdin can be read only
    once, and several eval configs may name secrets). Values that came from the file are
    exported into *environ* (``os.environ``) unless it already holds a non-empty value.
    Raises :class:`MissingSecretsError` naming every missing name and where it looked.
    """
    env = os.environ if environ is None else environ
    from_file: dict[str, str] = {}
    if secrets_file:
        from_file = _file_values(secrets_file, config, read_stdin)
    resolved: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        if name in from_file:
            resolved[name] = from_file[name]
        elif env.get(name):
            resolved[name] = env[name]
        else:
            missing.append(name)
    if missing:
        raise MissingSecretsError(_missing_message(missing, secrets_file, config, config_path))
    if export:
        for name, value in resolved.items():
            if name in from_file and value and not env.get(name):
                env[name] = value
    return resolved


def _file_values(
    source: str, config: pytest.Config | None, read_stdin: Callable[[], str] | None
) -> dict[str, str]:
    if config is None:
        return read_dotenv(source, read_stdin=read_stdin)
    cache = config.stash.setdefault(_DOTENV_KEY, {})
    if source not in cache:
        base = config.invocation_params.dir
        reader = read_stdin or (lambda: _read_stdin_uncaptured(config))
        cache[source] = read_dotenv(source, base_dir=base, read_stdin=reader)
    return cache[source]


def _missing_message(
    missing: list[str],
    secrets_file: str | None,
    config: pytest.Config | None,
    config_path: Path | str | None,
) -> str:
    place = f"{config_path}: " if config_path else ""
    if secrets_file == STDIN:
        looked = f"{_OPTION} - (stdin) or the environment"
    elif secrets_file:
        shown = Path(secrets_file)
        if config is not None and not shown.is_absolute():
            shown = config.invocation_params.dir / shown
        looked = f"{_OPTION} {shown} or the environment"
    else:
        looked = f"the environment (no {_OPTION} given)"
    return (
        f"{place}[secrets] required {', '.join(missing)} but no value was found in {looked}; "
        f"export {'it' if len(missing) == 1 else 'them'} (non-empty) or pass "
        f"{_OPTION} FILE with NAME=value lines"
    )


def _read_stdin_bounded() -> str:
    """At most one character past the cap: stdin may be ``/dev/zero``."""
    return sys.stdin.read(MAX_SECRETS_FILE_BYTES + 1)


def _read_stdin_uncaptured(config: pytest.Config) -> str:
    """Read the real stdin: pytest's capture swaps it for an unreadable stream."""
    capman = config.pluginmanager.getplugin("capturemanager")
    multi = getattr(capman, "_global_capturing", None)
    if capman is None or multi is None or getattr(multi, "in_", None) is None:
        return _read_stdin_bounded()
    started = bool(multi.is_started())
    capman.suspend_global_capture(in_=True)
    try:
        return _read_stdin_bounded()
    finally:
        capman.resume_global_capture()  # resumes stdin capture too
        if not started:
            capman.suspend_global_capture()
