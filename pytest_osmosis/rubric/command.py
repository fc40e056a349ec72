"""``pytest-osmosis rubric``: score a JSONL file of conversations with an LLM judge.

The local twin of ``osmosis eval rubric`` (contract §10): the same input rules, judge,
statistics and ``rubric_eval_result.json``, with no workspace and no rollout. Every
(record, run) pair is judged concurrently (at most 8 in flight); a record's failures are
one-line messages in its ``errors`` list, the results are still written, and the exit
status is 1 when any record has an error (2 when the input itself is unusable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pytest_osmosis.core.errors import ConfigError, DatasetError, OsmosisError

if TYPE_CHECKING:
    from pytest_osmosis.rubric.judge import RubricJudge, Verdict

__all__ = [
    "CONCURRENCY",
    "RESULT_FILENAME",
    "RecordResult",
    "RubricRecord",
    "add_rubric_parser",
    "build_report",
    "evaluate_records",
    "load_records",
    "main",
    "output_path",
    "render_report",
    "resolve_rubric_text",
    "run_rubric_command",
    "score_statistics",
]

RESULT_FILENAME = "rubric_eval_result.json"
CONCURRENCY = 8
"""Judge calls in flight at once, as in the SDK: enough to be fast, few enough for rate limits."""

EXIT_OK = 0
EXIT_RECORD_ERRORS = 1
EXIT_USAGE = 2


# ---------------------------------------------------------------------------- input


@dataclass(frozen=True)
class RubricRecord:
    """One JSONL record: the candidate to judge and its optional context."""

    index: int
    """1-based position among the records (blank lines do not count)."""
    line: int
    """Line of the file it came from, for messages."""
    solution_str: str
    ground_truth: str | None = None
    original_input: str | None = None
    metadata: dict[str, Any] | None = None
    record_id: str | None = None

    @property
    def label(self) -> str:
        return self.record_id or f"record[{self.index}]"

    async def judged_by(self, judge: RubricJudge) -> Verdict:
        """The judge's verdict on this record, with its context: one way for every caller."""
        return await judge.judge(
            self.solution_str,
            ground_truth=self.ground_truth,
            original_input=self.original_input,
            metadata=self.metadata,
        )


def _parse_record(payload: dict[str, Any], index: int, line: int, path: Path) -> RubricRecord:
    from pytest_osmosis.rubric.judge import extract_candidate

    where = f"{path}: line {line}"
    messages = payload.get("messages")
    solution = payload.get("solution_str")
    if isinstance(messages, list) and messages:
        candidate = extract_candidate(messages)
        if not candidate:
            raise DatasetError(
                f"{where}: 'messages' has no assistant message with non-empty content to judge"
            )
    elif isinstance(solution, str) and solution.strip():
        candidate = solution.strip()
    else:
        raise DatasetError(
            f"{where}: needs 'messages' (a non-empty list of chat messages) or "
            "'solution_str' (a non-empty string)"
        )
    ground_truth = payload.get("ground_truth")
    original_input = payload.get("original_input")
    metadata = payload.get("metadata")
    raw_id = payload.get("id") or payload.get("conversation_id")
    return RubricRecord(
        index=index,
        line=line,
        solution_str=candidate,
        ground_truth=ground_truth if isinstance(ground_truth, str) else None,
        original_input=original_input if isinstance(original_input, str) else None,
        metadata=metadata if isinstance(metadata, dict) else None,
        record_id=(str(raw_id).strip() or None) if raw_id else None,
    )


def load_records(path: Path) -> list[RubricRecord]:
    """Every record of a JSONL file; raises `DatasetError` naming the file and line."""
    if not path.exists():
        raise DatasetError(f"{path}: data file does not exist")
    if path.is_dir():
        raise DatasetError(f"{path}: expected a JSONL file, got a directory")
    records: list[RubricRecord] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line_number, raw in enumerate(fh, start=1):
                text = raw.strip()
                if not text:
                    continue
                try:
                    payload = json.loads(text)
                except ValueError as exc:
                    msg = getattr(exc, "msg", str(exc))
                    raise DatasetError(f"{path}: line {line_number}: invalid JSON: {msg}") from None
                if not isinstance(payload, dict):
                    raise DatasetError(
                        f"{path}: line {line_number}: expected a JSON object, "
                        f"got {type(payload).__name__}"
                    )
                records.append(_parse_record(payload, len(records) + 1, line_number, path))
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not records:
        raise DatasetError(f"{path}: no JSON records found")
    return records


def resolve_rubric_text(value: str, base: Path | None = None) -> str:
    """Inline rubric text, or ``@FILE`` read from a file (relative to `base`)."""
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        if not path.exists():
            raise ConfigError(f"rubric file {path} does not exist")
        if path.is_dir():
            raise ConfigError(f"rubric file {path} is a directory, expected a file")
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"rubric file {path}: cannot read: {exc}") from None
        if not text:
            raise ConfigError(f"rubric file {path} is empty")
        return text
    text = value.strip()
    if not text:
        raise ConfigError("rubric: must be non-empty text, or @FILE to read it from a file")
    return text


# ---------------------------------------------------------------------------- evaluation


def score_statistics(scores: Sequence[float]) -> dict[str, float]:
    """Mean, population variance and stdev, min and max; all zeros when there are none."""
    if not scores:
        return {"average": 0.0, "variance": 0.0, "stdev": 0.0, "min": 0.0, "max": 0.0}
    values = [float(s) for s in scores]
    return {
        "average": statistics.mean(values),
        "variance": statistics.pvariance(values),
        "stdev": statistics.pstdev(values),
        "min": min(values),
        "max": max(values),
    }


@dataclass
class RecordResult:
    """A record's runs: scores and explanations of the successful ones, errors of the others."""

    index: int
    label: str
    scores: list[float] = field(default_factory=list)
    explanations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def statistics(self) -> dict[str, float]:
        return score_statistics(self.scores)

    def to_payload(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "scores": list(self.scores),
            "explanations": list(self.explanations),
            "errors": list(self.errors),
            "statistics": self.statistics,
        }


class Progress:
    """``judged 3/12`` rewritten in place on a terminal; silent when stderr is not one."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.total = total
        self.done = 0
        self.errors = 0
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = total > 1 and callable(isatty) and bool(isatty())

    def advance(self, *, error: bool) -> None:
        self.done += 1
        self.errors += int(error)
        if self.enabled:
            failed = f", {self.errors} failed" if self.errors else ""
            self.stream.write(f"\rjudged {self.done}/{self.total}{failed}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\r\033[K")
            self.stream.flush()


async def evaluate_records(
    records: Sequence[RubricRecord],
    judge: Any,
    number: int = 1,
    *,
    concurrency: int = CONCURRENCY,
    progress: Progress | None = None,
) -> list[RecordResult]:
    """Judge every (record, run) pair, at most `concurrency` at once, in record order.

    `judge` is a `pytest_osmosis.rubric.judge.RubricJudge` (anything with the same ``judge``).
    """
    from pytest_osmosis.rubric.judge import JudgeError

    semaphore = asyncio.Semaphore(concurrency)

    async def one(record: RubricRecord) -> tuple[float | None, str | None, str | None]:
        async with semaphore:
            try:
                verdict = await record.judged_by(judge)
            except JudgeError as exc:
                outcome: tuple[float | None, str | None, str | None] = (None, None, str(exc))
            except Exception as exc:  # noqa: BLE001 - one line per record, never a traceback
                from pytest_osmosis.rubric.judge import one_line

                outcome = (None, None, f"{type(exc).__name__}: {one_line(str(exc))}")
            else:
                outcome = (verdict.score, verdict.explanation, None)
            if progress is not None:
                progress.advance(error=outcome[2] is not None)
            return outcome

    flat = await asyncio.gather(*(one(r) for r in records for _ in range(number)))
    results: list[RecordResult] = []
    for position, record in enumerate(records):
        result = RecordResult(index=record.index, label=record.label)
        for score, explanation, error in flat[position * number : (position + 1) * number]:
            if error is not None:
                result.errors.append(error)
            else:
                assert score is not None and explanation is not None
                result.scores.append(score)
                result.explanations.append(explanation)
        results.append(result)
    return results


# ---------------------------------------------------------------------------- output


def build_report(
    *,
    model: str,
    rubric: str,
    data_path: str,
    number: int,
    results: Sequence[RecordResult],
    generated_at: datetime | None = None,
) -> dict[str, Any]:
    """The ``rubric_eval_result.json`` document, field for field as the SDK writes it."""
    moment = generated_at or datetime.now(timezone.utc)
    return {
        "generated_at": moment.isoformat(),
        "model": model,
        "rubric": rubric,
        "data_path": data_path,
        "number": number,
        "overall_statistics": score_statistics([s for r in results for s in r.scores]),
        "records": [r.to_payload() for r in results],
    }


def output_path(value: str) -> Path:
    """``-o``: a file, or a directory (existing, or written with a trailing separator)."""
    path = Path(value).expanduser()
    if value.endswith(("/", os.sep)) or path.is_dir():
        return path / RESULT_FILENAME
    return path


def write_report(report: dict[str, Any], path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    except OSError as exc:
        raise ConfigError(f"-o {path}: cannot write the results: {exc.strerror or exc}") from None
    return path


def render_report(report: dict[str, Any], write: Callable[[str], object]) -> None:
    """The console report: each record's runs, its errors, then the overall statistics."""
    write(f"Model: {report['model']}")
    write(f"Evaluated {len(report['records'])} record(s) from {report['data_path']}")
    write(f"Runs per record: {report['number']}")
    write("")
    for record in report["records"]:
        write(f"[{record['label']}]")
        for run, (score, explanation) in enumerate(
            zip(record["scores"], record["explanations"], strict=False), start=1
        ):
            write(f"  Run {run:02d}: score={score:.4f}")
            write(f"    explanation: {' '.join(explanation.split())}")
        for error in record["errors"]:
            write(f"  ERROR: {error}")
        if len(record["scores"]) > 1:
            s = record["statistics"]
            write(
                f"  Summary: avg={s['average']:.4f} stdev={s['stdev']:.4f} "
                f"min={s['min']:.4f} max={s['max']:.4f}"
            )
        write("")
    overall = report["overall_statistics"]
    write("Overall Statistics:")
    write(f"  average:  {overall['average']:.4f}")
    write(f"  stdev:    {overall['stdev']:.4f}")
    write(f"  min/max:  {overall['min']:.4f} / {overall['max']:.4f}")


# ---------------------------------------------------------------------------- command


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("-d", "--data", required=True, metavar="DATA.jsonl",
                        help="JSONL file of conversations ('messages') or 'solution_str' records")
    parser.add_argument("-r", "--rubric", required=True, metavar="TEXT|@FILE",
                        help="rubric text, or @FILE to read it from a file")
    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="judge model: any LiteLLM id (e.g. openai/gpt-5-mini) or "
                        "osmosis/embedded for the offline SmolLM2")
    parser.add_argument("-n", "--number", type=_positive_int, default=1, metavar="N",
                        help="judge runs per record (default 1)")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help=f"write the results as JSON to OUT ({RESULT_FILENAME} in it "
                        "when OUT is a directory or ends with /)")
    parser.add_argument("--timeout", type=_positive_float, default=None, metavar="S",
                        help="seconds per judge call (default: 30, longer for slow providers)")
    parser.add_argument("--score-min", type=_finite, default=0.0, metavar="A",
                        help="lowest score (default 0)")
    parser.add_argument("--score-max", type=_finite, default=1.0, metavar="B",
                        help="highest score (default 1)")
    parser.add_argument("--api-key", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_rubric_command)
    return parser


def add_rubric_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``rubric`` sub-command; its namespace's ``func`` is `run_rubric_command`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rubric",
        allow_abbrev=False,
        help="score a JSONL file of conversations with an LLM judge",
        description="Score each record of a JSONL file against a rubric with an LLM judge "
        "(the local twin of `osmosis eval rubric`).",
    )
    return _configure_parser(parser)


def run_rubric_command(
    args: argparse.Namespace, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None
) -> int:
    """Run ``rubric`` with parsed arguments and return the exit status; bad input is one line."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr

    def say(line: str) -> None:
        print(line, file=out)

    from pytest_osmosis.rubric.judge import RubricJudge

    try:
        if args.number < 1:
            raise ConfigError(f"--number: must be at least 1, got {args.number}")
        if args.api_key is not None:
            print("warning: --api-key is deprecated; set the provider's environment variable "
                  "instead", file=err)
        rubric = resolve_rubric_text(args.rubric)
        judge = RubricJudge(
            rubric,
            args.model,
            score_min=args.score_min,
            score_max=args.score_max,
            timeout=args.timeout,
            api_key=args.api_key,
        )
        data = Path(args.data).expanduser()
        records = load_records(data)
        destination = output_path(args.output) if args.output else None
    except OsmosisError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE
    progress = Progress(len(records) * args.number, err)
    try:
        results = asyncio.run(evaluate_records(records, judge, args.number, progress=progress))
    except KeyboardInterrupt:
        progress.close()
        print("interrupted: no results written", file=err)
        return 130
    progress.close()
    report = build_report(
        model=args.model, rubric=rubric, data_path=str(data), number=args.number, results=results
    )
    render_report(report, say)
    if destination is not None:
        try:
            written = write_report(report, destination)
        except OsmosisError as exc:
            print(f"error: {exc}", file=err)
            return EXIT_USAGE
        say(f"Wrote results to {written}")
    failed = sum(1 for r in results if r.errors)
    if failed:
        errors = sum(len(r.errors) for r in results)
        print(f"error: rubric evaluation completed with {errors} error(s) in {failed} "
              f"of {len(results)} record(s)", file=err)
        return EXIT_RECORD_ERRORS
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_osmosis.rubric.command ...``: the command without the umbrella CLI."""
    parser = _configure_parser(
        argparse.ArgumentParser(
            prog="pytest-osmosis rubric", description=__doc__, allow_abbrev=False
        )
    )
    args = parser.parse_args(argv)
    return run_rubric_command(args)


if __name__ == "__main__":
    sys.exit(main())
