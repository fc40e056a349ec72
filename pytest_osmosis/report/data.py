"""What the report shows about each (row, attempt): a compact, JSON-able record.

Trajectories and small text artifacts are embedded so the report works as one file;
a size budget keeps a 10,000-row run's report openable (failures are embedded first,
the rest fall back to links into the run directory).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_osmosis.core.errors import OsmosisError
from pytest_osmosis.core.words import OUTCOME_WORDS, one_line
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.run_reader import COST_KEY, dataset_row
from pytest_osmosis.results.runs import (
    error_messages,
    find_dataset,
    list_artifacts,
    read_trajectory,
)

MAX_TEXT = 20_000
MAX_STEPS = 400
EMBED_BUDGET = 24 * 1024 * 1024
#: Characters of an input, label, answer or explanation the page holds for the drawer
#: (every row's, so a 10,000-row report stays openable); the table cell shows fewer.
MAX_FIELD = 2000
CELL_CHARS = 160
#: The artifact ``RubricGrader`` writes its judge's verdict to (rubric/grader.py).
JUDGEMENT_ARTIFACT = "rubric_judgement.json"
#: A grader's own explanation: ``ctx.sample.extra_fields[EXPLANATION_FIELD]``.
EXPLANATION_FIELD = "explanation"
_PRIORITY = {"failed": 0, "below_threshold": 1, "passed": 2, "skipped": 3}


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit} more characters in the run directory]"


def message_text(content: Any) -> str:
    """ATIF ``message``: a string, or content parts (text kept, other parts named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _clip(content)
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif isinstance(part, dict):
                pieces.append(f"[{part.get('type', 'part')}]")
            else:
                pieces.append(str(part))
        return _clip("\n".join(pieces))
    return _clip(json.dumps(content, ensure_ascii=False, indent=2, default=str))


def _numbers(value: Any, keys: tuple[str, ...]) -> dict[str, float | int]:
    if not isinstance(value, dict):
        return {}
    return {
        key: value[key]
        for key in keys
        if isinstance(value.get(key), (int, float))
        and not isinstance(value.get(key), bool)
        and math.isfinite(value[key])
    }


def simplify_trajectory(document: Mapping[str, Any]) -> dict[str, Any]:
    """ATIF -> the steps the report draws: text, tool calls, observations, per-step tokens."""
    steps_in = document.get("steps")
    steps: list[dict[str, Any]] = []
    for step in steps_in if isinstance(steps_in, list) else []:
        if len(steps) >= MAX_STEPS:
            break
        if not isinstance(step, dict):
            continue
        item: dict[str, Any] = {
            "id": step.get("step_id"),
            "source": str(step.get("source", "")),
            "text": message_text(step.get("message")),
        }
        for key in ("model_name", "timestamp", "reasoning_effort"):
            if isinstance(step.get(key), (str, int, float)):
                item[key] = step[key]
        if isinstance(step.get("reasoning_content"), str):
            item["reasoning"] = _clip(step["reasoning_content"])
        calls = step.get("tool_calls")
        if isinstance(calls, list):
            item["tools"] = [
                {
                    "id": str(call.get("tool_call_id", "")),
                    "name": str(call.get("function_name", "")),
                    "args": _clip(
                        json.dumps(call.get("arguments"), ensure_ascii=False, indent=2, default=str)
                    ),
                }
                for call in calls
                if isinstance(call, dict)
            ]
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, dict) else None
        if isinstance(results, list):
            item["obs"] = [
                {"id": str(r.get("source_call_id") or ""), "text": message_text(r.get("content"))}
                for r in results
                if isinstance(r, dict)
            ]
        metrics = _numbers(
            step.get("metrics"), ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd")
        )
        if metrics:
            item["metrics"] = metrics
        steps.append(item)
    extra = document.get("extra")
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    osmosis = osmosis if isinstance(osmosis, dict) else {}
    result: dict[str, Any] = {
        "steps": steps,
        "total_steps": len(steps_in) if isinstance(steps_in, list) else 0,
        "final": _numbers(
            document.get("final_metrics"),
            (
                "total_prompt_tokens",
                "total_completion_tokens",
                "total_cached_tokens",
                "total_cost_usd",
                "total_steps",
            ),
        ),
    }
    if isinstance(osmosis.get("label"), str):
        result["label"] = _clip(osmosis["label"], 2000)
    raw_metrics = osmosis.get("sample_metrics")
    sample_metrics = _numbers(
        raw_metrics, tuple(raw_metrics) if isinstance(raw_metrics, dict) else ()
    )
    if sample_metrics:
        result["sample_metrics"] = sample_metrics
    agent = document.get("agent")
    if isinstance(agent, dict):
        result["agent"] = " ".join(
            str(agent[k])
            for k in ("name", "version", "model_name")
            if isinstance(agent.get(k), str)
        )
    return result


def href(run_dir: Path, rel: str, report_dir: Path) -> str:
    """A URL from the report's folder to ``run_dir/rel`` (relative, so the pair can move)."""
    target = os.path.relpath(os.path.abspath(run_dir / rel), os.path.abspath(report_dir))
    return quote(Path(target).as_posix(), safe="/._-~")


def _final_answer(trajectory: Mapping[str, Any] | None) -> str:
    if not trajectory:
        return ""
    for step in reversed(trajectory.get("steps", [])):
        if step.get("source") == "agent" and step.get("text"):
            return _clip(str(step["text"]), MAX_FIELD)
    return ""


def _trajectory_input(trajectory: Mapping[str, Any] | None) -> list[list[str]]:
    """The messages before the first agent step: what the workflow was asked."""
    found: list[list[str]] = []
    for step in (trajectory or {}).get("steps", []):
        if step.get("source") == "agent":
            break
        if step.get("text"):
            found.append([str(step.get("source") or "user"), _clip(str(step["text"]), MAX_FIELD)])
    return found


def _explanation(document: Mapping[str, Any] | None, artifacts: list[dict[str, Any]]) -> str:
    """What the grader said about its reward: its sample's ``extra_fields["explanation"]``,
    else the ``explanation`` of a ``rubric_judgement.json`` artifact."""
    extra = (document or {}).get("extra")
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    fields = osmosis.get("sample_extra_fields") if isinstance(osmosis, dict) else None
    said = fields.get(EXPLANATION_FIELD) if isinstance(fields, dict) else None
    if isinstance(said, str) and said.strip():
        return _clip(said, MAX_FIELD)
    for artifact in artifacts:
        if artifact["name"] == JUDGEMENT_ARTIFACT and isinstance(artifact.get("text"), str):
            try:
                verdict = json.loads(artifact["text"])
            except ValueError:
                return ""
            said = verdict.get(EXPLANATION_FIELD) if isinstance(verdict, dict) else None
            return _clip(said, MAX_FIELD) if isinstance(said, str) else ""
    return ""


def _cost(row: Mapping[str, Any], trajectory: Mapping[str, Any] | None) -> float | None:
    """US dollars: the journal row's ``cost_usd``, else the trajectory's total."""
    if isinstance(row.get(COST_KEY), float):
        return float(row[COST_KEY])
    total = ((trajectory or {}).get("final") or {}).get("total_cost_usd")
    return float(total) if isinstance(total, (int, float)) and total >= 0 else None


#: The role a metadata-mode row's input is shown with when no trajectory holds its question.
METADATA_ROLE = "metadata"


class DatasetInputs:
    """Each selected row's input and label, read from the run's dataset file.

    A row that failed before producing a sample has no trajectory, so its question is
    only in the dataset; the file is used only when its sha256 is the manifest's.
    """

    def __init__(self, run: Mapping[str, Any], hints: tuple[Path, ...] = ()) -> None:
        from pytest_osmosis.dataset import open_dataset

        self.path = find_dataset(run, hints)
        self.note = ""
        self._dataset: Any = None
        if self.path is None:
            self.note = (
                "the dataset file was not found (looked for the file whose sha256 the "
                "manifest records): inputs are taken from trajectories"
            )
            return
        inputs = run.get("manifest", {}).get("inputs", {})
        selector = (inputs.get("dataset") or {}).get("selected_source_rows")
        try:
            self._dataset = open_dataset(
                self.path, limit=None, rows=str(selector), sample=None, seed=0
            )
        except (OsmosisError, ValueError) as exc:
            self.note = f"{self.path}: cannot read the rows ({one_line(str(exc))})"
            self.path = None

    def row(self, row_index: int) -> tuple[list[list[str]], str | None] | None:
        """``([[role, text], ...], label)`` of a selected row, or None when unknown."""
        if self._dataset is None or not 0 <= row_index < len(self._dataset):
            return None
        row = self._dataset.row(row_index)
        messages = [
            [str(m.get("role", "user")), _clip(str(m.get("content", "")), MAX_FIELD)]
            for m in row.initial_messages
        ]
        if not messages and row.metadata:  # a metadata-mode row: its metadata is its input
            text = json.dumps(row.metadata, ensure_ascii=False, sort_keys=True)
            messages = [[METADATA_ROLE, _clip(text, MAX_FIELD)]]
        return messages, row.label


def build_rows(
    run: Mapping[str, Any],
    report_dir: Path,
    inputs: DatasetInputs | None = None,
    *,
    embed: bool = True,
) -> list[dict[str, Any]]:
    """One record per (row, attempt) in table order, with its detail embedded when it fits.

    Every record carries its input, label, final answer, the grader's explanation and
    cost (when known); trajectories and artifact texts are embedded within a budget
    (never when not *embed*: a comparison's baseline needs only its answers).
    """
    run_dir = Path(str(run["path"]))
    rows: list[dict[str, Any]] = run["rows"]
    errors = error_messages(
        run_dir, {r["rollout_id"] for r in rows if r["outcome"] == "failed" and "rollout_id" in r}
    )
    records: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        record: dict[str, Any] = {
            "i": i,
            "r": dataset_row(row),  # the dataset row, as node ids name it
            "n": row["run_index"],
            "outcome": row["outcome"],
            "status": row.get("status", ""),
        }
        for src, dst in (
            ("reward", "reward"),
            ("tokens", "tokens"),
            ("duration_ms", "dur"),
            ("error_type", "err"),
            ("rollout_id", "rid"),
        ):
            if src in row:
                record[dst] = row[src]
        if row.get("resumed"):
            record["resumed"] = True
        error = errors.get(str(row.get("rollout_id")))
        if error:
            record["msg"] = _clip(error["message"], 2000)
            if "detail" in error:
                record["tb"] = _clip(error["detail"], 8000)
        records.append(record)
    budget = EMBED_BUDGET if embed else -1
    for record in sorted(records, key=lambda r: (_PRIORITY.get(r["outcome"], 4), r["i"])):
        row = rows[record["i"]]
        document = read_trajectory(run_dir, row)
        if document is not None:
            record["traj_href"] = href(run_dir, str(document["_path"]), report_dir)
        detail: dict[str, Any] = {}
        if document is not None:
            detail["traj"] = simplify_trajectory(document)
        artifacts = []
        for artifact in list_artifacts(run_dir, row):
            item = {
                "name": artifact["name"],
                "size": artifact["size"],
                "href": href(run_dir, artifact["path"], report_dir),
            }
            if "text" in artifact:
                item["text"] = artifact["text"]
            if artifact.get("more"):
                item["more"] = True
            artifacts.append(item)
        if artifacts:
            detail["arts"] = artifacts
        traj = detail.get("traj")
        _describe(record, row, inputs, document, traj, artifacts)
        size = len(json.dumps(detail, ensure_ascii=False))
        if size > budget:
            record["omitted"] = True
            record["arts"] = [{k: v for k, v in a.items() if k != "text"} for a in artifacts]
        else:
            budget -= size
            record.update(detail)
        # What the search box matches besides the input, label, answer and explanation
        # (the page adds those from the record, so they are not embedded twice).
        record["q"] = " ".join(
            str(x)
            for x in (
                f"row {record['r']} run {record['n']}",
                OUTCOME_WORDS.get(record["outcome"], record["outcome"]),
                record.get("err", ""),
                record.get("rid", ""),
                record.get("msg", ""),
            )
        ).lower()
    return records


def share_inputs(*groups: list[dict[str, Any]]) -> list[list[str]]:
    """Move each record's ``in`` into one shared list of messages (the record keeps
    their indices, ``ii``).

    Every attempt of a row has the same input, and every row often the same long system
    prompt: kept once, a 10,000-row report does not carry it 10,000 times.
    """
    shared: list[list[str]] = []
    seen: dict[tuple[str, str], int] = {}
    for records in groups:
        for record in records:
            messages = record.pop("in", None)
            if not messages:
                continue
            indices = []
            for role, text in messages:
                if (role, text) not in seen:
                    seen[(role, text)] = len(shared)
                    shared.append([role, text])
                indices.append(seen[(role, text)])
            record["ii"] = indices
    return shared


def _describe(
    record: dict[str, Any],
    row: Mapping[str, Any],
    inputs: DatasetInputs | None,
    document: Mapping[str, Any] | None,
    traj: Mapping[str, Any] | None,
    artifacts: list[dict[str, Any]],
) -> None:
    """The record's input (``in``, from the dataset else the trajectory), label, answer,
    explanation and cost: small fields every record keeps, embedded or not."""
    known = inputs.row(int(row["row_index"])) if inputs is not None else None
    messages, label = known if known is not None else ([], None)
    if messages and messages[0][0] != METADATA_ROLE:
        record["in"], record["in_src"] = messages, "dataset"
    else:
        # A metadata-mode row's question is the one its workflow built (the trajectory's
        # first messages); without a trajectory, its metadata.
        asked = _trajectory_input(traj)
        record["in"] = asked or messages
        record["in_src"] = "trajectory" if asked else ("dataset" if messages else "")
    if label is None:
        label = (traj or {}).get("label")
    if isinstance(label, str) and label:
        record["lab"] = _clip(label, MAX_FIELD)
    answer = _final_answer(traj)
    if answer:
        record["ans"] = answer
    explanation = _explanation(document, artifacts)
    if explanation:
        record["expl"] = explanation
    cost = _cost(row, traj)
    if cost is not None:
        record["cost"] = cost


def input_text(record: Mapping[str, Any]) -> str:
    """The question of a record's input (``in``): its last user message, else its last."""
    messages = record.get("in") or []
    users = [text for role, text in messages if role == "user"]
    return users[-1] if users else (messages[-1][1] if messages else "")
