"""``pytest-osmosis cache``: look at, empty and prune the model-call cache (model/cache.py).

``list`` shows what the cache beside the runs holds, by model (entries, size, tokens,
oldest and newest answer); ``clear`` empties it (or one model's entries); ``prune`` drops
answers older than an age; ``path`` prints where it is. Registered through `cli.EXTENSIONS`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any

from pytest_osmosis.cli import (
    EXIT_OK,
    JSON_SCHEMA_VERSION,
    _add_common,
    _dump_json,
    _output_root,
    _table,
)
from pytest_osmosis.model.cache import (
    cache_path,
    cache_size,
    cache_stats,
    parse_max_age,
    remove_entries,
)

__all__ = ["add_cache_parser", "cmd_cache"]


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"  # pragma: no cover - the loop returns


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "–"
    return datetime.fromtimestamp(stamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def cmd_cache(args: argparse.Namespace) -> int:
    path = cache_path(_output_root(args))
    action = args.action
    payload: dict[str, Any] = {"schema_version": JSON_SCHEMA_VERSION, "path": str(path)}
    if action == "path":
        if args.json:
            _dump_json(payload, sys.stdout)
        else:
            sys.stdout.write(f"{path}\n")
        return EXIT_OK
    if action in ("clear", "prune"):
        older = parse_max_age(args.max_age, "--max-age") if action == "prune" else None
        removed = remove_entries(path, model=args.model, older_than_s=older)
        if args.json:
            _dump_json({**payload, "removed": removed}, sys.stdout)
        else:
            sys.stdout.write(
                f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {path}\n"
            )
        return EXIT_OK
    stats = cache_stats(path)
    if args.json:
        _dump_json({**payload, "bytes": cache_size(path), "models": stats}, sys.stdout)
        return EXIT_OK
    if not stats:
        sys.stdout.write(f"No model-call cache entries at {path}.\n")
        return EXIT_OK
    entries = sum(s["entries"] for s in stats)
    sys.stdout.write(f"{path}: {entries} entries, {_size(cache_size(path))} on disk\n\n")
    rows = [
        [
            s["model"],
            f"{s['entries']:,}",
            _size(s["bytes"] or 0),
            f"{s['tokens']:,}",
            f"{(s['latency_ms'] or 0) / 1000:.1f} s",
            _when(s["oldest"]),
            _when(s["newest"]),
        ]
        for s in stats
    ]
    headers = ("model", "entries", "size", "tokens", "model time", "oldest", "newest")
    sys.stdout.write("\n".join(_table(headers, rows, {1, 2, 3, 4})) + "\n")
    return EXIT_OK


def add_cache_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``cache list|clear|prune|path``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cache",
        help="the model-call cache beside the runs (--osmosis-cache)",
        allow_abbrev=False,
        description="Show, empty or prune the model-call cache that --osmosis-cache "
        "use/record/replay keeps in <output root>/.cache/model-calls.sqlite.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("list", "entries, size, tokens, oldest and newest answer, by model"),
        ("clear", "remove every entry (or one model's)"),
        ("prune", "remove entries older than --max-age"),
        ("path", "print where the cache is"),
    ):
        action = actions.add_parser(name, help=text, description=text, allow_abbrev=False)
        _add_common(action)
        if name in ("clear", "prune"):
            action.add_argument("--model", help="only this model's entries")
        if name == "prune":
            action.add_argument("--max-age", required=True, metavar="AGE", help="e.g. 12h, 7d, 2w")
        action.set_defaults(handler=cmd_cache)
    return parser
