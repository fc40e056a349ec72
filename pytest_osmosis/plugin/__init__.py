"""pytest entry point: the hooks that drive an eval session, and the roles that register them.

The options and their checks are ``options.py``'s; which paths are eval configs,
``discover.py``'s. This package is the pytest side; the subpackages beside it are libraries.

Imports nothing heavy: with the plugin installed but ``--osmosis-eval`` not given and no
eval TOML named, pytest behaves exactly as before and LiteLLM is never imported.
"""

from __future__ import annotations

import gc
import os
import shlex
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_osmosis.plugin.discover import (
    is_eval_config,
    named_paths,
    no_eval_configs_here,
    unused_eval_configs,
)
from pytest_osmosis.plugin.options import (
    RUBRIC_OPTIONS,
    add_options,
    enabled,
    joined_option_values,
    keep_at_file,
    option_value,
    session_options,
)

if TYPE_CHECKING:
    from pytest_osmosis.plugin.controller import Controller, RecordedEntry
    from pytest_osmosis.plugin.milestones import Milestones
    from pytest_osmosis.plugin.session import EvalSession


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    import pytest_osmosis.hookspecs as hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


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


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Nothing collected where eval configs are, the plugin off: say how to turn it on; the
    plugin on where there are none: say where they are (discover.py::no_eval_configs_here)."""
    if exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED:
        return
    if enabled(config):
        where = None if config.getoption("osmosis_regrade") else no_eval_configs_here(config)
        if where:
            terminalreporter.write_line(where)
        return
    found = unused_eval_configs(config)
    if found:
        terminalreporter.write_line(
            f"osmosis: {found} is an eval config, but pytest-osmosis is not enabled: run "
            "pytest --osmosis-eval, or add `osmosis_eval = true` under [pytest] in pytest.ini"
        )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "osmosis(config, rollout, model, dataset): set on every Osmosis eval item"
    )
    if option_value(config, RUBRIC_OPTIONS[0]):
        config.pluginmanager.import_plugin("pytest_osmosis.plugin.rubric_items")
    if not enabled(config):
        return
    # Third-party noise an eval run should not make: LiteLLM's pydantic warnings, and
    # openai-agents exporting traces of every rollout to OpenAI when a key is present.
    config.addinivalue_line("filterwarnings", "ignore:.*ReadOnly. qualifier:UserWarning")
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    is_worker = hasattr(config, "workerinput")
    milestones = None if is_worker else start_up_milestones(config)
    if milestones is None:
        _start_session(config, is_worker, None)
        return
    # The first line on screen: importing the session's modules (aiohttp, pydantic) is
    # the longest silence between pytest's start and the first milestone of the session.
    with milestones.phase("starting the eval session"):
        _start_session(config, is_worker, milestones)


def start_up_milestones(config: pytest.Config) -> Milestones:
    """The controller's start-up milestones, on pytest's terminal (milestones.py)."""
    from pytest_osmosis.plugin.milestones import Milestones

    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return Milestones(reporter, quiet=config.get_verbosity() < 0)


def _start_session(config: pytest.Config, is_worker: bool, milestones: Milestones | None) -> None:
    """The eval session of this process, its options checked, its roles registered."""
    from pytest_osmosis.plugin.session import EvalSession

    options, values = session_options(config)
    named_configs = any(is_eval_config(p) for p in named_paths(config))
    session = EvalSession(
        config,
        options,
        is_worker=is_worker,
        collect_all=bool(values["eval"]) or (bool(options.regrade) and not named_configs),
    )
    session.milestones = milestones
    from pytest_osmosis.plugin.collect import SESSION_KEY

    config.stash[SESSION_KEY] = session
    from pytest_osmosis.plugin.redaction import install_redaction

    install_redaction(config)
    from pytest_osmosis.plugin.terminate import forward_sigterm

    restore = forward_sigterm()  # SIGTERM (a cancelled CI job) stops the session as Ctrl-C does
    if restore is not None:
        config.add_cleanup(restore)
    register_roles(config, session)
    register_ci(config, session, values["github"])


def register_ci(
    config: pytest.Config, session: EvalSession, github: tuple[Any, str] | None
) -> None:
    """CI surfaces, each only where it applies, so nothing changes without its plugin.

    GitHub Actions on the controller when ``GITHUB_ACTIONS=true``; pytest-html's reward
    column and pytest-rerunfailures' exceptions when those plugins are installed.
    """
    from pytest_osmosis.plugin.github import GitHubHooks, active, github_mode

    mode = github_mode(*(github or (None, "--osmosis-github")))
    if not session.is_worker and active(mode):
        config.pluginmanager.register(GitHubHooks(session), "osmosis-github")
    if config.pluginmanager.hasplugin("html"):
        from pytest_osmosis.plugin.html_columns import HtmlHooks

        config.pluginmanager.register(HtmlHooks(), "osmosis-html")
    if config.pluginmanager.hasplugin("rerunfailures"):
        from pytest_osmosis.plugin.rerun import add_rerun_except

        add_rerun_except(config)


def register_roles(config: pytest.Config, session: EvalSession) -> None:
    """Each process registers the hooks of the roles it plays, so no hook asks which it is.

    A single process is controller and runner; under xdist the controller plays the
    controller role (and shards rows across workers), each worker the worker role.
    """
    from functools import partial

    keep: Callable[[list[RecordedEntry]], None]
    if session.is_worker:
        keep = partial(WorkerHooks.send_recorded, config)
        config.pluginmanager.register(WorkerHooks(session), "osmosis-worker")
    else:
        from pytest_osmosis.plugin.controller import Controller

        controller = Controller(session)
        keep = controller.keep_recorded
        if session.options.plan:  # the plan alone starts no xdist worker
            for name in ("dsession", "terminaldistreporter"):
                plugin = config.pluginmanager.get_plugin(name)
                if plugin is not None:
                    config.pluginmanager.unregister(plugin)
        config.pluginmanager.register(ControllerHooks(controller), "osmosis-controller")
        if config.pluginmanager.hasplugin("xdist"):
            xdist_hooks = XdistControllerHooks(session, controller)
            config.pluginmanager.register(xdist_hooks, "osmosis-xdist")
    config.pluginmanager.register(EvalHooks(session, keep), "osmosis-eval-hooks")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not is_eval_config(file_path):
        return None
    from pytest_osmosis.plugin.collect import SESSION_KEY, EvalConfigFile

    session = parent.config.stash.get(SESSION_KEY, None)
    if session is None:
        return None
    if session.regrade_config is not None:  # a regrade collects the run's config alone
        if file_path.resolve() != session.regrade_config:
            return None
    elif not session.collect_all and file_path.resolve() not in named_paths(parent.config):
        return None
    return EvalConfigFile.from_parent(parent, path=file_path)


class EvalHooks:
    """Hooks of every process in an eval session: collection and the item's report."""

    def __init__(
        self, session: EvalSession, keep_recorded: Callable[[list[RecordedEntry]], None]
    ) -> None:
        self.session = session
        self.keep_recorded = keep_recorded  # the role's: the controller, or a worker's output
        self._backstops: dict[str, Callable[[], None]] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        """pytest-timeout's public hook: an eval item's backstop is our own timer.

        The item's marker (collect.py) gives the seconds; what fires is our exception,
        which run_item tells from any other failure without reading pytest-timeout's text.
        """
        from pytest_osmosis.execution.executor import arm_backstop
        from pytest_osmosis.plugin.collect import EvalItem

        seconds = getattr(settings, "timeout", None)
        if not isinstance(item, EvalItem) or not seconds:
            return None
        cancel = arm_backstop(float(seconds))
        if cancel is None:
            return None
        self._backstops[item.nodeid] = cancel
        return True

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        cancel = self._backstops.pop(item.nodeid, None)
        if cancel is None:
            return None
        cancel()
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        """Once a budget is spent, the first row not already in flight stops the session.

        It is not run and not reported: it stays pending, as every row after it does.
        """
        from pytest_osmosis.plugin.collect import EvalItem

        if not isinstance(item, EvalItem):
            return None
        line = self.session.wait_to_start(item)
        if line is None:
            return None
        item.session.shouldstop = line
        return True

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """pytest is done with this item. A row it never waited for (a conftest skipped its
        item, in a way its marks did not say: ``session._marked_to_skip``) leaves the
        run-ahead window and is cancelled if still running: it stays pending, as a row that
        did not run ahead would. One that finished is journalled already, as every finished
        row is. Its output is shown nowhere (a row pytest took is out already)."""
        executor = self.session._executor
        if executor is not None and executor.abandon(nodeid):
            self.session.row_output.take(nodeid)

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
        from pytest_osmosis.plugin.collect import EvalItem

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
        if config.option.xmlpath or getattr(config, "workerinput", {}).get("osmosis_junit"):
            # --junitxml still lists them (under xdist the controller writes it).
            self.keep_recorded(
                [
                    (item.nodeid, str(item.parent.plan.config_path), *item.key)
                    for item in recorded
                    if isinstance(item, EvalItem)
                ]
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Runner process: put the item's result on its report (builtins only: it crosses xdist)."""
        report = yield
        from pytest_osmosis.plugin.collect import EvalItem, describe_report

        if isinstance(item, EvalItem):
            describe_report(item, call, report)
        return report


class ControllerHooks:
    """The controller role's hooks (a single process, or xdist's controller): one call each."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.controller.start(session)

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        shard = self.controller.session.options.shard
        return f"osmosis: {shard} (--osmosis-shard)" if shard is not None else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool | None:
        """A session stopped before any row (``--osmosis-plan``, a "no") collects nothing."""
        return True if self.controller.stopped is not None else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        return True if self.controller.stopped is not None else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.controller.record(report)
        self.controller.name_trajectory(report)  # before JUnit reads its properties

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.controller.before_row()

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> Generator[None, tuple[str, Any, Any], tuple[str, Any, Any]]:
        from pytest_osmosis.plugin.collect import crashed_status

        status = yield
        status = crashed_status(report) or status  # a crashed worker's row is an error
        return (status[0], "", "") if self.controller.letterless(report) else status

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.controller.after_report(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        if excinfo.errisinstance(KeyboardInterrupt):
            self.controller.arm_second_interrupt()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.controller.finish(session)

    def pytest_terminal_summary(
        self, terminalreporter: Any, exitstatus: int, config: pytest.Config
    ) -> None:
        self.controller.summary(terminalreporter, exitstatus)


class WorkerHooks:
    """An xdist worker's hooks: take the controller's decisions, close at the end."""

    def __init__(self, session: EvalSession) -> None:
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        workerinput: dict[str, Any] = session.config.workerinput  # type: ignore[attr-defined]
        self.session.set_worker_input(workerinput)
        if workerinput.get("osmosis_controller_pid"):
            from pytest_osmosis.plugin.xdist import watch_controller

            watch_controller(session.config, int(workerinput["osmosis_controller_pid"]))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.session.close()

    @staticmethod
    def send_recorded(config: pytest.Config, entries: list[RecordedEntry]) -> None:
        """A finished run's deselected items go to the controller (which writes --junitxml)."""
        config.workeroutput["osmosis_recorded"] = entries  # type: ignore[attr-defined]


def stop_workers(config: pytest.Config) -> None:
    """Stop the xdist workers started so far, at once and silently (before any row)."""
    dsession = config.pluginmanager.get_plugin("dsession")
    nodemanager = getattr(dsession, "nodemanager", None)
    if nodemanager is not None:
        nodemanager.group.terminate(timeout=0)


class XdistControllerHooks:
    """xdist controller only: shard the rows across workers and tell them where to write."""

    def __init__(self, session: EvalSession, controller: Controller) -> None:
        self.session = session
        self.controller = controller
        self.blame_dir: str | None = None  # where workers say which row runs (blame.py)
        self.remote_root: str | None = None  # the workspace root on ssh workers' hosts

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from pytest_osmosis.plugin.xdist import dist_was_chosen, per_worker, worker_count
        from pytest_osmosis.plugin.xdist_scheduler import EvalScheduling

        if dist_was_chosen(config) or not self.session.runs or self._internals_problem():
            return None
        share = per_worker(self.session.total_concurrency(), worker_count(config) or 1)
        attempts = max(run.plan.settings.n for run in self.session.runs.values())
        return EvalScheduling(
            config, log, shard_rows=max(1, share // attempts), culprit=self.culprit
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Generator[None, None, None]:
        """Around the start: ours (tryfirst) plans and opens the runs, then xdist's
        (trylast) starts the workers, and the models are checked while they start up
        (Controller.check_models). A failed check stops the workers already started
        before its one line (exit 4, as when they never started): killed, they print
        nothing and run no row (rows start only in xdist's run loop, after this).
        """
        try:
            yield
        except BaseException:
            self.controller.release_output()
            raise
        if self.controller.collects_here:  # a config cannot be planned: as one process
            stop_workers(session.config)
            session.config.pluginmanager.unregister(name="dsession")
            return
        try:
            self.controller.check_models(session)
        except BaseException:
            stop_workers(session.config)
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(
        self, config: pytest.Config, data: dict[str, Any]
    ) -> Generator[None, Any, Any]:
        """A worker's report, in execnet's receiver thread: its result goes to the journal
        now, so results arriving together share one fsync (Controller.stage)."""
        report = yield
        if isinstance(report, pytest.TestReport):
            self.controller.stage(report)
        return report

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: Any) -> None:
        """Workers parse the controller's command line, after this session created the
        output directory: hand them our values joined to their flags, so none is taken
        for a test path (that worker would start a second controller of its own)."""
        import dataclasses

        params = config.invocation_params
        joined = joined_option_values(list(params.args), params.dir, even_if_read_right=True)
        if joined is not None:
            config.invocation_params = dataclasses.replace(params, args=tuple(joined))
        remote = [spec for spec in specs if not spec.popen]
        if remote and self.session.runs:
            self.remote_root = self._start_in_remote_workspace(config, remote)

    def _start_in_remote_workspace(self, config: pytest.Config, specs: list[Any]) -> str:
        """Workers on other hosts start in this workspace there (``chdir``), once its files
        are known to be this workspace's (execution/remote.py); else one line, exit 4."""
        from pytest_osmosis.execution.remote import remote_path

        problem = self._remote_problem(config)
        if problem is None:
            root = self.session.options.remote_root or str(config.rootpath)
            try:
                cwd = remote_path(config.invocation_params.dir, config.rootpath, root)
            except ValueError:
                cwd = root
            for spec in specs:
                if spec.chdir in (None, "pyexecnetcache"):  # xdist's default: a cache dir
                    spec.chdir = cwd
            problem = self._check_remote_workspace(config, specs, root)
        if problem is not None:
            self.session.abandon_runs()
            raise pytest.UsageError(f"osmosis: {problem}")
        return root

    def _remote_problem(self, config: pytest.Config) -> str | None:
        """What workers on other hosts cannot do (they share no directory with us)."""
        if self.session.options.gate.budgeted:
            return "budgets (--osmosis-max-cost, ...) need workers on this host (-n N)"
        if self.session.regrade is not None:
            return "--osmosis-regrade needs workers on this host (-n N)"
        for arg in config.invocation_params.args:
            try:
                exists = Path(str(arg).split("::")[0]).exists()
            except OSError:
                exists = False
            if exists:  # xdist maps paths to other hosts only under --rsyncdir
                return (
                    f"workers on other hosts (--tx ssh=...) cannot be given paths ({arg}): "
                    "select configs with --osmosis-eval and -k"
                )
        return None

    def _check_remote_workspace(
        self, config: pytest.Config, specs: list[Any], root: str
    ) -> str | None:
        """Compare the files every run depends on with each remote host's, by digest."""
        import execnet

        from pytest_osmosis.execution.remote import (
            REMOTE_CHECK,
            differences,
            digests,
            workspace_parts,
        )

        plans = [run.plan for run in self.session.runs.values()]
        files, dirs = workspace_parts(
            [plan.config_path for plan in plans],
            [plan.dataset.path for plan in plans],
            [(plan.rollout_dir, plan.output_root) for plan in plans],
            config.rootpath,
        )
        mine = digests(str(config.rootpath), files, dirs)
        checked: set[tuple[str, str]] = set()
        for spec in specs:
            host = (str(spec.ssh or spec), str(spec.python or "python"))
            if host in checked:
                continue
            checked.add(host)
            where = f"the workspace at {root} on {host[0]}"
            group = execnet.Group()
            # Not in the workspace (``chdir``): execnet would make the directory it checks.
            unmoved = execnet.XSpec(
                "//".join(p for p in str(spec).split("//") if not p.startswith("chdir="))
            )
            try:
                channel = group.makegateway(unmoved).remote_exec(REMOTE_CHECK)
                channel.send((root, files, [list(pair) for pair in dirs]))
                theirs = channel.receive()
            except execnet.HostNotFound:  # its text is the host's name; ssh said why
                return f"cannot check {where}: ssh could not start {host[1]} there (see above)"
            except (execnet.RemoteError, OSError, EOFError) as exc:
                line = str(exc).strip().splitlines()
                return f"cannot check {where}: {line[-1] if line else type(exc).__name__}"
            finally:
                group.terminate(timeout=10)
            if theirs is None:
                return f"{where} does not exist (--osmosis-remote-root names it)"
            differs = differences(mine, theirs)
            if differs is not None:
                return f"{where} differs from this one: {differs}"
        return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from pytest_osmosis.plugin.xdist import dist_was_chosen

        node.workerinput["osmosis_runs"] = {
            str(path): run.plan.run_name for path, run in self.session.runs.items()
        }
        prefetch = (
            bool(self.session.runs)
            and not dist_was_chosen(self.session.config)
            and not self._internals_problem()
        )
        node.workerinput["osmosis_prefetch"] = prefetch
        node.workerinput["osmosis_properties"] = self.session.properties  # collect.py
        if self._is_remote(node):
            self._remote_input(node)
            return  # nothing on this host's disk is theirs: no budget or blame files
        node.workerinput["osmosis_controller_pid"] = os.getpid()  # workers watch it (xdist.py)
        node.workerinput["osmosis_junit"] = bool(self.session.config.option.xmlpath)
        if self.session.options.gate.budgeted:  # the controller admits each row (budget.py)
            admission = self.session.admission
            if admission.budget is None or admission.budget.shared is None:
                import tempfile

                from pytest_osmosis.plugin.budget import Budget, budget_values

                directory = Path(tempfile.mkdtemp(prefix="osmosis-budget-"))
                values = budget_values(self.session.options.gate.values)
                admission.budget = Budget(*values, shared=directory)
            node.workerinput["osmosis_budget_dir"] = str(admission.budget.shared)
        from pytest_osmosis.plugin.regrade import worker_input

        node.workerinput["osmosis_regrade"] = worker_input(self.session)
        if prefetch:  # rows run ahead, so a worker's death needs the exact culprit
            if self.blame_dir is None:
                from pytest_osmosis.execution.blame import make_directory

                self.blame_dir = make_directory()
            node.workerinput["osmosis_blame_dir"] = self.blame_dir

    def _is_remote(self, node: Any) -> bool:
        return self.remote_root is not None and not node.gateway.spec.popen

    def _remote_input(self, node: Any) -> None:
        """A worker on another host: its configs' paths there, and in memory the secrets,
        the provider's key and the journals (execution/remote.py)."""
        from pytest_osmosis.execution.remote import forwarded_environment, remote_path

        assert self.remote_root is not None
        rootpath = self.session.config.rootpath
        theirs = {path: remote_path(path, rootpath, self.remote_root) for path in self.session.runs}
        runs = self.session.runs
        node.workerinput["osmosis_runs"] = {theirs[p]: run.plan.run_name for p, run in runs.items()}
        models = [run.plan.settings.model_path for run in runs.values()]
        models += self.session.options.judge_models
        secrets = [name for run in runs.values() for name in run.plan.config.secrets.required]
        node.workerinput["osmosis_remote"] = {
            "environ": forwarded_environment(secrets, models, os.environ),
            "journals": {theirs[p]: list(run.rundir.records.values()) for p, run in runs.items()},
            "config_paths": {theirs[p]: str(p) for p in runs},
        }

    def _internals_problem(self) -> str | None:
        """xdist's private API our scheduler needs, when it changed (warned once)."""
        from pytest_osmosis.plugin.xdist_scheduler import internals_problem, warn_once

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
        """A worker is down: its rows are not in flight (budgets); its list of a finished
        run's deselected items (for --junitxml)."""
        self.controller.worker_gone(node)
        entries = getattr(node, "workeroutput", {}).get("osmosis_recorded")
        if entries and not any(run.recorded_items for run in self.session.runs.values()):
            self.controller.keep_recorded(entries)

    def culprit(self, node: Any) -> str | None:
        """The node id whose code the dead worker ``node`` was running, if it said
        (``blame.NO_ROW``: none was; None: it did not say)."""
        from pytest_osmosis.execution.blame import NO_ROW, running

        if self._is_remote(node):  # a lost connection more often than a row's crash
            return NO_ROW
        if self.blame_dir is None:
            return None

        return running(self.blame_dir, str(node.gateway.id))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        budget = self.session.admission.budget
        if budget is not None and budget.shared is not None:
            import shutil

            shutil.rmtree(budget.shared, ignore_errors=True)
        if self.blame_dir is not None:
            import shutil

            shutil.rmtree(self.blame_dir, ignore_errors=True)
            self.blame_dir = None
