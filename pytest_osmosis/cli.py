"""``pytest-osmosis``: look at the runs kept in ``.osmosis/evals`` without re-running anything.

Subcommands follow the Osmosis CLI's conventions: a human table by default, ``--json``
for scripts (``{"schema_version": 1, ...}`` on stdout, an error envelope on stderr), and
exit codes a script can branch on: 0 ok, 2 usage error or run not found, 1 anything else.

Extending: a module in ``EXTENSIONS`` adds a subcommand by exposing
``add_<name>_parser(subparsers)``
that calls ``subparsers.add_parser(...)`` and ``set_defaults(handler=fn)`` (or
``func=fn``) where ``fn(args: argparse.Namespace) -> int`` returns the exit code
(``pytest_osmosis.rubric.command`` is one); a module listed there that cannot be imported
fails every command. Handlers raise
:class:`~pytest_osmosis.core.errors.OsmosisError` subclasses for errors a user meets
(``ConfigError`` and ``RunNotFoundError`` exit 2, the others 1).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_osmosis import __version__
from pytest_osmosis.core.errors import ConfigError, OsmosisError, RunDirectoryError
from pytest_osmosis.core.words import (
    ATTEMPTS,
    BELOW_THRESHOLD,
    ERRORED,
    NO_RATE,
    SKIPPED,
    outcomes_text,
    pass_rate_text,
    percent,
)
from pytest_osmosis.results.row_metrics import cost_text
from pytest_osmosis.results.run_reader import dataset_row, load_run, parse_time
from pytest_osmosis.results.run_views import format_duration, run_info, run_list_item
from pytest_osmosis.results.runs import find_output_root, list_runs, resolve_run

PROG = "pytest-osmosis"
JSON_SCHEMA_VERSION = 1
DEFAULT_LIMIT = 20
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
EXTENSIONS = (
    "pytest_osmosis.rubric.command",
    "pytest_osmosis.commands.cache",
    "pytest_osmosis.commands.regrade",
    "pytest_osmosis.commands.ci",
)

Handler = Callable[[argparse.Namespace], int]


class UsageError(ConfigError):
    """A command line that parses but asks for something impossible (exit 2)."""


# ----------------------------------------------------------------------------- output


def _dump_json(payload: Mapping[str, Any], stream: TextIO) -> None:
    stream.write(json.dumps(payload, ensure_ascii=False, allow_nan=False, indent=2) + "\n")


def _when(value: Any) -> str:
    parsed = parse_time(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%SZ") if parsed else "–"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=False)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


# ----------------------------------------------------------------------------- root / refs


def _output_root(args: argparse.Namespace) -> Path:
    if args.output:
        return Path(args.output).expanduser().resolve()
    return find_output_root(Path.cwd())


def _resolve(args: argparse.Namespace, ref: str) -> Path:
    root = Path(args.output).expanduser().resolve() if args.output else None
    return resolve_run(ref, root)


# ----------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    if args.all and args.limit is not None:
        raise UsageError("--all and --limit are mutually exclusive")
    limit = None if args.all else (DEFAULT_LIMIT if args.limit is None else args.limit)
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be a positive integer, got {limit}")
    root = _output_root(args)
    items = [run_list_item(run) for run in list_runs(root)]
    shown = items if limit is None else items[:limit]
    if args.json:
        _dump_json(
            {
                "schema_version": JSON_SCHEMA_VERSION,
                "items": shown,
                "total_count": len(items),
                "has_more": len(shown) < len(items),
                "next_offset": len(shown) if len(shown) < len(items) else None,
                "output_root": str(root),
            },
            sys.stdout,
        )
        return EXIT_OK
    out = sys.stdout
    if not items:
        out.write(f"No runs under {root}.\nRun `pytest --osmosis-eval` to create one.\n")
        return EXIT_OK
    rows = [
        [
            item["name"],
            item["status"],
            str(item["rollout"] or "–"),
            str(item["model"] or "–"),
            str(item["dataset"] or "–"),
            f"{item['rows_done']}/{item['rows_total'] if item['rows_total'] is not None else '?'}",
            percent(item["pass_rate"]) if item["completed_samples"] else NO_RATE,
            _when(item["started_at"]),
            format_duration(item["duration_ms"]),
        ]
        for item in shown
    ]
    headers = [
        "NAME",
        "STATUS",
        "ROLLOUT",
        "MODEL",
        "DATASET",
        "DONE",
        "PASS",
        "STARTED",
        "DURATION",
    ]
    out.write(f"Runs in {root}\n\n")
    out.write("\n".join(_table(headers, rows, right={5, 6, 8})) + "\n")
    if len(shown) < len(items):
        out.write(f"\nShowing {len(shown)} of {len(items)}. Use --all to show every run.\n")
    out.write(f"\nUse `{PROG} info <name>` for details, `{PROG} report <name>` for a report.\n")
    return EXIT_OK


# ----------------------------------------------------------------------------- info


def _info_lines(info: Mapping[str, Any]) -> list[str]:
    """``info`` as text: a header, then one block per section of :func:`run_info`."""
    lines = [f"Run       {info['name']}  ({info['status']})", f"Path      {info['path']}"]
    if info.get("local_run_id"):
        lines.append(f"Local id  {info['local_run_id']}")
    threshold = float(info["configuration"]["pass_threshold"])
    lines += _section("Context", _context_pairs(info["context"]))
    lines += _section("Timing", _timing_pairs(info["timing"]))
    lines += _section("Progress", _progress_pairs(info["progress"]))
    lines += _section("Configuration", _configuration_pairs(info["configuration"]))
    lines += _section(
        "Results", _results_pairs(info["results"], info["error_types"], threshold, info["cost"])
    )
    # Every attempt that did not pass, by outcome: what pytest calls failed is both of the
    # first two (an error, a reward below the threshold).
    for word, key in (
        (ERRORED, "failed_rows"),
        (BELOW_THRESHOLD, "below_threshold_rows"),
        (SKIPPED, "skipped_rows"),
    ):
        lines += _attempt_lines(word, key, info[key], threshold)
    lines += [f"\nWarning: {warning}" for warning in info["warnings"]]
    return lines


def _section(title: str, pairs: Sequence[tuple[str, Any]]) -> list[str]:
    """A titled block of aligned ``name  value`` lines; empty values are left out."""
    shown = [(k, v) for k, v in pairs if v not in (None, "", [], {})]
    if not shown:
        return []
    width = max(len(k) for k, _ in shown)
    return ["", title, *(f"  {k.ljust(width)}  {v}" for k, v in shown)]


def _git_text(git: Mapping[str, Any]) -> str | None:
    if not git.get("commit"):
        return None
    text = str(git["commit"])[:12]
    if git.get("branch"):
        text += f" on {git['branch']}"
    return text + ("  (DIRTY: uncommitted changes)" if git.get("dirty") else "  (clean)")


def _context_pairs(ctx: Mapping[str, Any]) -> list[tuple[str, Any]]:
    sha = ctx.get("dataset_sha256")
    digest = ctx.get("rollout_source_digest")
    return [
        ("Model", ctx.get("model")),
        ("Dataset", f"{ctx.get('dataset') or '–'}" + (f"  (sha256 {sha[:12]})" if sha else "")),
        (
            "Rollout",
            f"{ctx.get('rollout') or '–'} / {ctx.get('entrypoint') or '–'}"
            + (f"  (source {digest[:12]})" if digest else ""),
        ),
        ("Config", ctx.get("config_path")),
        ("Written by", ctx.get("sdk_version")),
        ("Git", _git_text(ctx.get("git") or {})),
        ("Config branch", ctx.get("config_branch")),
        ("Config commit", ctx.get("config_commit_sha")),
    ]


def _timing_pairs(timing: Mapping[str, Any]) -> list[tuple[str, Any]]:
    def when(key: str) -> str | None:
        return _when(timing[key]) if timing.get(key) else None

    duration = timing.get("duration_ms")
    return [
        ("Created", when("created_at")),
        ("Started", when("started_at")),
        ("Completed", when("completed_at")),
        ("Duration", format_duration(duration) if duration is not None else None),
    ]


def _progress_pairs(progress: Mapping[str, Any]) -> list[tuple[str, Any]]:
    total = progress.get("total")
    return [
        (
            "Attempts",
            f"{progress['done']}/{total if total is not None else '?'} recorded"
            + (f", {progress['pending']} pending" if progress.get("pending") else "")
            + (f", {progress['resumed']} carried forward" if progress.get("resumed") else ""),
        ),
        ("Outcomes", outcomes_text(progress)),
        (
            "Rows",
            f"{progress.get('sampled_rows') or '?'} selected of "
            f"{progress.get('total_dataset_rows') or '?'} in the dataset",
        ),
    ]


def _seconds(value: Any) -> str:
    return f"{value:g} s" if isinstance(value, (int, float)) else "unbounded"


def _configuration_pairs(config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    timeouts = config.get("timeouts") or {}
    return [
        ("n", config.get("n")),
        ("Rows", config.get("selection")),
        ("Pass threshold", f"{float(config['pass_threshold'])!r}"),
        (
            "Timeouts",
            f"workflow {_seconds(timeouts.get('agent_workflow_timeout_s'))}, "
            f"grader {_seconds(timeouts.get('grader_timeout_s'))}",
        ),
        ("Env keys", ", ".join(config.get("env_keys") or [])),
        ("Secret names", ", ".join(config.get("secret_names") or [])),
        ("Advanced", ", ".join(sorted(config.get("advanced") or {}))),
    ]


def _results_pairs(
    results: Mapping[str, Any],
    error_types: Mapping[str, int],
    threshold: float,
    cost: Mapping[str, Any] | None,
) -> list[tuple[str, Any]]:
    stats = results.get("reward_stats")
    points = results.get("pass_at_k")
    rate = pass_rate_text(int(results.get("passed", 0)), int(results.get("completed_samples", 0)))
    recorded_threshold = float(results.get("pass_threshold", threshold))
    return [
        ("Pass rate", f"{rate}, pass_threshold {recorded_threshold!r}"),
        (
            "Reward",
            " · ".join(f"{k} {stats[k]:.3f}" for k in ("mean", "median", "std", "min", "max"))
            if stats
            else None,
        ),
        (
            "pass@k",
            " · ".join(f"k={p['k']} {percent(p['value'])}" for p in points) if points else None,
        ),
        ("Tokens", f"{results.get('tokens_used', 0):,}"),
        ("Cost", cost_text(cost)),  # the results table's words; left out when not recorded
        ("Error types", ", ".join(f"{k} x{v}" for k, v in error_types.items())),
    ]


#: ``info`` lists at most this many attempts of one outcome (``--json`` lists all).
_INFO_ATTEMPTS = 50


def _attempt_lines(
    word: str, key: str, entries: Sequence[Mapping[str, Any]], threshold: float
) -> list[str]:
    """The attempts of one outcome, one line each (and the error headline under it)."""
    if not entries:
        return []
    lines = ["", f"{word.capitalize()} {ATTEMPTS} ({len(entries)})"]
    for entry in entries[:_INFO_ATTEMPTS]:
        text = f"  row {dataset_row(entry)} run {entry['run_index']}"
        if key == "failed_rows":
            text += f": error_type={entry.get('error_type') or 'unknown'}"
        reward = entry.get("reward")
        if key == "below_threshold_rows" and isinstance(reward, (int, float)):
            text += f": reward {reward:.2f} < {threshold!r}"
        if entry.get("rollout_id"):
            text += f" -> rollout_trials/{entry['rollout_id']}"
        if entry.get("error_message"):
            text += f"\n      {entry['error_message']}"
        lines.append(text)
    if len(entries) > _INFO_ATTEMPTS:
        lines.append(f"  ... and {len(entries) - _INFO_ATTEMPTS} more (--json lists all)")
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    info = run_info(load_run(_resolve(args, args.run)))
    if args.json:
        _dump_json({"schema_version": JSON_SCHEMA_VERSION, "data": info}, sys.stdout)
    else:
        sys.stdout.write("\n".join(_info_lines(info)) + "\n")
    return EXIT_OK


# ----------------------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_osmosis.report import (
        compare_runs,
        comparison_markdown,
        redacted,
        run_markdown,
        write_index,
        write_report,
    )

    if args.index:
        return _report_index(args, write_index)
    if args.run is None:
        raise UsageError("give a run (NAME, PATH or latest), or --index for runs.html")
    run_dir = _resolve(args, args.run)
    baseline_dir = _resolve(args, args.compare) if args.compare else None
    if baseline_dir is not None and baseline_dir.resolve() == run_dir.resolve():
        raise UsageError("--compare names the same run; give a different baseline run")
    output = Path(args.out).expanduser() if args.out else None
    if output is not None and output.is_dir():
        raise UsageError(f"-o {args.out}: is a directory; give a file name")
    payload: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "status": "success",
        "operation": "report",
    }
    if args.format == "markdown" and output is None:
        run = load_run(run_dir)
        comparison = compare_runs(run, load_run(baseline_dir)) if baseline_dir else None
        text = comparison_markdown(comparison) if comparison else run_markdown(run)
        text = redacted(text, run)  # as a written report is
        if args.json:
            payload["resource"] = {"format": "markdown", "path": None}
            payload["markdown"] = text
            if comparison:
                payload["comparison"] = comparison
            _dump_json(payload, sys.stdout)
        else:
            sys.stdout.write(text)
        return EXIT_OK
    try:
        path, comparison = write_report(
            run_dir,
            output.resolve() if output else None,
            baseline_dir=baseline_dir,
            fmt=args.format,
            dataset_hints=(Path(args.dataset).expanduser(),) if args.dataset else (),
        )
    except RunDirectoryError as exc:
        if output is not None:
            raise
        raise RunDirectoryError(f"{exc} (-o FILE)") from exc
    if args.json:
        payload["resource"] = {"format": args.format, "path": str(path)}
        if comparison:
            payload["comparison"] = comparison
        _dump_json(payload, sys.stdout)
    else:
        sys.stdout.write(f"{path}\n")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    """``compare RUN BASELINE``: the obvious name for ``report RUN --compare BASELINE``."""
    args.compare, args.index = args.baseline, False
    return cmd_report(args)


def _report_index(args: argparse.Namespace, write_index: Callable[..., Path]) -> int:
    """``report --index``: ``runs.html`` of every run under the output root."""
    if args.run is not None or args.compare or args.dataset or args.format != "html":
        raise UsageError("--index takes no run, --compare, --dataset or --format")
    root = _output_root(args)
    if not root.is_dir():
        raise UsageError(f"{root}: no such output root (run `pytest --osmosis-eval` first)")
    output = Path(args.out).expanduser().resolve() if args.out else None
    if output is not None and output.is_dir():
        raise UsageError(f"-o {args.out}: is a directory; give a file name")
    path = write_index(root, output)
    if args.json:
        _dump_json(
            {
                "schema_version": JSON_SCHEMA_VERSION,
                "status": "success",
                "operation": "report",
                "resource": {"format": "html", "path": str(path), "index": True},
            },
            sys.stdout,
        )
    else:
        sys.stdout.write(f"{path}\n")
    return EXIT_OK


# ----------------------------------------------------------------------------- parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="root of run directories (default: .osmosis/evals of the nearest workspace)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _register_extensions(subparsers: Any) -> None:
    """Let the modules of :data:`EXTENSIONS` add their subcommands.

    Each is part of this package: one that cannot be imported is a broken install or a
    renamed module, and fails every command loudly rather than losing its subcommands.
    """
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"pytest-osmosis: cannot import {name}, which adds subcommands: {exc}"
            ) from exc
        for attribute in sorted(vars(module)):
            register = getattr(module, attribute)
            wanted = attribute.startswith("add_") and attribute.endswith("_parser")
            if wanted and callable(register):
                register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect Osmosis eval runs written by `pytest --osmosis-eval` or the "
        "Osmosis SDK.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_list = subparsers.add_parser(
        "list",
        help="runs, newest first",
        allow_abbrev=False,
        description="List runs under the output root, newest first.",
    )
    _add_common(p_list)
    p_list.add_argument(
        "--limit", type=int, metavar="N", help=f"show N runs (default {DEFAULT_LIMIT})"
    )
    p_list.add_argument("--all", action="store_true", help="show every run")
    p_list.set_defaults(handler=cmd_list)

    p_info = subparsers.add_parser(
        "info",
        help="everything about one run",
        allow_abbrev=False,
        description="Show a run's context, configuration, results and the attempts "
        "that errored or were skipped.",
    )
    p_info.add_argument(
        "run", metavar="NAME|PATH", help="run name under the root, or its directory"
    )
    _add_common(p_info)
    p_info.set_defaults(handler=cmd_info)

    p_report = subparsers.add_parser(
        "report",
        help="write a self-contained HTML (or Markdown) report",
        allow_abbrev=False,
        description="Write a report of one run and print its path. HTML by default, with plots "
        "and every attempt's input, answer and trajectory; --compare adds regressed/improved "
        "rows, both runs' answers row by row and the pass-rate change against a baseline "
        "run. --index writes runs.html: every run under the root, with the pass rate over time.",
    )
    p_report.add_argument(
        "run",
        metavar="NAME|PATH",
        nargs="?",
        help="run name under the root, its directory, or `latest` (the newest run)",
    )
    p_report.add_argument(
        "--index",
        action="store_true",
        help="write runs.html (every run under the root) instead of one run's report",
    )
    p_report.add_argument(
        "--dataset",
        metavar="FILE",
        help="the run's dataset file, for each row's input (used only when its sha256 is "
        "the manifest's; default: looked for in the workspace's data/)",
    )
    p_report.add_argument(
        "-o",
        "--out",
        metavar="FILE",
        help="where to write (default: report.html inside the run directory, runs.html in "
        "the root with --index; Markdown goes to stdout)",
    )
    p_report.add_argument("--compare", metavar="OTHER", help="baseline run to compare against")
    p_report.add_argument("--format", choices=("html", "markdown"), default="html")
    _add_common(p_report)
    p_report.set_defaults(handler=cmd_report)

    p_compare = subparsers.add_parser(
        "compare",
        help="compare a run with a baseline run (report RUN --compare BASELINE)",
        allow_abbrev=False,
        description="Write the comparison of RUN against BASELINE and print its path: the "
        "pass-rate change with its 95% interval, regressed and improved rows, both runs' "
        "answers row by row. The same as `report RUN --compare BASELINE`.",
    )
    p_compare.add_argument("run", metavar="RUN", help="run name, directory, or `latest`")
    p_compare.add_argument("baseline", metavar="BASELINE", help="the run to compare against")
    p_compare.add_argument("--dataset", metavar="FILE", help="RUN's dataset file (as report's)")
    p_compare.add_argument(
        "-o",
        "--out",
        metavar="FILE",
        help="where to write (default: inside RUN's directory; Markdown goes to stdout)",
    )
    p_compare.add_argument("--format", choices=("html", "markdown"), default="html")
    _add_common(p_compare)
    p_compare.set_defaults(handler=cmd_compare)

    _register_extensions(subparsers)
    return parser


def _fail(args: argparse.Namespace | None, code: str, message: str, exit_code: int) -> int:
    if args is not None and getattr(args, "json", False):
        _dump_json(
            {
                "schema_version": JSON_SCHEMA_VERSION,
                "command": getattr(args, "command", None) or "<root>",
                "cli_version": __version__,
                "error": {"code": code, "message": message, "details": {}},
            },
            sys.stderr,
        )
    else:
        sys.stderr.write(f"{PROG}: error: {message}\n")
    return exit_code


def _split_passed_on(
    parser: argparse.ArgumentParser, words: list[str]
) -> tuple[list[str], list[str] | None]:
    """``(our words, pytest's)``: for a subcommand that passes arguments on to pytest (its
    parser defaults ``pytest_args``), everything after the first ``--`` is pytest's, exactly
    as given. argparse cannot be left to it: it drops a ``--`` that follows a positional
    (Python 3.10-3.13), so pytest's arguments would be read as ours."""
    if "--" not in words:
        return words, None
    cut = words.index("--")
    command = next((word for word in words[:cut] if not word.startswith("-")), None)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            if action.choices[command].get_default("pytest_args") is not None:
                return words[:cut], words[cut + 1 :]
    return words, None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 usage/not found, 1 error)."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    words, passed_on = _split_passed_on(parser, words)
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse: --help, --version, or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if passed_on is not None:
        args.pytest_args = passed_on
    handler: Handler | None = getattr(args, "handler", None) or getattr(args, "func", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from pytest_osmosis.results.run_reader import RunNotFoundError

    try:
        return handler(args)
    except RunNotFoundError as exc:
        return _fail(args, "NOT_FOUND", str(exc), EXIT_USAGE)
    except ConfigError as exc:
        return _fail(args, "VALIDATION", str(exc), EXIT_USAGE)
    except OsmosisError as exc:
        return _fail(args, "RUN_DIRECTORY", str(exc), EXIT_ERROR)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pytest-osmosis list | head`: stop quietly, like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug, or an OSError we did not foresee: one line, exit 1
        if os.environ.get("PYTEST_OSMOSIS_DEBUG") == "1":
            raise
        return _fail(args, "INTERNAL", f"{type(exc).__name__}: {exc}", EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
