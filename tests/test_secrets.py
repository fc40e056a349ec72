"""Secrets (issue 6, point 4): resolution, and no value in any byte a session writes.

Resolution is tested directly (dotenv syntax, file before environment, stdin, every
missing name in one line). Redaction is tested end to end: a rollout prints, logs, warns,
raises and returns three planted values (a ``[secrets]`` value from the secrets file, a
6-character one from the environment, and the ambient ``OPENAI_API_KEY`` of the loopback
model) in sessions run with the default capture, ``-s``, ``tee-sys`` and ``-n 2``, with
``-rA``, ``--junitxml`` (captured output included), ``--log-file`` and ``--osmosis-report``.
Then every byte the session wrote is searched: its stdout and stderr, the JUnit file, the
log file, the pytest cache and every file under ``.osmosis/``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import CALC_ROLLOUT, calc_rows, only_run_dir, read_index, write_workspace

from pytest_osmosis.core.errors import OsmosisError
from pytest_osmosis.plugin.redaction import RedactingStream, redact_longrepr
from pytest_osmosis.plugin.secrets import (
    MAX_SECRETS_FILE_BYTES,
    MissingSecretsError,
    SecretsFileError,
    parse_dotenv,
    read_dotenv,
    resolve_secrets,
)
from pytest_osmosis.results import REDACTED, Redactor, validate_trajectory
from pytest_osmosis.results.redact import redact_json, redact_trajectory

pytest_plugins = ["pytester"]

LONG = "sk-PLANTED-0123456789abcdef"  # [secrets] CALC_SECRET, from the secrets file
SHORT = "Qz9Xw7ab"  # [secrets] SHORT_SECRET (8: the shortest redacted from output), from env
AMBIENT = "sk-AMBIENT-loopback-model-42"  # OPENAI_API_KEY of the loopback model server
QUOTED = "sk-Q'uo\"te\\back-0123"  # [secrets] QUOTE_SECRET: repr() and JSON escape it
PREFIX = LONG[:7]  # what a headline cut in the middle of LONG would keep
PLANTED = (LONG, SHORT, AMBIENT, QUOTED, PREFIX)
NAMES = ["CALC_SECRET", "SHORT_SECRET", "QUOTE_SECRET"]

# --------------------------------------------------------------------------- #
# Resolution
# --------------------------------------------------------------------------- #


def test_dotenv_syntax() -> None:
    text = "\n".join(
        [
            "# a comment",
            "",
            "PLAIN=value",
            "  SPACED  =  padded  ",
            "export EXPORTED=yes",
            'DOUBLE="quoted # not a comment"',
            "SINGLE='single'",
            'ONE_SIDED="open',
            "EQUALS=a=b=c",
            "EMPTY=",
            "NESTED=\"'inner'\"",
            "PLAIN=last wins",
        ]
    )
    assert parse_dotenv(text, label="x.env") == {
        "PLAIN": "last wins",
        "SPACED": "padded",
        "EXPORTED": "yes",
        "DOUBLE": "quoted # not a comment",
        "SINGLE": "single",
        "ONE_SIDED": '"open',
        "EQUALS": "a=b=c",
        "EMPTY": "",
        "NESTED": "'inner'",
    }


@pytest.mark.parametrize(
    "line",
    ["JUST_A_NAME", "1ABC=x", "NOT-AN-ID=x", "=hidden", "two words=x", "exportFOO BAR=x"],
)
def test_a_bad_dotenv_line_is_named_by_number_never_by_content(line: str) -> None:
    with pytest.raises(SecretsFileError) as caught:
        parse_dotenv(f"OK=fine\n{line}\n", label="/tmp/x.env")
    message = str(caught.value)
    assert "/tmp/x.env: line 2 " in message and "\n" not in message
    assert line not in message and "fine" not in message


def test_secrets_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SecretsFileError, match=r"missing\.env: cannot read it"):
        read_dotenv("missing.env", base_dir=tmp_path)
    (tmp_path / "latin1.env").write_bytes(b"A=caf\xe9\n")
    with pytest.raises(SecretsFileError, match="is not UTF-8"):
        read_dotenv(str(tmp_path / "latin1.env"))
    (tmp_path / "ok.env").write_text("A=1\n")
    assert read_dotenv("ok.env", base_dir=tmp_path) == {"A": "1"}
    assert read_dotenv("-", read_stdin=lambda: "B=2\n") == {"B": "2"}
    assert issubclass(SecretsFileError, OsmosisError)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-big", "stdin-zero"])
def test_a_secrets_file_that_is_no_regular_file_or_too_big_is_refused_unread(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO or /dev/zero was read without bound (INTERNALERROR MemoryError)."""
    if kind == "stdin-zero":
        with open("/dev/zero") as zero, pytest.raises(SecretsFileError) as caught:
            read_dotenv("-", read_stdin=lambda: zero.read(MAX_SECRETS_FILE_BYTES + 1))
        assert str(caught.value) == "--osmosis-secrets-file - (stdin): is larger than 1 MiB " + (
            "(a dotenv file of NAME=value lines is expected)"
        )
        return
    path = {"dev-zero": Path("/dev/zero"), "directory": tmp_path}.get(kind, tmp_path / "s.env")
    if kind == "fifo":
        os.mkfifo(path)  # no writer: reading it would block
    elif kind == "too-big":
        path.write_bytes(b"A=" + b"x" * MAX_SECRETS_FILE_BYTES + b"\n")
    with pytest.raises(SecretsFileError) as caught:
        read_dotenv(str(path))
    message = str(caught.value)
    assert message.startswith(f"--osmosis-secrets-file {path}: ") and "\n" not in message
    expected = {
        "fifo": "is not a regular file (a FIFO)",
        "dev-zero": "is not a regular file (a device)",
        "directory": "is not a regular file (a directory)",
        "too-big": "is larger than 1 MiB",
    }[kind]
    assert expected in message


def test_the_secrets_file_cap_is_in_the_option_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    assert "regular file of at most 1 MiB" in " ".join(result.stdout.str().split())


def test_resolution_order_export_and_missing_names(tmp_path: Path) -> None:
    secrets_file = tmp_path / "s.env"
    secrets_file.write_text("FROM_FILE=file-value\nBOTH=file-wins\nEMPTY_ENV=from-file\n")
    env = {"BOTH": "env-loses", "FROM_ENV": "env-value", "EMPTY_ENV": ""}
    names = ["FROM_FILE", "BOTH", "FROM_ENV", "EMPTY_ENV"]
    resolved = resolve_secrets(names, str(secrets_file), environ=env)
    assert resolved == {
        "FROM_FILE": "file-value",
        "BOTH": "file-wins",
        "FROM_ENV": "env-value",
        "EMPTY_ENV": "from-file",
    }
    # Exported for LiteLLM and rollouts: only where the environment has no value.
    assert env == {
        "BOTH": "env-loses",
        "FROM_ENV": "env-value",
        "EMPTY_ENV": "from-file",
        "FROM_FILE": "file-value",
    }
    with pytest.raises(MissingSecretsError) as caught:
        resolve_secrets(
            ["FROM_FILE", "GONE_A", "EMPTY", "GONE_B"],
            str(secrets_file),
            environ={"EMPTY": ""},
            config_path="configs/eval/x.toml",
        )
    message = str(caught.value)
    assert message.startswith("configs/eval/x.toml: [secrets] required GONE_A, EMPTY, GONE_B ")
    assert f"--osmosis-secrets-file {secrets_file} or the environment" in message
    assert "file-value" not in message and "\n" not in message
    with pytest.raises(MissingSecretsError, match=r"environment \(no --osmosis-secrets-file"):
        resolve_secrets(["GONE"], None, environ={})
    with pytest.raises(MissingSecretsError, match=r"--osmosis-secrets-file - \(stdin\)"):
        resolve_secrets(["GONE"], "-", environ={}, read_stdin=lambda: "OTHER=1\n")
    untouched: dict[str, str] = {}
    resolve_secrets(["FROM_FILE"], str(secrets_file), environ=untouched, export=False)
    assert untouched == {}


def test_stdin_is_read_once_per_session_past_the_capture(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import json
        from pytest_osmosis.plugin.secrets import resolve_secrets

        def pytest_sessionstart(session):
            config = session.config
            first = resolve_secrets(["A"], "-", config=config, environ={})
            second = resolve_secrets(["B"], "-", config=config, environ={})
            print("RESOLVED", json.dumps([first, second]))
        """
    )
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.run(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", stdin=b"A=1\nB=2\n"
    )
    result.stdout.fnmatch_lines(['RESOLVED [{"A": "1"}, {"B": "2"}]'])
    result = pytester.run(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", stdin=b"A=1\nB=2\n"
    )
    assert result.ret == 0, result.stderr.str()  # default capture: stdin read all the same
    result.stdout.fnmatch_lines(['RESOLVED [{"A": "1"}, {"B": "2"}]'])


# --------------------------------------------------------------------------- #
# Redaction primitives
# --------------------------------------------------------------------------- #


def test_stream_catches_a_value_written_in_pieces() -> None:
    target = io.StringIO()
    stream = RedactingStream(target, Redactor([LONG, SHORT], min_length=1))
    for piece in ("key=", LONG[:3], LONG[3:10], "", LONG[10:], " short=", SHORT[:2]):
        stream.write(piece)
        stream.flush()
    assert LONG[:3] not in target.getvalue()  # held back: it could be the start of a value
    stream.write(SHORT[2:] + "\n")
    stream.drain()
    assert target.getvalue() == f"key={REDACTED} short={REDACTED}\n"
    stream.write("ends with sk-")
    stream.drain()
    assert target.getvalue().endswith("ends with sk-")


def test_escaped_forms_of_a_value_are_redacted() -> None:
    """A value holding a quote or a backslash is written escaped by repr() and JSON."""
    redactor = Redactor([QUOTED, LONG + "\u00e9"])
    unicode_value = LONG + "\u00e9"
    texts = [
        repr({"k": QUOTED}),
        str(KeyError(QUOTED)),
        repr(KeyError(QUOTED)),
        repr(["x\"'", QUOTED]),  # both quotes in the list: ' escaped too
        repr({"k": repr(QUOTED)}),  # a repr inside a repr
        json.dumps({"k": QUOTED}),
        json.dumps({"k": repr({"k": QUOTED})}),  # a JSON file holding a repr
        json.dumps(unicode_value),  # \u00e9
        repr(unicode_value.encode()),  # not a str form: bytes are not covered
    ]
    for text in texts[:-1]:
        assert REDACTED in redactor.redact(text), text
        assert "uo" not in redactor.redact(text).replace(REDACTED, ""), text
    import html

    assert REDACTED in redactor.redact(html.escape(f"<p>{QUOTED}</p>"))


def test_provider_messages_are_scrubbed_by_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bridge (model/provider_errors.py), judge and the runner's headline all call results/redact.py::scrub
    (escaped forms too)."""
    from pytest_osmosis.execution import runner
    from pytest_osmosis.model import provider_errors as bridge
    from pytest_osmosis.rubric import judge

    monkeypatch.setenv("SOME_PROVIDER_TOKEN", QUOTED)
    monkeypatch.setenv("A_CREDENTIAL", LONG)
    text = f"failed with {QUOTED!r} and {LONG}"
    assert bridge._one_line(RuntimeError(text)) == f"failed with '{REDACTED}' and {REDACTED}"
    assert judge.one_line(text) == f"failed with '{REDACTED}' and {REDACTED}"
    assert bridge._one_line(RuntimeError("key abcd1 x"), ("abcd1",)) == f"key {REDACTED} x"
    # Redacted before the cut: no prefix of the value survives in a long headline.
    headline = runner._one_line(RuntimeError("x" * 290 + LONG))
    assert headline == "x" * 290 + REDACTED
    assert PREFIX not in judge.one_line("y" * 290 + LONG)


def test_redaction_is_idempotent_and_keeps_markers_whole() -> None:
    redactor = Redactor(["E", LONG], min_length=1)
    once = redactor.redact(f"x {LONG} E")
    assert once == f"x {REDACTED} {REDACTED}"
    assert redactor.redact(once) == once


def test_a_traceback_is_redacted_in_place_keeping_its_structure(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        f"""
        def helper(token):
            raise ValueError("bad " + token)

        def test_it():
            helper({LONG!r})
        """
    )
    reports = pytester.inline_run("-p", "no:cacheprovider", "-l").getreports(
        "pytest_runtest_logreport"
    )
    failed = next(r for r in reports if r.failed)
    assert LONG in str(failed.longrepr)
    redactor = Redactor([LONG], min_length=1)
    kept = redact_longrepr(failed.longrepr, redactor)
    assert kept is failed.longrepr  # the same object: colours and structure survive
    text = str(kept)
    assert LONG not in text and "ValueError: bad [REDACTED]" in text
    assert redact_longrepr("plain " + LONG, redactor) == f"plain {REDACTED}"
    assert redact_longrepr(("f.py", 1, f"Skipped: {LONG}"), redactor) == (
        "f.py",
        1,
        f"Skipped: {REDACTED}",
    )


def test_trajectories_keep_their_identity_under_a_one_character_secret() -> None:
    from pytest_osmosis.results import build_trajectory

    rollout_id = "a1b2c3d4" * 4
    doc = build_trajectory(
        rollout_id=rollout_id,
        messages=[
            {"role": "system", "content": "s"},
            {"role": "user", "content": f"key {LONG}"},
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "function": {"name": "f", "arguments": json.dumps({LONG: "a"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": f"result {LONG}"},
        ],
        label=LONG,
        reward=1.0,
        sample_metrics={"m": 1},
        sample_extra_fields=None,
        request_metadata={"note": LONG},
        request_extra_fields={"row_index": 0, "run_index": 0},
        sdk_version="0.3.8",
    )
    redactor = Redactor([LONG, "a", "1", "s", "e"], min_length=1)
    redacted = redact_trajectory(doc, redactor)
    validate_trajectory(redacted)  # what the upload planner checks still holds
    assert redacted["session_id"] == redacted["extra"]["osmosis"]["rollout_id"] == rollout_id
    assert [s["source"] for s in redacted["steps"]] == ["system", "user", "agent"]
    assert LONG not in json.dumps(redacted)
    assert redacted["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 0, "run_index": 0}
    assert redact_json({"k": [LONG, 1, None]}, Redactor([LONG])) == {"k": [REDACTED, 1, None]}


def test_wrappers_of_other_plugins_cannot_reintroduce_a_value(pytester: pytest.Pytester) -> None:
    """Our makereport wrapper is tryfirst, so it finishes after every other wrapper."""
    pytester.makeconftest(
        f"""
        import pytest
        from pytest_osmosis.plugin.redaction import add_secret_values

        def pytest_configure(config):
            add_secret_values(config, [{LONG!r}])

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            report = yield
            report.sections.append(("late section", "late " + {LONG!r}))
            report.user_properties.append(("late", {LONG!r}))
            return report
        """
    )
    pytester.makepyfile("def test_ok():\n    pass\n")
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA", f"--junitxml={junit}")
    result.assert_outcomes(passed=1)
    assert LONG not in result.stdout.str() and LONG not in junit.read_text()
    assert "late [REDACTED]" in result.stdout.str()


# --------------------------------------------------------------------------- #
# Whole sessions: search every byte written
# --------------------------------------------------------------------------- #

LEAKY_ROLLOUT = """
import atexit
import json
import logging
import os
import sys
import warnings

import httpx

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context

log = logging.getLogger("leaky.rollout")
print("imported with", os.environ["CALC_SECRET"])
atexit.register(lambda: print("atexit", os.environ["CALC_SECRET"], os.environ["QUOTE_SECRET"]))


def planted():
    return os.environ["CALC_SECRET"], os.environ["SHORT_SECRET"], os.environ["OPENAI_API_KEY"]


def quoted():
    return os.environ["QUOTE_SECRET"]


class LeakyWorkflow(AgentWorkflow):
    async def run(self, ctx):
        long, short, ambient = planted()
        do = ctx.metadata["do"]
        print("stdout", long, short, ambient)
        print("stderr", long, short, ambient, file=sys.stderr)
        sys.stdout.write(long[:5])  # a value written in two pieces
        sys.stdout.write(long[5:] + "\\n")
        log.warning("logged %s %s %s", long, short, ambient)
        print("dunder", long, quoted(), file=sys.__stdout__)
        sys.__stderr__.write(f"dunder-err {long} {quoted()}\\n")
        print("repr", repr({"k": quoted()}), {"k": long})
        try:
            raise KeyError(long)
        except KeyError:
            log.exception("with a traceback")
        try:
            {}[quoted()]
        except KeyError as exc:
            log.warning("missing %r %s", exc, exc)
        warnings.warn(f"warned {long} {short} {ambient}")
        (ctx.artifacts_dir / f"note-{long}.txt").write_text(f"artifact {long} {quoted()}")
        if do == "raise":
            raise RuntimeError(f"workflow leaked {long} {short} {ambient} {quoted()!r}")
        if do == "cut":
            raise RuntimeError("x" * 290 + long)
        leak = {"role": "user", "content": f"my keys are {long} {short} {ambient} {quoted()}"}
        call_id = f"call_{long}"
        tool = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "done"},
        ]
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "m", "messages": [*ctx.prompt, leak]},
            )
            answer = response.json()["choices"][0]["message"]["content"]
        messages = [*ctx.prompt, leak, *tool, {"role": "assistant", "content": answer}]
        return AgentWorkflowOutput(messages=messages, metrics={"note": len(answer)})


class LeakyGrader(Grader):
    async def grade(self, ctx):
        long, short, ambient = planted()
        do = ctx.metadata["do"]
        print("grader", long, short, ambient)
        if do == "grader_raise":
            raise ValueError(f"grader leaked {long} {short} {ambient}")
        # The report's explanation column: the grader's own, and RubricGrader's artifact.
        ctx.sample.extra_fields["explanation"] = f"explained {long} {short} {quoted()}"
        (ctx.artifacts_dir / "rubric_judgement.json").write_text(
            json.dumps({"explanation": f"judged {long} {quoted()}"})
        )
        ctx.set_reward(0.0 if do == "low" else 1.0)
"""

SECRETS_CONFTEST = """
import os

from pytest_osmosis.plugin.redaction import add_secret_values
from pytest_osmosis.plugin.secrets import resolve_secrets

# Until --osmosis-secrets-file is wired into the plugin: resolve and register here, in
# every process (resolve_secrets exports file-only values, as the plugin will).
def pytest_configure(config):
    names = ["CALC_SECRET", "SHORT_SECRET", "QUOTE_SECRET"]
    values = resolve_secrets(names, os.environ["LEAKY_SECRETS_FILE"], config=config)
    add_secret_values(config, values.values())
"""

MODES: dict[str, tuple[str, ...]] = {
    "capture": ("-rA", "--osmosis-report", "--log-file=pytest.log", "--log-file-level=DEBUG"),
    "no-capture": ("-s", "-rA", "--log-cli-level=WARNING"),
    "tee-sys": ("--capture=tee-sys", "-rA"),
    "xdist": ("-n", "2", "-rA", "--osmosis-report"),
}
#: Each one-process mode again with the bridge in a process of its own (the LiteLLM route,
#: model/bridge_process.py): its log records cross from there and are redacted here.
PLACED = [*MODES, *(f"{m}@bridge-process" for m in ("capture", "no-capture", "tee-sys"))]


@dataclass
class Session:
    root: Path
    stdout: bytes
    stderr: bytes
    returncode: int

    def files(self, *, run_dir: bool) -> dict[str, bytes]:
        """Every file the session wrote (not the inputs), inside or outside ``.osmosis``."""
        found: dict[str, bytes] = {}
        for path in sorted(self.root.rglob("*")):
            relative = path.relative_to(self.root).as_posix()
            if path.is_symlink() or not path.is_file() or relative in INPUTS:
                continue
            if "/artifacts/" in relative:
                continue  # the rollout's own bytes, copied as they are (not covered)
            if relative.startswith(".osmosis/") == run_dir:
                found[relative] = path.read_bytes()
        return found


INPUTS = {
    "secrets.env",
    "conftest.py",
    "configs/eval/leaky.toml",
    "data/leaky.jsonl",
    "rollouts/leaky/main.py",
}


def leaks(blobs: dict[str, bytes]) -> dict[str, list[str]]:
    found = {
        name: [value for value in PLANTED if value.encode() in blob] for name, blob in blobs.items()
    }
    return {name: values for name, values in found.items() if values}


@pytest.fixture(scope="module")
def leaky_server(model_loop: Any) -> Iterator[ModelServer]:
    server = ModelServer().start(loop=model_loop.loop)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def session_in(
    leaky_server: ModelServer, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Session]:
    """Run each mode's session once (lazily, so xdist workers run only what they test)."""
    done: dict[str, Session] = {}

    def run(mode: str) -> Session:
        if mode not in done:
            done[mode] = _run_leaky_session(leaky_server, tmp_path_factory.mktemp(mode), mode)
        return done[mode]

    return run


def _run_leaky_session(server: ModelServer, root: Path, mode: str) -> Session:
    rows = [
        {**row, "metadata": {"do": do}}
        for row, do in zip(
            calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(5)]),
            ["ok", "raise", "grader_raise", "low", "cut"],
            strict=True,
        )
    ]
    # The report shows each row's input and label from the dataset, even for a row that
    # failed before producing a sample (this one raises in the workflow).
    rows[1]["user_prompt"] += f" (key {LONG})"
    rows[1]["ground_truth"] += f" {QUOTED}"
    write_workspace(
        root,
        name="leaky",
        rollout="leaky",
        dataset="leaky",
        rows=rows,
        rollout_source=LEAKY_ROLLOUT,
        secrets=NAMES,
    )
    (root / "secrets.env").write_text(f"# planted\nexport CALC_SECRET='{LONG}'\n")
    (root / "conftest.py").write_text(SECRETS_CONFTEST)
    env = {key: value for key, value in os.environ.items() if key not in ("CALC_SECRET",)}
    env.update(server.env())
    mode, _, placed = mode.partition("@")
    if placed:  # rows through LiteLLM (an organization header), served by the helper
        env.update(OSMOSIS_BRIDGE_PROCESS="1", OPENAI_ORGANIZATION="org-osmosis-test")
    env.update(
        OPENAI_API_KEY=AMBIENT,
        SHORT_SECRET=SHORT,
        QUOTE_SECRET=QUOTED,
        LEAKY_SECRETS_FILE=str(root / "secrets.env"),
        PYTHONWARNINGS="default",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--osmosis-eval",
            "--osmosis-name",
            "leaky",
            f"--junitxml={root / 'junit.xml'}",
            "-o",
            "junit_logging=all",
            *MODES[mode],
        ],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return Session(root, done.stdout, done.stderr, done.returncode)


@pytest.mark.parametrize("mode", PLACED)
def test_no_value_reaches_the_terminal_junit_logs_or_cache(
    session_in: Callable[[str], Session], mode: str
) -> None:
    session = session_in(mode)
    mode = mode.partition("@")[0]
    out = session.stdout.decode(errors="replace")
    assert session.returncode == 1, out + session.stderr.decode(errors="replace")
    assert "INTERNALERROR" not in out
    blobs = {"<stdout>": session.stdout, "<stderr>": session.stderr}
    blobs.update(session.files(run_dir=False))
    assert "junit.xml" in blobs
    assert not leaks(blobs), leaks(blobs)
    # The planted values were there to leak, and were replaced where they would have been.
    assert out.count(REDACTED) >= 6, out
    junit = blobs["junit.xml"].decode()
    captured = ("workflow leaked", "grader leaked", "logged", "with a traceback")
    if mode != "no-capture":  # with -s, prints go to the terminal, not into reports
        captured += ("stdout", "stderr", "grader")
    for where in captured:
        assert f"{where} {REDACTED}" in junit or f"{where}\n" in junit, where
    if mode == "capture":
        assert f"logged {REDACTED} {REDACTED} {REDACTED}" in blobs["pytest.log"].decode()
    if mode == "no-capture":
        assert f"stdout {REDACTED} {REDACTED} {REDACTED}" in out
        assert f"imported with {REDACTED}" in out
    if mode in ("no-capture", "tee-sys"):  # written to sys.__stdout__/__stderr__ directly
        assert f"dunder {REDACTED} {REDACTED}" in out
        assert f"dunder-err {REDACTED} {REDACTED}" in session.stderr.decode()
    if mode != "xdist":  # printed by an atexit handler, after pytest has finished
        assert f"atexit {REDACTED} {REDACTED}" in out
    # A headline cut at 300 characters is cut after redaction, not inside the value.
    assert f"{'x' * 290}{REDACTED}" in out


@pytest.mark.parametrize("mode", PLACED)
def test_run_directory_files_hold_names_never_values(
    session_in: Callable[[str], Session], mode: str
) -> None:
    """logs.txt, index, metrics, journal and manifest: redacted or value-free today."""
    session = session_in(mode)
    mode = mode.partition("@")[0]
    run_dir = only_run_dir(session.root)
    blobs = {
        name: blob
        for name, blob in session.files(run_dir=True).items()
        if "/rollout_trials/" not in name
        and "/trajectories/" not in name
        and not name.endswith("report.html")
    }
    assert not leaks(blobs), leaks(blobs)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["inputs"]["secret_names"] == sorted(NAMES)
    logs = (run_dir / "logs.txt").read_text()
    assert f"workflow leaked {REDACTED} {REDACTED} {REDACTED}" in logs
    statuses = [r["status"] for r in read_index(run_dir)]
    assert statuses == ["success", "failed", "failed", "success", "failed"]


def report_rows(report: Path) -> list[dict[str, Any]]:
    """The per-attempt records a report embeds (its ``report-data`` JSON), with inputs."""
    text = report.read_text()
    start = text.index('<script type="application/json" id="report-data">')
    body = text[text.index(">", start) + 1 : text.index("</script>", start)]
    data = json.loads(body)
    rows: list[dict[str, Any]] = data["rows"]
    return [{**r, "in": [data["inputs"][i] for i in r["ii"]]} if "ii" in r else r for r in rows]


@pytest.mark.parametrize("mode", ["capture", "xdist", "capture@bridge-process"])
def test_trajectories_projections_and_report_are_redacted(
    session_in: Callable[[str], Session], mode: str
) -> None:
    session = session_in(mode)
    mode = mode.partition("@")[0]
    blobs = session.files(run_dir=True)
    trajectories = {name: blob for name, blob in blobs.items() if name.endswith(".json")}
    assert any(REDACTED.encode() in blob for blob in trajectories.values())
    assert any(name.endswith("report.html") for name in blobs)
    assert not leaks(blobs), leaks(blobs)
    # A tool-call id holding a value: one placeholder for the call and its result, so
    # the trajectory still passes the upload planner's checks.
    run_dir = only_run_dir(session.root)
    checked = 0
    for path in [*run_dir.glob("rollout_trials/*/*.json"), *run_dir.glob("trajectories/*.json")]:
        doc = json.loads(path.read_text())
        if "steps" not in doc:
            continue
        validate_trajectory(doc)
        calls = [c["tool_call_id"] for st in doc["steps"] for c in st.get("tool_calls") or ()]
        results = [
            r["source_call_id"]
            for st in doc["steps"]
            for r in (st.get("observation") or {}).get("results") or ()
        ]
        if calls:
            assert calls == results == ["call_redacted_1"], (calls, results)
            checked += 1
    assert checked >= 2  # the row that succeeded: its trial and its projection
    # `pytest-osmosis report` later, in a shell where the [secrets] are set.
    env = {**os.environ, "CALC_SECRET": LONG, "SHORT_SECRET": SHORT, "QUOTE_SECRET": QUOTED}
    later = session.root / "later.html"
    subprocess.run(
        [sys.executable, "-m", "pytest_osmosis", "report", str(run_dir), "-o", str(later)],
        env=env,
        check=True,
        capture_output=True,
    )
    html = later.read_bytes()
    assert b"artifact " + REDACTED.encode() in html
    assert not leaks({"later.html": html}), leaks({"later.html": html})
    # The input, label and explanation columns went through the redaction (in the
    # session's report and in the later one): the values were there, and are replaced.
    for report in (run_dir / "report.html", later):
        rows = report_rows(report)
        raised = next(r for r in rows if r["r"] == 1)
        assert raised["in_src"] == "dataset" and "rid" in raised and "traj" not in raised
        assert raised["in"][-1] == ["user", f"What is 1 + 1? (key {REDACTED})"]
        assert raised["lab"] == f"2 {REDACTED}"
        explained = [r["expl"] for r in rows if "expl" in r]
        assert explained and all(REDACTED in text for text in explained), explained
    # Markdown to stdout (a PR comment), plain and as JSON, is redacted as a file is.
    for extra in ((), ("--json",)):
        printed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest_osmosis",
                "report",
                str(run_dir),
                "--format",
                "markdown",
                *extra,
            ],
            env=env,
            check=True,
            capture_output=True,
        ).stdout
        assert printed and not leaks({"markdown": printed}), leaks({"markdown": printed})


# --------------------------------------------------------------------------- #
# The plugin's own option (after the wiring)
# --------------------------------------------------------------------------- #


@pytest.fixture
def unset_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests below get their secrets from a file or not at all, never from the
    environment of whoever runs the suite."""
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("unset_secrets")
def test_missing_secrets_stop_the_session_naming_all_of_them(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, secrets=["CALC_SECRET", "SHORT_SECRET"])
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*CALC_SECRET, SHORT_SECRET*"])
    assert model_env.requests_total == 0  # not even the preflight
    assert not list((pytester.path / ".osmosis" / "evals").glob("*/events.jsonl"))


@pytest.mark.usefixtures("unset_secrets")
@pytest.mark.parametrize("source", ["file", "stdin"])
def test_the_secrets_file_option_resolves_and_redacts(
    pytester: pytest.Pytester, model_env: ModelServer, source: str
) -> None:
    rows = [{**row, "metadata": {"do": "raise"}} for row in calc_rows([("What is 1 + 1?", "2")])]
    write_workspace(
        pytester.path,
        name="leaky",
        rollout="leaky",
        dataset="leaky",
        rows=rows,
        rollout_source=LEAKY_ROLLOUT,
        secrets=NAMES,
    )
    dotenv = f"CALC_SECRET={LONG}\nSHORT_SECRET='{SHORT}'\nQUOTE_SECRET={QUOTED}\n"
    (pytester.path / "s.env").write_text(dotenv)
    option = "s.env" if source == "file" else "-"
    result = pytester.run(
        sys.executable,
        "-m",
        "pytest",
        "--osmosis-eval",
        "-p",
        "no:cacheprovider",
        "-rA",
        "--osmosis-secrets-file",
        option,
        stdin=dotenv.encode() if source == "stdin" else subprocess.DEVNULL,
    )
    result.assert_outcomes(errors=1)
    text = result.stdout.str() + result.stderr.str()
    assert not leaks({"output": text.encode()}), leaks({"output": text.encode()})
    assert f"workflow leaked {REDACTED} {REDACTED}" in text


@pytest.mark.usefixtures("unset_secrets")
def test_missing_with_a_secrets_file_names_where_it_looked(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, secrets=["CALC_SECRET", "SHORT_SECRET"])
    (pytester.path / "s.env").write_text("CALC_SECRET=x\n")
    result = pytester.runpytest(
        "--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-secrets-file", "s.env"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*calc.toml*SHORT_SECRET*--osmosis-secrets-file*s.env*"])


TIMID_ROLLOUT = 'print("imported in a sandboxed process")\n' + CALC_ROLLOUT


@pytest.mark.usefixtures("unset_secrets")
def test_a_short_secret_is_left_in_the_output_and_named_once(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OPENAI_API_KEY=x``-style placeholders: redacting "x" shredded every word holding
    one ("sandbo[REDACTED]ed"). As the SDK, output hides values of 8+ characters; a shorter
    [secrets] value gets one warning naming the variable (once for two configs), and
    logs.txt keeps the SDK's rule for it (every non-empty [secrets] value)."""
    monkeypatch.setenv("TINY_TOKEN", "x")
    rows = calc_rows([("What is 2 + 2?", "4"), ("What is 1 + 1?", "2", "grader_raise")])
    for name in ("calc", "again"):
        write_workspace(
            pytester.path,
            name=name,
            rows=rows,
            rollout_source=TIMID_ROLLOUT,
            secrets=["TINY_TOKEN"],
        )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "-s", "-rA")
    result.assert_outcomes(passed=2, errors=2)
    out = result.stdout.str()
    assert "imported in a sandboxed process" in out
    assert "grader exploded on purpose" in out
    assert REDACTED not in out, out
    assert [line for line in result.outlines if "TINY_TOKEN" in line] == [
        "WARNING: secret TINY_TOKEN is shorter than 8 characters: "
        "it is not redacted from the output (logs.txt still hides it)"
    ]
    for run_dir in (pytester.path / ".osmosis" / "evals").iterdir():
        if not run_dir.name.startswith("."):
            logs = (run_dir / "logs.txt").read_text()
            assert f"e{REDACTED}ploded" in logs and "exploded" not in logs
