"""``pytest-osmosis regrade RUN``: pytest with ``--osmosis-regrade`` on the run's own config.

The session side of a regrade is ``plugin/regrade.py``; reading the old run is
``results/source_run.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pytest_osmosis.results.source_run import open_source_run, workspace_config


def add_regrade_parser(subparsers: Any) -> None:
    """``pytest-osmosis regrade RUN [--rollout-dir DIR] [-- PYTEST ARGS]`` (cli.EXTENSIONS).

    What follows ``--`` goes to pytest untouched: ``cli.main`` hands it over as
    ``args.pytest_args`` (argparse itself drops a ``--`` that follows a positional).
    """
    parser = subparsers.add_parser(
        "regrade",
        help="grade a finished run's recorded samples again with the current grader",
        allow_abbrev=False,
        usage="%(prog)s NAME|PATH [--rollout-dir DIR] [--output ROOT] [-- PYTEST ARGS]",
        description="Run pytest with --osmosis-regrade RUN on the config the run was made "
        "from: only the grader runs, over the run's recorded samples, into a new run "
        "directory. Exits with pytest's status.",
        epilog="Arguments after -- go to pytest, e.g. -- -n 2 --osmosis-name regraded",
    )
    parser.add_argument(
        "run", metavar="NAME|PATH", help="run name under the root, or its directory"
    )
    parser.add_argument(
        "--rollout-dir",
        metavar="DIR",
        help="take the workflow and grader from DIR instead of the workspace's "
        "rollouts/<rollout> (--osmosis-rollout-dir)",
    )
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="root of run directories (default: .osmosis/evals of the nearest workspace)",
    )
    parser.set_defaults(handler=run_regrade_command, pytest_args=[])


def run_regrade_command(args: argparse.Namespace) -> int:
    """Find the run and its config, then pytest in this process; pytest's exit status."""
    from pytest_osmosis.plugin.regrade import run_session

    root = Path(args.output).expanduser().resolve() if args.output else None
    source = open_source_run(args.run, root, Path.cwd())
    config = workspace_config(source)
    argv = [str(config)] if config is not None else []
    argv += ["--osmosis-regrade", str(source.path)]
    if args.rollout_dir:
        argv += ["--osmosis-rollout-dir", str(Path(args.rollout_dir).expanduser().resolve())]
    if root is not None:
        argv += ["--osmosis-output", str(root)]
    return run_session([*argv, *args.pytest_args])
