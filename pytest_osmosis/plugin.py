"""pytest entry point: options, ini keys, markers and the hooks that drive an eval session.

Imports nothing heavy: with the plugin installed but ``--osmosis-eval`` not given and no
eval TOML named, pytest behaves exactly as before and LiteLLM is never imported.
"""

from __future__ import annotations

import gc
import os
import shlex
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.gate import RULES, GateOptionError, GateOptions, gate_options

if TYPE_CHECKING:
    from pytest_osmosis.progress import Progress
    from pytest_osmosis.session import EvalSession


@dataclass(frozen=True)
class _Option:
    dest: str  # settings field the value overrides, or a session option name
    flag: str
    help: str
    metavar: str | None = None
    is_flag: bool = False
    override: bool = True  # an [evaluation]/[experiment] override, resolved with the TOML

    @property
    def ini(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS = (
    _Option(
        "eval",
        "--osmosis-eval",
        "collect every configs/eval/*.toml under the given paths",
        is_flag=True,
        override=False,
    ),
    _Option(
        "model_path",
        "--osmosis-model",
        "LiteLLM model id to evaluate (overrides "
        "experiment.model_path); osmosis/embedded runs the offline SmolLM2",
        "MODEL",
    ),
    _Option("limit", "--osmosis-limit", "evaluate the first N rows (<= 0: all rows)", "N"),
    _Option("n", "--osmosis-n", "attempts per row", "N"),
    _Option(
        "rows",
        "--osmosis-rows",
        "dataset rows to evaluate, e.g. 3,7,10-20 (overrides the limit)",
        "SPEC",
    ),
    _Option(
        "pass_threshold", "--osmosis-pass-threshold", "reward an attempt needs to pass", "REWARD"
    ),
    _Option(
        "dataset_file",
        "--osmosis-dataset-file",
        "local dataset file (.jsonl, .csv, .parquet) instead of data/<dataset>.*",
        "PATH",
    ),
    _Option(
        "sample",
        "--osmosis-sample",
        "preview the platform's random sampling: evaluate "
        "this fraction of the selected rows (at least one)",
        "FRACTION",
    ),
    _Option("seed", "--osmosis-seed", "seed for --osmosis-sample", "SEED"),
    _Option(
        "concurrency",
        "--osmosis-concurrency",
        "work items in flight at once (overrides evaluation.batch_size)",
        "N",
        override=False,
    ),
    _Option(
        "output",
        "--osmosis-output",
        "root of run directories (default <workspace>/.osmosis/evals)",
        "DIR",
        override=False,
    ),
    _Option(
        "name",
        "--osmosis-name",
        "stable run name: running it again resumes",
        "NAME",
        override=False,
    ),
    _Option(
        "fresh",
        "--osmosis-fresh",
        "archive an existing run of this name and start anew",
        is_flag=True,
        override=False,
    ),
    _Option(
        "retry_failed",
        "--osmosis-retry-failed",
        "re-run failed and skipped items of a named run, keeping successes",
        is_flag=True,
        override=False,
    ),
    _Option(
        "secrets_file",
        "--osmosis-secrets-file",
        "dotenv file of [secrets] values (NAME=value; - reads stdin), read before the environment",
        "FILE",
        override=False,
    ),
    _Option(
        "report",
        "--osmosis-report",
        "write report.html (plots, every attempt's "
        "trajectory) into each run directory at the end of the session",
        is_flag=True,
        override=False,
    ),
    # The gate's options are its rules' (gate.RULES): a new rule is declared there.
    *(_Option(rule.dest, rule.flag, rule.help, rule.metavar, override=False) for rule in RULES),
)


# `pytest --osmosis-rubric DATA.jsonl ...`: rubric checks as test items. Their hooks live in
# rubric_items.py, registered only when the option is given.
RUBRIC_OPTIONS = (
    _Option(
        "rubric",
        "--osmosis-rubric",
        "JSONL file of conversations to score with an LLM judge: "
        "each record x run becomes a test item",
        "DATA.jsonl",
        override=False,
    ),
    _Option(
        "rubric_text",
        "--osmosis-rubric-text",
        "the rubric: text, or @FILE to read it from a file",
        "TEXT|@FILE",
        override=False,
    ),
    _Option(
        "judge_model",
        "--osmosis-judge-model",
        "judge model for --osmosis-rubric: any LiteLLM id, or "
        "osmosis/embedded for the offline SmolLM2",
        "MODEL",
        override=False,
    ),
    _Option(
        "min_score", "--osmosis-min-score", "score a rubric item needs to pass", "X", override=False
    ),
    _Option(
        "rubric_n", "--osmosis-rubric-n", "judge runs per record (default 1)", "N", override=False
    ),
    _Option(
        "rubric_score_min",
        "--osmosis-rubric-score-min",
        "lowest rubric score (default 0)",
        "A",
        override=False,
    ),
    _Option(
        "rubric_score_max",
        "--osmosis-rubric-score-max",
        "highest rubric score (default 1)",
        "B",
        override=False,
    ),
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    import pytest_osmosis.hookspecs as hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("osmosis", "pytest-osmosis: Osmosis evaluations as tests")
    for opt in (*OPTIONS, *RUBRIC_OPTIONS):
        if opt.is_flag:
            group.addoption(
                opt.flag,
                action="store_true",
                default=None,
                dest=f"osmosis_{opt.dest}",
                help=opt.help,
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
                help=opt.help,
            )
            # None when absent, so that a key written blank is refused, not taken for absent.
            parser.addini(opt.ini, f"{opt.help} (ini twin of {opt.flag})", default=None)
    parser.addini(
        "osmosis_backstop_grace",
        "seconds beyond both budgets before pytest-timeout stops a row blocking the loop",
        default="30",
    )
    parser.addini(
        "osmosis_judge_models",
        "judge models (one per line) a rollout's grader may reach through the bridge, "
        "besides a RubricGrader's judge_model",
        type="linelist",
        default=[],
    )
    parser.addini(
        "osmosis_main_timeout",
        "seconds an entrypoint's main() may take to build its LocalBackend",
        default="30",
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


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """Keep ``--osmosis-rubric-text @FILE`` ours: pytest would read @FILE as an argument file.

    Also notice when pytest's first parse, made before any plugin's options are known,
    took the separate value of one of ours for a test path (pytest#8846): that value then
    chose the rootdir and the ini file, so ``--osmosis-output /abs/dir`` lost the
    workspace's ini (and ``osmosis_eval = true`` with it). pytest_cmdline_main runs
    the session again as if every such option had been written ``--opt=value``.
    """
    keep_at_file(args)
    rerun = joined_option_values(
        list(early_config.invocation_params.args), early_config.invocation_params.dir
    )
    env = os.environ.get("PYTEST_ADDOPTS", "")
    env_rerun = joined_option_values(shlex.split(env), early_config.invocation_params.dir)
    if rerun is not None or env_rerun is not None:
        early_config.stash[_RERUN_KEY] = (
            rerun if rerun is not None else list(early_config.invocation_params.args),
            shlex.join(env_rerun) if env_rerun is not None else env,
        )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | pytest.ExitCode | None:
    """The session again, in process, with the arguments pytest misread joined to their flags."""
    rerun = config.stash.get(_RERUN_KEY, None)
    if rerun is None:
        return None
    args, env = rerun
    saved = os.environ.get("PYTEST_ADDOPTS")
    os.environ["PYTEST_ADDOPTS"] = env
    try:
        return pytest.main(args, plugins=list(config.invocation_params.plugins or ()))
    finally:
        if saved is None:
            os.environ.pop("PYTEST_ADDOPTS", None)
        else:
            os.environ["PYTEST_ADDOPTS"] = saved


_RERUN_KEY = pytest.StashKey[tuple[list[str], str]]()
_VALUE_FLAGS = frozenset(opt.flag for opt in (*OPTIONS, *RUBRIC_OPTIONS) if not opt.is_flag)


def joined_option_values(args: list[str], base: Path) -> list[str] | None:
    """``args`` with ``--osmosis-x VALUE`` written ``--osmosis-x=VALUE``, when that matters.

    It matters when VALUE names an existing file or directory: pytest's first parse
    (before plugins load) counts it among the test paths that decide the rootdir and the
    ini file. None when no value of ours was misread (the session needs no second start).
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
    return joined if misread else None


def _names_a_path(base: Path, value: str) -> bool:
    try:
        return (base / value.split("::", 1)[0]).exists()
    except (OSError, ValueError):
        return False


def _main_timeout(config: pytest.Config) -> float:
    raw = str(config.getini("osmosis_main_timeout")).strip()
    try:
        value = float(raw)
        if not value > 0 or value == float("inf"):
            raise ValueError
    except ValueError:
        raise pytest.UsageError(
            f"osmosis_main_timeout: must be a positive number of seconds, got {raw!r}"
        ) from None
    return value


def keep_at_file(args: list[str]) -> None:
    """Join ``--osmosis-rubric-text`` and its ``@FILE`` value (in place) before pytest parses."""
    flag = "--osmosis-rubric-text"
    position = 0
    while position < len(args) - 1:
        if args[position] == flag and args[position + 1].startswith("@"):
            args[position : position + 2] = [f"{flag}={args[position + 1]}"]
        position += 1


def _value(config: pytest.Config, opt: _Option) -> tuple[Any, str] | None:
    """Command line beats ini; only an option never given is None (blank is a value)."""
    cli = config.getoption(f"osmosis_{opt.dest}")
    if cli is not None:
        return cli, opt.flag
    ini = config.getini(opt.ini)
    if opt.is_flag:
        return (True, f"ini {opt.ini}") if ini else None
    if isinstance(ini, str):
        return ini.strip(), f"ini {opt.ini}"
    return None


def _check_values(values: dict[str, tuple[Any, str] | None]) -> None:
    """A blank value is a mistake (``--osmosis-rows "$ROWS"`` with ROWS unset), never the default.

    Settings fields are checked by their own rules (config.py); the session options here.
    """
    from pytest_osmosis.config import check_overrides
    from pytest_osmosis.errors import ConfigError

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


def is_eval_config(path: Path) -> bool:
    """``<workspace>/configs/eval/<name>.toml``: the layout every Osmosis workspace has.

    Lives here, not in plan.py, so that deciding whether to enable imports nothing heavy.
    """
    return (
        path.suffix == ".toml"
        and path.parent.name == "eval"
        and path.parent.parent.name == "configs"
    )


def _enabled(config: pytest.Config) -> bool:
    if _value(config, OPTIONS[0]):
        return True
    return any(is_eval_config(p) for p in _named_paths(config))


def _named_paths(config: pytest.Config) -> list[Path]:
    base = config.invocation_params.dir
    return [(base / arg.split("::", 1)[0]).resolve() for arg in config.args]


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "osmosis(config, rollout, model, dataset): set on every Osmosis eval item"
    )
    if _value(config, RUBRIC_OPTIONS[0]):
        config.pluginmanager.import_plugin("pytest_osmosis.rubric_items")
    if not _enabled(config):
        return
    # Third-party noise an eval run should not make: LiteLLM's pydantic warnings, and
    # openai-agents exporting traces of every rollout to OpenAI when a key is present.
    config.addinivalue_line("filterwarnings", "ignore:.*ReadOnly. qualifier:UserWarning")
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from pytest_osmosis.session import EvalSession, SessionOptions

    values = {opt.dest: _value(config, opt) for opt in OPTIONS}
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
        retry_failed=bool(plain("retry_failed")),
        concurrency=concurrency_value,
        workflow_override=config.getini("osmosis_workflow") or None,
        grader_override=config.getini("osmosis_grader") or None,
        main_timeout=_main_timeout(config),
        gate=gate,
        report=bool(plain("report")),
        secrets_file=plain("secrets_file"),
    )
    session = EvalSession(
        config,
        options,
        is_worker=hasattr(config, "workerinput"),
        collect_all=bool(values["eval"]),
    )
    from pytest_osmosis.collect import SESSION_KEY

    config.stash[SESSION_KEY] = session
    from pytest_osmosis.secrets import install_redaction

    install_redaction(config)
    config.pluginmanager.register(EvalHooks(session), "osmosis-eval-hooks")
    if config.pluginmanager.hasplugin("xdist") and not session.is_worker:
        config.pluginmanager.register(XdistControllerHooks(session), "osmosis-xdist")


def _gate_options(plain: Any) -> GateOptions:
    try:
        return gate_options(plain)
    except GateOptionError as exc:
        raise pytest.UsageError(str(exc)) from None


def _is_override(dest: str) -> bool:
    return next(opt.override for opt in OPTIONS if opt.dest == dest)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not is_eval_config(file_path):
        return None
    from pytest_osmosis.collect import SESSION_KEY, EvalConfigFile

    session = parent.config.stash.get(SESSION_KEY, None)
    if session is None:
        return None
    if not session.collect_all and file_path.resolve() not in _named_paths(parent.config):
        return None
    return EvalConfigFile.from_parent(parent, path=file_path)


class EvalHooks:
    """Hooks active only in an eval session (every process)."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        self.progress: Progress | None = None
        self._last_result: dict[str, Any] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """Controller or single process: progress, after pytest has shown the row's letter."""
        if self._last_result is not None:
            result, self._last_result = self._last_result, None
            self._progress().add(result)

    def _progress(self) -> Progress:
        """Progress on the results table's basis: what earlier sessions recorded counts."""
        if self.progress is None:
            from pytest_osmosis.outcome import OUTCOMES, classify
            from pytest_osmosis.progress import Progress

            reporter = self.session.config.pluginmanager.get_plugin("terminalreporter")
            total = tokens = 0
            recorded = dict.fromkeys(OUTCOMES, 0)
            for run in self.session.runs.values():
                threshold = run.plan.settings.pass_threshold
                total += run.pending_at_start if run.to_run is None else run.to_run
                for key in run.rundir.resumed_keys - run.rerun:
                    record = run.rundir.records[key]
                    recorded[classify(record, threshold)] += 1
                    tokens += int(record.get("tokens") or 0)
            total += sum(recorded.values())
            self.progress = Progress(reporter, total, recorded=recorded, recorded_tokens=tokens)
        return self.progress

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, object, object]:
        """Collect with the cyclic GC paused, then freeze what was collected.

        100k items are millions of long-lived objects that are never garbage; the cyclic
        collector would walk them again and again while they are made, after every
        allocation burst while they run, and in pytest's final collections (it halves
        collection time and takes seconds off a long session).
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return (yield)
        finally:
            if was_enabled:
                gc.enable()
            gc.freeze()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """A finished run runs nothing again, as ``osmosis eval run`` finishes at once.

        When every selected item of a config is recorded, its items are deselected rather
        than replayed one by one; the results table and the exit status still come from
        the recorded results (pytest_sessionfinish). A run with anything pending keeps
        replaying its recorded items, so its report shows every row.
        """
        from pytest_osmosis.collect import EvalItem

        by_config: dict[Path, list[EvalItem]] = {}
        for item in items:
            if isinstance(item, EvalItem):
                by_config.setdefault(item.path, []).append(item)
        for run in self.session.runs.values():
            run.to_run = 0  # a config none of whose items were selected runs nothing
        finished: set[Path] = set()
        for path, group in by_config.items():
            plan = group[0].parent.plan
            if self.session.journal(plan):
                pending = [item for item in group if self.session.carried_forward(item) is None]
            else:
                pending = group  # nothing recorded yet: every selected item runs
            if not pending:
                finished.add(path)
            controller_run = self.session.runs.get(plan.config_path)
            if controller_run is not None:  # single process: progress counts what runs
                records = controller_run.rundir.records
                controller_run.to_run = len(pending)
                controller_run.rerun = {item.key for item in pending if item.key in records}
        if not finished:
            return
        kept: list[pytest.Item] = []
        recorded: list[pytest.Item] = []
        for item in items:
            done = isinstance(item, EvalItem) and item.path in finished
            (recorded if done else kept).append(item)
        config.hook.pytest_deselected(items=recorded)
        items[:] = kept
        workerinput = getattr(config, "workerinput", {})
        if config.option.xmlpath or workerinput.get("osmosis_junit"):
            self._keep_recorded_for_junit(config, recorded)

    def _keep_recorded_for_junit(self, config: pytest.Config, recorded: list[pytest.Item]) -> None:
        """Remember a finished run's deselected items: --junitxml still lists them.

        Only with --junitxml (under xdist the controller writes it: workers send the list).
        """
        from pytest_osmosis.collect import EvalItem

        entries = [
            (item.nodeid, str(item.parent.plan.config_path), *item.key)
            for item in recorded
            if isinstance(item, EvalItem)
        ]
        if self.session.is_worker:
            config.workeroutput["osmosis_recorded"] = entries  # type: ignore[attr-defined]
        else:
            keep_recorded(self.session, entries)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Controller or single process: check our dependencies, open run directories and
        check the models, all before any row starts (a failure is one line, exit 4)."""
        if self.session.is_worker:
            workerinput: dict[str, Any] = session.config.workerinput  # type: ignore[attr-defined]
            self.session.set_worker_input(workerinput)
            return
        from pytest_osmosis.errors import OsmosisError
        from pytest_osmosis.preflight import check_dependencies

        problem = check_dependencies(getattr(session.config, "cache", None))
        if problem is not None:
            raise pytest.UsageError(problem)
        if session.config.option.collectonly:
            return
        from pytest_osmosis.discover import find_eval_configs

        named = _named_paths(session.config)
        if self.session.collect_all:
            configs = find_eval_configs(session.config, named)
        else:
            configs = [p for p in named if is_eval_config(p) and p.is_file()]
        try:
            self.session.open_runs(configs)
        except OsmosisError as exc:
            raise pytest.UsageError(str(exc)) from None
        models = [
            run.plan.settings.model_path
            for run in self.session.runs.values()
            if run.rundir.pending(run_keys(run.plan))
        ]
        if not models:
            return
        # xdist's controller runs no rows (no LiteLLM here): its workers start once the
        # model is known good, and each imports LiteLLM before its first row.
        controller = session.config.pluginmanager.has_plugin("dsession")
        try:
            self.session.preflight(models, in_process=not controller)
        except OsmosisError as exc:
            # pytest_sessionfinish does not run after a usage error: nothing is recorded.
            self.session.abandon_runs()
            self.session.close()
            raise pytest.UsageError(str(exc)) from None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Runner process: put the item's result on its report (builtins only: it crosses xdist)."""
        report = yield
        from pytest_osmosis.collect import RESULT_KEY, EvalItem, junit_properties

        if isinstance(item, EvalItem) and call.when == "call" and RESULT_KEY in item.stash:
            result = item.stash[RESULT_KEY]
            report.osmosis = {  # type: ignore[attr-defined]
                **{k: v for k, v in result.items() if k != "exception"},
                "config": str(item.parent.plan.config_path),
            }
            # The item's list: junitxml reads it from the teardown report.
            item.user_properties.extend(junit_properties(result))
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Controller or single process: journal the result before anything reports it."""
        if self.session.is_worker:
            return
        result = getattr(report, "osmosis", None)
        if result is None and report.failed and str(report.when) == "???":
            # xdist lost the worker running this item (os._exit, a segfault, OOM kill).
            result = self.session.crashed_result(report.nodeid, str(report.longrepr))
            if result is not None:
                report.osmosis = result  # type: ignore[attr-defined]
        if result is None:
            return
        run = self.session.runs.get(Path(result["config"]))
        if run is None or result.get("resumed"):
            return
        run.rundir.append(result)
        run.executed += 1
        run.rate_limited += int(result.get("rate_limited") or 0)
        self._last_result = result
        details = {k: result[k] for k in ("rollout_id", "row_index", "run_index", "status")}
        if result.get("reward") is not None:
            details["reward"] = result["reward"]
        if result.get("error_type"):
            details["error_type"] = result["error_type"]
        run.log.write("info", "result", "work item finished", **details)
        if result.get("trajectory_problem"):
            where = f"row {result.get('source_row_index')} run {result['run_index']}"
            problem = f"{where}: {result['trajectory_problem']}"
            run.log.warning("result", problem, rollout_id=result["rollout_id"])
        self.session.config.hook.pytest_osmosis_row_result(
            config=self.session.config, result=result
        )
        if result.get("detail"):
            run.log.write(
                "error",
                "result",
                result.get("message", ""),
                rollout_id=result["rollout_id"],
                detail=result["detail"],
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Controller or single process: write the final snapshot, then apply the gate."""
        try:
            if not self.session.is_worker:
                interrupted = session.shouldstop or session.shouldfail
                for run in self.session.runs.values():
                    run.metrics = finalize_run(run, cancelled=bool(interrupted))
                self._recorded_to_junit(session.config)
                self._finished_runs_status(session)
                if self.session.options.report:
                    self._write_reports()
                self._gate(session)
        finally:
            self.session.close()

    def _recorded_to_junit(self, config: pytest.Config) -> None:
        """--junitxml lists a finished run's rows with their recorded outcome and duration.

        They were deselected, so nothing ran: their reports go to the JUnit writer alone
        (before it writes, in its own pytest_sessionfinish), not through pytest's hooks,
        so the terminal still says they were deselected and nothing else counts them.
        """
        try:
            from _pytest.junitxml import xml_key
        except ImportError:  # pragma: no cover - pytest moved it; JUnit lists what ran
            return
        xml = config.stash.get(xml_key, None)
        if xml is None:
            return
        from pytest_osmosis.collect import recorded_reports
        from pytest_osmosis.session import resumed_result

        for run in self.session.runs.values():
            for nodeid, key in run.recorded_items:
                record = run.rundir.records.get(key)
                if record is None:
                    continue
                result = resumed_result(record, run.plan)
                source = run.plan.dataset.source_row_index(key[0])
                for report in recorded_reports(nodeid, result, source, key[1]):
                    xml.pytest_runtest_logreport(report)

    def _finished_runs_status(self, session: pytest.Session) -> None:
        """Runs finished before this session ran nothing: their recorded rows decide."""
        finished = [run for run in self.session.runs.values() if run.pending_at_start == 0]
        if not finished or session.exitstatus not in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            return
        from pytest_osmosis.outcome import all_passed

        if not all(all_passed(run.metrics.get("summary", {})) for run in finished):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif len(finished) == len(self.session.runs):
            session.exitstatus = pytest.ExitCode.OK  # "no tests ran": nothing was left to run

    def _write_reports(self) -> None:
        from pytest_osmosis.errors import OsmosisError
        from pytest_osmosis.report import write_report_for_run

        for run in self.session.runs.values():
            try:
                run.report_path = write_report_for_run(run.plan.run_dir)
            except OsmosisError as exc:
                run.report_error = str(exc)

    def _gate(self, session: pytest.Session) -> None:
        from pytest_osmosis.gate import Verdict, decide

        gate = self.session.options.gate
        if not gate.active or not self.session.runs:
            return
        if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return  # interrupted, usage or internal errors keep their own exit status
        runs = [(run.plan.run_name, run.metrics) for run in self.session.runs.values()]
        verdict = decide(gate, runs)
        override = session.config.hook.pytest_osmosis_gate(
            config=session.config, metrics=[m for _, m in runs], verdict=verdict.as_dict()
        )
        if override is not None:
            verdict = Verdict(bool(override), [*verdict.reasons, "decided by pytest_osmosis_gate"])
        self.session.verdict = verdict
        session.exitstatus = pytest.ExitCode.OK if verdict.passed else pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(
        self, terminalreporter: Any, exitstatus: int, config: pytest.Config
    ) -> None:
        if self.session.is_worker:
            return
        from pytest_osmosis.summary import write_summary

        write_summary(terminalreporter, self.session)


def keep_recorded(session: EvalSession, entries: list[tuple[str, str, int, int]]) -> None:
    """Controller: note (node id, config, row_index, run_index) of deselected recorded items."""
    for nodeid, config_path, row_index, run_index in entries:
        run = session.runs.get(Path(config_path))
        if run is not None:
            run.recorded_items.append((nodeid, (row_index, run_index)))


def run_keys(plan: Any) -> list[tuple[int, int]]:
    return [(r, n) for r in range(len(plan.dataset)) for n in range(plan.settings.n)]


def finalize_run(run: Any, *, cancelled: bool) -> dict[str, Any]:
    """Write the run's snapshots; a finished run that ran nothing keeps its record as it was.

    Rewriting it would give it this session's start and duration (milliseconds for a
    run that took minutes) and mark every row resumed.
    """
    plan = run.plan
    if run.executed == 0:
        recorded = run.rundir.recorded_metrics() or {}
        finished = recorded.get("eval_run", {}).get("status") == "finished"
        if finished and recorded.get("summary", {}).get("total_samples") == len(run.rundir.records):
            run.log.write("info", "run", "run finished earlier; nothing ran, nothing rewritten")
            run.log.close()
            run.rundir.close()
            return dict(recorded)
    complete = all(key in run.rundir.records for key in run_keys(plan))
    status = "finished" if complete and not cancelled else "incomplete"
    run.log.write("info", "run", f"run {status}", executed=run.executed)
    result: dict[str, Any] = run.rundir.refresh(
        status=status,
        total_dataset_rows=plan.dataset.total_dataset_rows,
        sampled_rows=len(plan.dataset),
        n=plan.settings.n,
        pass_threshold=plan.settings.pass_threshold,
        dataset_name=plan.config.experiment.dataset,
        model_path=plan.settings.model_path,
        rollout_name=plan.config.experiment.rollout,
        started_at=run.started_at,
    )
    run.log.close()
    run.rundir.close()
    return result


class XdistControllerHooks:
    """xdist controller only: shard the rows across workers and tell them where to write."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session
        self.blame_dir: str | None = None  # where workers say which row runs (blame.py)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from pytest_osmosis.xdist import EvalScheduling, dist_was_chosen, per_worker

        if dist_was_chosen(config) or not self.session.runs or self._internals_problem():
            return None
        workers = int(getattr(config.option, "numprocesses", 1) or 1)
        share = per_worker(self.session.total_concurrency(), workers)
        attempts = max(run.plan.settings.n for run in self.session.runs.values())
        return EvalScheduling(
            config, log, shard_rows=max(1, share // attempts), culprit=self.culprit
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from pytest_osmosis.xdist import dist_was_chosen

        node.workerinput["osmosis_runs"] = {
            str(path): run.plan.run_name for path, run in self.session.runs.items()
        }
        prefetch = (
            bool(self.session.runs)
            and not dist_was_chosen(self.session.config)
            and not self._internals_problem()
        )
        node.workerinput["osmosis_prefetch"] = prefetch
        node.workerinput["osmosis_junit"] = bool(self.session.config.option.xmlpath)
        if prefetch:  # rows run ahead, so a worker's death needs the exact culprit
            if self.blame_dir is None:
                from pytest_osmosis.blame import make_directory

                self.blame_dir = make_directory()
            node.workerinput["osmosis_blame_dir"] = self.blame_dir

    def _internals_problem(self) -> str | None:
        """xdist's private API our scheduler needs, when it changed (warned once)."""
        from pytest_osmosis.xdist import internals_problem, warn_once

        problem = internals_problem(self.session.config)
        if problem is not None:
            warn_once(self.session.config, problem)
        return problem

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """What the workers will run (every worker collects the same): progress counts it."""
        runs = self.session.runs
        if not runs or any(run.to_run is not None for run in runs.values()):
            return
        for run in runs.values():
            run.to_run = 0
        for nodeid in ids:
            found = self.session.item_key(nodeid)
            if found is None:
                continue
            run = runs[found[0]]
            if run.rundir.pending([found[1]]):
                run.to_run = (run.to_run or 0) + 1
                if found[1] in run.rundir.records:
                    run.rerun.add(found[1])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker's list of a finished run's deselected items (for --junitxml)."""
        entries = getattr(node, "workeroutput", {}).get("osmosis_recorded")
        if entries and not any(run.recorded_items for run in self.session.runs.values()):
            keep_recorded(self.session, entries)

    def culprit(self, node: Any) -> str | None:
        """The node id whose code the dead worker ``node`` was running, if it said."""
        if self.blame_dir is None:
            return None
        from pytest_osmosis.blame import culprit

        return culprit(self.blame_dir, str(node.gateway.id))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.blame_dir is not None:
            import shutil

            shutil.rmtree(self.blame_dir, ignore_errors=True)
            self.blame_dir = None
