"""Every ``--osmosis-*`` option and ini key of the plugin, their checks, and ``SessionOptions``.

The table (``OPTIONS``, ``RUBRIC_OPTIONS``) is the one place an option is declared: its flag,
its ini twin, its --help group and text. ``session_options`` reads, checks (a bad value is
one line, exit 4) and builds what the session runs with; nothing else reads an option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.dataset.formats import suffixes as dataset_suffixes
from pytest_osmosis.gate import RULES, GateOptionError, GateOptions, gate_options
from pytest_osmosis.plugin.discover import is_eval_config, named_paths

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import SessionOptions

#: An option's value and where it was given (its flag, or ``ini <key>``); None: not given.
Given = tuple[Any, str] | None

#: --help groups, in the order --help shows them: key -> heading.
GROUPS = {
    "eval": "pytest-osmosis: Osmosis evaluations as tests",
    "selection": "pytest-osmosis: selection (rows, attempts, shards)",
    "output": "pytest-osmosis: output and resume",
    "gates": "pytest-osmosis: gates (the session fails when a run misses one)",
    "cache": "pytest-osmosis: model-call cache",
    "report": "pytest-osmosis: report, progress and CI",
    "rubric": "pytest-osmosis: rubric checks (--osmosis-rubric)",
}
_GROUP_OF = {
    **dict.fromkeys(("limit", "n", "rows", "dataset_file", "sample", "seed", "shard"), "selection"),
    **dict.fromkeys(
        ("output", "name", "fresh", "retry_failed", "retry_below_threshold", "reuse"), "output"
    ),
    **dict.fromkeys(("cache", "cache_max_age"), "cache"),
    **dict.fromkeys(("report", "progress", "github", "upload"), "report"),
}


@dataclass(frozen=True)
class Option:
    dest: str  # settings field the value overrides, or a session option name
    flag: str  # "" for an ini key without a flag (`INI_SECONDS`)
    help: str
    metavar: str | None = None
    is_flag: bool = False
    override: bool = True  # an [evaluation]/[experiment] override, resolved with the TOML
    default: str | None = None  # an ini key without a flag: its value when not given

    @property
    def ini(self) -> str:
        return self.flag.lstrip("-").replace("-", "_") if self.flag else f"osmosis_{self.dest}"

    @property
    def group(self) -> str:
        """The --help group it is shown in (``GROUPS``)."""
        if self in RUBRIC_OPTIONS:
            return "rubric"
        if any(rule.dest == self.dest for rule in RULES):
            return "gates"
        return _GROUP_OF.get(self.dest, "eval")


OPTIONS = (
    Option(
        "eval",
        "--osmosis-eval",
        "collect every configs/eval/*.toml under the given paths",
        is_flag=True,
        override=False,
    ),
    Option(
        "model_path",
        "--osmosis-model",
        "LiteLLM model id to evaluate (overrides "
        "experiment.model_path); osmosis/embedded runs the offline SmolLM2",
        "MODEL",
    ),
    Option("limit", "--osmosis-limit", "evaluate the first N rows (<= 0: all rows)", "N"),
    Option("n", "--osmosis-n", "attempts per row", "N"),
    Option(
        "rows",
        "--osmosis-rows",
        "dataset rows to evaluate, e.g. 3,7,10-20 (overrides the limit)",
        "SPEC",
    ),
    Option(
        "pass_threshold", "--osmosis-pass-threshold", "reward an attempt needs to pass", "REWARD"
    ),
    Option(
        "dataset_file",
        "--osmosis-dataset-file",
        f"local dataset file ({dataset_suffixes(', ')}) instead of data/<dataset>.*",
        "PATH",
    ),
    Option(
        "sample",
        "--osmosis-sample",
        "preview the platform's random sampling: evaluate "
        "this fraction of the selected rows (at least one)",
        "FRACTION",
    ),
    Option("seed", "--osmosis-seed", "seed for --osmosis-sample", "SEED"),
    Option(
        "concurrency",
        "--osmosis-concurrency",
        "work items in flight at once (overrides evaluation.batch_size)",
        "N",
        override=False,
    ),
    Option(
        "output",
        "--osmosis-output",
        "root of run directories (default <workspace>/.osmosis/evals)",
        "DIR",
        override=False,
    ),
    Option(
        "name",
        "--osmosis-name",
        "stable run name: running it again resumes; with several configs each config's "
        "run is NAME-<config stem>",
        "NAME",
        override=False,
    ),
    Option(
        "fresh",
        "--osmosis-fresh",
        "archive an existing run of this name and start anew",
        is_flag=True,
        override=False,
    ),
    Option(
        "retry_failed",
        "--osmosis-retry-failed",
        "re-run the errored and skipped attempts of a named run (as the SDK's "
        "--retry-failed), keeping passed and below-threshold ones",
        is_flag=True,
        override=False,
    ),
    Option(
        "retry_below_threshold",
        "--osmosis-retry-below-threshold",
        "re-run the attempts of a named run whose reward was below pass_threshold (what "
        "pytest calls failed), besides errored and skipped ones; implies --osmosis-retry-failed",
        is_flag=True,
        override=False,
    ),
    Option(
        "secrets_file",
        "--osmosis-secrets-file",
        "dotenv file of [secrets] values (NAME=value; - reads stdin), read before the "
        "environment; a regular file of at most 1 MiB",
        "FILE",
        override=False,
    ),
    Option(
        "report",
        "--osmosis-report",
        "write report.html (plots, every attempt's "
        "trajectory) into each run directory at the end of the session",
        is_flag=True,
        override=False,
    ),
    # Live progress (progress.py): the pinned status line, log lines, or nothing.
    Option(
        "progress",
        "--osmosis-progress",
        "live progress: auto (a status line on a terminal, a line per attempt in logs), "
        "line, log or off",
        "auto|line|log|off",
        override=False,
    ),
    # The model-call cache (model/cache.py).
    Option(
        "cache",
        "--osmosis-cache",
        "model-call cache beside the runs: off (default); use (serve recorded answers, "
        "call and record the rest); record (always call, record); replay (recorded answers "
        "only: a call without one fails its row, cache_miss, and no model is called)",
        "MODE",
        override=False,
    ),
    Option(
        "cache_max_age",
        "--osmosis-cache-max-age",
        "recorded answers older than this are not served, e.g. 12h, 7d, 2w (default: no limit)",
        "AGE",
        override=False,
    ),
    # Regrade and the plan before spending (regrade.py, preview.py)
    Option(
        "regrade",
        "--osmosis-regrade",
        "grade the samples a finished run recorded again with the current grader "
        "(no workflow runs), into a new run directory",
        "RUN",
        override=False,
    ),
    Option(
        "rollout_dir",
        "--osmosis-rollout-dir",
        "load the rollout (its workflow and grader) from DIR instead of rollouts/<rollout>",
        "DIR",
        override=False,
    ),
    Option(
        "plan",
        "--osmosis-plan",
        "print what each config would run (model, rows, n, concurrency, budgets, run name) "
        "and stop: no model call, no run directory",
        is_flag=True,
        override=False,
    ),
    Option(
        "confirm",
        "--osmosis-confirm",
        "print the plan and ask before the first model call: only y goes on (when stdin is "
        "not a terminal nothing is asked and the run goes on)",
        is_flag=True,
        override=False,
    ),
    # How rollouts run (execution/dispatch.py, issue 24).
    Option(
        "execution",
        "--osmosis-execution",
        "how rollouts run: in-process (imported, on our event loop), server (its own "
        "environment and server over the rollout protocol, as `osmosis eval run` does) or "
        "auto (default: in process where that is faithful, else server)",
        "in-process|server|auto",
        override=False,
    ),
    Option(
        "server_python",
        "--osmosis-server-python",
        "server mode: run rollout servers on this Python (with osmosis-ai installed) "
        "instead of syncing each rollout's environment with uv",
        "PYTHON",
        override=False,
    ),
    # Beyond one machine (shard.py): a CI matrix job runs its share; merge joins them.
    Option(
        "shard",
        "--osmosis-shard",
        "run shard K of N (e.g. 2/4): a stable share of the work items, picked by each "
        "row's content and attempt, into a run directory of its own (pytest-osmosis merge "
        "joins the shards)",
        "K/N",
        override=False,
    ),
    Option(
        "reuse",
        "--osmosis-reuse",
        "record from finished run RUN (a name under the output root, or a path) every work "
        "item whose rollout, model, settings, budgets, row content and attempt are unchanged, "
        "without running it; the rest runs",
        "RUN",
        override=False,
    ),
    Option(
        "remote_root",
        "--osmosis-remote-root",
        "where this workspace's root directory is on the hosts of xdist workers started "
        "over ssh (--tx ssh=...; default: the same path); checked file by file before any row",
        "DIR",
        override=False,
    ),
    Option(
        "upload",
        "--osmosis-upload",
        "after the gate, hand each finished run to the SDK's `osmosis eval upload`: on-pass "
        "(only when the session passes) or always",
        "on-pass|always",
        override=False,
    ),
    # CI surfaces (issue 17): the GitHub Actions step summary and annotations (github.py).
    Option(
        "github",
        "--osmosis-github",
        "auto (default): when GITHUB_ACTIONS=true, append a Markdown summary to "
        "$GITHUB_STEP_SUMMARY and annotate the dataset lines of attempts that did not pass; "
        "off: neither",
        "auto|off",
        override=False,
    ),
    # The gate's options are its rules' (gate.RULES): a new rule is declared there.
    *(Option(rule.dest, rule.flag, rule.help, rule.metavar, override=False) for rule in RULES),
)


# `pytest --osmosis-rubric DATA.jsonl ...`: rubric checks as test items. Their hooks live in
# rubric_items.py, registered only when the option is given.
RUBRIC_OPTIONS = (
    Option(
        "rubric",
        "--osmosis-rubric",
        "JSONL file of conversations to score with an LLM judge: "
        "each record x run becomes a test item",
        "DATA.jsonl",
        override=False,
    ),
    Option(
        "rubric_text",
        "--osmosis-rubric-text",
        "the rubric: text, or @FILE to read it from a file",
        "TEXT|@FILE",
        override=False,
    ),
    Option(
        "judge_model",
        "--osmosis-judge-model",
        "judge model for --osmosis-rubric: any LiteLLM id, or "
        "osmosis/embedded for the offline SmolLM2",
        "MODEL",
        override=False,
    ),
    Option(
        "min_score", "--osmosis-min-score", "score a rubric item needs to pass", "X", override=False
    ),
    Option(
        "rubric_n", "--osmosis-rubric-n", "judge runs per record (default 1)", "N", override=False
    ),
    Option(
        "rubric_score_min",
        "--osmosis-rubric-score-min",
        "lowest rubric score (default 0)",
        "A",
        override=False,
    ),
    Option(
        "rubric_score_max",
        "--osmosis-rubric-score-max",
        "highest rubric score (default 1)",
        "B",
        override=False,
    ),
)


#: Ini keys without a flag: seconds a project sets once (`_ini_seconds` reads them).
INI_SECONDS = (
    Option(
        "backstop_grace",
        "",
        "seconds beyond both budgets before pytest-timeout stops a row blocking the loop",
        override=False,
        default="30",
    ),
    Option(
        "main_timeout",
        "",
        "seconds an entrypoint's main() may take to build its LocalBackend",
        override=False,
        default="30",
    ),
    Option(
        "server_start_timeout",
        "",
        "seconds a rollout server may take to answer /health (the SDK waits 90)",
        override=False,
        default="90",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    """Every option in its --help group, and its ini twin; the ini keys without a flag."""
    groups = {key: parser.getgroup(f"osmosis-{key}", text) for key, text in GROUPS.items()}
    for opt in (*OPTIONS, *RUBRIC_OPTIONS):
        group = groups[opt.group]
        # argparse %-formats an option's help; pytest prints an ini key's help as written.
        argparse_help = opt.help.replace("%", "%%")
        if opt.is_flag:
            group.addoption(
                opt.flag,
                action="store_true",
                default=None,
                dest=f"osmosis_{opt.dest}",
                help=argparse_help,
            )
            parser.addini(
                opt.ini, f"{opt.help} (ini twin of {opt.flag})", type="bool", default=False
            )
        else:
            group.addoption(
                opt.flag,
                default=None,
                metavar=opt.metavar,
                dest=f"osmosis_{opt.dest}",
                help=argparse_help,
            )
            # None when absent, so that a key written blank is refused, not taken for absent.
            parser.addini(opt.ini, f"{opt.help} (ini twin of {opt.flag})", default=None)
    for opt in INI_SECONDS:
        parser.addini(opt.ini, opt.help, default=None)  # None: not given (`_ini_seconds`)
    parser.addini(
        "osmosis_judge_models",
        "judge models (one per line) a rollout's grader may reach through the bridge, "
        "besides a RubricGrader's judge_model",
        type="linelist",
        default=[],
    )
    parser.addini(
        "osmosis_workflow",
        "workflow class as 'module:Class' when the entrypoint has none or several",
        default="",
    )
    parser.addini(
        "osmosis_grader",
        "grader class as 'module:Class' when the entrypoint has none or several",
        default="",
    )


_VALUE_FLAGS = frozenset(opt.flag for opt in (*OPTIONS, *RUBRIC_OPTIONS) if not opt.is_flag)


def value_flags() -> frozenset[str]:
    """Our options that take a value as the next argument."""
    return _VALUE_FLAGS


def joined_option_values(
    args: list[str], base: Path, *, even_if_read_right: bool = False
) -> list[str] | None:
    """``args`` with ``--osmosis-x VALUE`` written ``--osmosis-x=VALUE``, when that matters.

    It matters when VALUE names an existing file or directory: pytest's first parse
    (before plugins load) counts it among the test paths that decide the rootdir and the
    ini file. None when no value of ours was misread (the session needs no second start),
    unless ``even_if_read_right`` asks for any joined spelling (xdist's workers parse the
    arguments later, when a directory the session made exists).
    """
    joined: list[str] = []
    misread = False
    position = 0
    while position < len(args):
        arg = args[position]
        if arg == "--":
            joined += args[position:]
            break
        value = args[position + 1] if position + 1 < len(args) else None
        if arg in _VALUE_FLAGS and value is not None and not value.startswith("-"):
            joined.append(f"{arg}={value}")
            misread = misread or _names_a_path(base, value)
            position += 2
            continue
        joined.append(arg)
        position += 1
    if misread or (even_if_read_right and joined != args):
        return joined
    return None


def _names_a_path(base: Path, value: str) -> bool:
    try:
        return (base / value.split("::", 1)[0]).exists()
    except (OSError, ValueError):
        return False


def _ini_seconds(
    config: pytest.Config, dest: str, *, zero_ok: bool = False, blank_is_absent: bool = False
) -> float:
    """`INI_SECONDS` entry *dest* as a finite number of seconds, > 0 (or >= 0), its default
    when not given: else one line, exit 4. *blank_is_absent* as in `option_value`."""
    opt = next(opt for opt in INI_SECONDS if opt.dest == dest)
    given = option_value(config, opt, blank_is_absent=blank_is_absent)
    raw = str(given[0] if given is not None else opt.default)
    try:
        value = float(raw)
        if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
            raise ValueError
    except ValueError:
        what = "a number of seconds >= 0" if zero_ok else "a positive number of seconds"
        raise pytest.UsageError(f"{opt.ini}: must be {what}, got {raw!r}") from None
    return value


def _execution_options(config: pytest.Config, plain: Any) -> dict[str, Any]:
    """``--osmosis-execution``, ``--osmosis-server-python`` and the server start-up timeout."""
    from pytest_osmosis.execution.dispatch import AUTO, MODES

    mode = plain("execution") or AUTO
    if mode not in MODES:
        raise pytest.UsageError(
            f"--osmosis-execution: must be one of {', '.join(MODES)}, got {mode!r}"
        )
    start_timeout = _ini_seconds(config, "server_start_timeout")
    python = plain("server_python")
    if python is not None:
        import shutil

        given = str(python)
        if os.sep in given:
            candidate = os.path.abspath(config.invocation_params.dir / given)
            found = candidate if os.access(candidate, os.X_OK) else None
        else:
            found = shutil.which(given)
        if found is None or not os.path.isfile(found):
            raise pytest.UsageError(f"--osmosis-server-python: no executable Python at {given!r}")
        python = found
    return {"execution": mode, "server_python": python, "server_start_timeout": start_timeout}


def keep_at_file(args: list[str]) -> None:
    """Join ``--osmosis-rubric-text`` and its ``@FILE`` value (in place) before pytest parses."""
    flag = "--osmosis-rubric-text"
    position = 0
    while position < len(args) - 1:
        if args[position] == flag and args[position + 1].startswith("@"):
            args[position : position + 2] = [f"{flag}={args[position + 1]}"]
        position += 1


PROGRESS_OPTION = next(opt for opt in OPTIONS if opt.dest == "progress")


def progress_mode(config: pytest.Config) -> str:
    """``--osmosis-progress`` (or its ini twin), checked: a bad value is one line, exit 4."""
    from pytest_osmosis.plugin.progress import parse_mode

    given = option_value(config, PROGRESS_OPTION)
    if given is None:
        return "auto"
    try:
        return parse_mode(*given)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def option_value(config: pytest.Config, opt: Option, *, blank_is_absent: bool = False) -> Given:
    """An option's value and where it was given (the flag or the ini key); None: not given.

    Command line beats ini; only an option never given is None (blank is a value, which
    `session_options` refuses). ``blank_is_absent`` keeps two older rules: the rubric
    options' (`rubric_value`) and ``osmosis_backstop_grace``'s (`_ini_seconds`): a blank flag
    or ini key counts as not given, so ``osmosis_min_score =`` left blank in a shared
    pytest.ini falls back to the default or to the other source.
    """
    cli = config.getoption(f"osmosis_{opt.dest}") if opt.flag else None
    if cli is not None and not (blank_is_absent and not str(cli).strip()):
        return (str(cli).strip() if blank_is_absent else cli), opt.flag
    ini = config.getini(opt.ini)
    if opt.is_flag:
        return (True, f"ini {opt.ini}") if ini else None
    if isinstance(ini, str) and not (blank_is_absent and not ini.strip()):
        return ini.strip(), f"ini {opt.ini}"
    return None


def rubric_option(dest: str) -> Option:
    """The ``RUBRIC_OPTIONS`` entry of ``dest`` (e.g. ``min_score``)."""
    return next(opt for opt in RUBRIC_OPTIONS if opt.dest == dest)


def rubric_value(config: pytest.Config, opt: Option) -> tuple[str, Path, str] | None:
    """A rubric option's (value, base directory of a relative path in it, where it was given).

    Its rules differ from the eval options' and are kept as they were: a blank value is
    absent (`option_value`'s ``blank_is_absent``), and a path written in the ini file is
    relative to that file, as pytest's own ini paths are (the data file and the rubric's
    @FILE sit with the tests, so every directory pytest is run from finds them); a path
    given as a flag is relative to where pytest was run.
    """
    given = option_value(config, opt, blank_is_absent=True)
    if given is None:
        return None
    value, source = given
    if source == opt.flag:
        return str(value), config.invocation_params.dir, source
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return str(value), base, source


def _check_values(values: dict[str, Given]) -> None:
    """A blank value is a mistake (``--osmosis-rows "$ROWS"`` with ROWS unset), never the default.

    Settings fields are checked by their own rules (config.py); the session options here.
    """
    from pytest_osmosis.core.errors import ConfigError
    from pytest_osmosis.workspace.config import check_overrides

    given = {k: v for k, v in values.items() if v is not None}
    try:
        check_overrides({k: v for k, v in given.items() if _is_override(k)})
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    for raw, source in given.values():
        if isinstance(raw, str) and not raw.strip():
            raise pytest.UsageError(
                f"{source}: must not be blank (leave it out for the default), got {raw!r}"
            )


def _path(config: pytest.Config, value: str | None) -> Path | None:
    return None if value is None else (config.invocation_params.dir / value).resolve()


def _gate_options(plain: Any) -> GateOptions:
    try:
        return gate_options(plain)
    except GateOptionError as exc:
        raise pytest.UsageError(str(exc)) from None


def _cache_options(plain: Any) -> dict[str, Any]:
    """``--osmosis-cache`` and its max age, checked (a bad value is one line, exit 4)."""
    from pytest_osmosis.core.errors import ConfigError
    from pytest_osmosis.model.cache import MODES, parse_max_age

    mode = str(plain("cache") or "off").strip().lower()
    if mode not in MODES:
        raise pytest.UsageError(
            f"--osmosis-cache: expected one of {', '.join(MODES)}, got {plain('cache')!r}"
        )
    age = plain("cache_max_age")
    try:
        max_age = parse_max_age(str(age)) if age is not None else None
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return {"cache_mode": mode, "cache_max_age_s": max_age}


def _shard(given: Given) -> Any:
    """``--osmosis-shard K/N`` (or its ini twin), checked: a bad value is one line, exit 4."""
    if given is None:
        return None
    from pytest_osmosis.core.errors import ConfigError
    from pytest_osmosis.dataset.shard import parse_shard

    try:
        return parse_shard(str(given[0]), given[1])
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


def _upload_mode(given: Given) -> str | None:
    """``--osmosis-upload on-pass|always`` (or its ini twin): a bad value is one line."""
    if given is None:
        return None
    from pytest_osmosis.results.upload import parse_mode

    try:
        return parse_mode(str(given[0]), given[1])
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _is_override(dest: str) -> bool:
    return next(opt.override for opt in OPTIONS if opt.dest == dest)


def enabled(config: pytest.Config) -> bool:
    """Whether this pytest session evaluates: ``--osmosis-eval`` (or its ini twin), a regrade,
    or an eval config named on the command line."""
    if option_value(config, OPTIONS[0]) or config.getoption("osmosis_regrade") is not None:
        return True
    return any(is_eval_config(p) for p in named_paths(config))


def session_options(config: pytest.Config) -> tuple[SessionOptions, dict[str, Given]]:
    """The session's options, checked, and every option's value as given (None: not given)."""
    from pytest_osmosis.plugin.session import SessionOptions

    values = {opt.dest: option_value(config, opt) for opt in OPTIONS}
    _check_values(values)
    overrides = {k: v for k, v in values.items() if v is not None and _is_override(k)}

    def plain(name: str) -> Any:
        entry = values[name]
        return entry[0] if entry is not None else None

    concurrency = plain("concurrency")
    try:
        concurrency_value = int(concurrency) if concurrency is not None else None
        if concurrency_value is not None and concurrency_value < 1:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(
            f"--osmosis-concurrency: must be a positive integer, got {concurrency!r}"
        ) from None
    output = plain("output")
    gate = _gate_options(plain)
    options = SessionOptions(
        overrides=overrides,
        output=(config.invocation_params.dir / output) if output else None,
        name=plain("name"),
        fresh=bool(plain("fresh")),
        retry_failed=bool(plain("retry_failed") or plain("retry_below_threshold")),
        retry_below_threshold=bool(plain("retry_below_threshold")),
        concurrency=concurrency_value,
        workflow_override=config.getini("osmosis_workflow") or None,
        grader_override=config.getini("osmosis_grader") or None,
        main_timeout=_ini_seconds(config, "main_timeout"),
        # Blank has meant the default (30) since the key was added: kept, unlike other keys.
        backstop_grace=_ini_seconds(config, "backstop_grace", zero_ok=True, blank_is_absent=True),
        judge_models=tuple(str(model) for model in config.getini("osmosis_judge_models")),
        **_execution_options(config, plain),
        gate=gate,
        report=bool(plain("report")),
        secrets_file=plain("secrets_file"),
        **_cache_options(plain),
        regrade=plain("regrade"),
        rollout_dir=_path(config, plain("rollout_dir")),
        plan=bool(plain("plan")),
        confirm=bool(plain("confirm")),
        shard=_shard(values["shard"]),
        reuse=plain("reuse"),
        upload=_upload_mode(values["upload"]),
        remote_root=plain("remote_root"),
    )
    return options, values
