"""What the report shows about each (row, attempt): a compact, JSON-able record.

Trajectories and small text artifacts are embedded so the report works as one file;
a size budget keeps a 10,000-row run's report openable (failures are embedded first,
the rest fall back to links into the run directory).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_osmosis.results.runs import dataset_row, error_messages, list_artifacts, read_trajectory
from pytest_osmosis.words import OUTCOME_WORDS

MAX_TEXT = 20_000
MAX_STEPS = 400
EMBED_BUDGET = 24 * 1024 * 1024
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
            return str(step["text"])[:500]
    return ""


def build_rows(run: Mapping[str, Any], report_dir: Path) -> list[dict[str, Any]]:
    """One record per (row, attempt) in table order, with its detail embedded when it fits."""
    run_dir = Path(str(run["path"]))
    rows: list[dict[str, Any]] = run["rows"]
    errors = error_messages(
        run_dir, {r["rollout_id"] for r in rows if r["outcome"] == "failed" and "rollout_id" in r}
    )
    costs = run.get("row_metrics", {}).get("cost_usd_by_rollout") or {}
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
        cost = costs.get(str(row.get("rollout_id")))
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            record["cost"] = cost  # dollars (osmosis_metrics.json), when the model has a price
        error = errors.get(str(row.get("rollout_id")))
        if error:
            record["msg"] = _clip(error["message"], 2000)
            if "detail" in error:
                record["tb"] = _clip(error["detail"], 8000)
        records.append(record)
    budget = EMBED_BUDGET
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
        cost = len(json.dumps(detail, ensure_ascii=False))
        if cost > budget:
            record["omitted"] = True
            record["arts"] = [{k: v for k, v in a.items() if k != "text"} for a in artifacts]
        else:
            budget -= cost
            record.update(detail)
        label = detail.get("traj", {}).get("label", "")
        record["q"] = " ".join(
            str(x)
            for x in (
                f"row {record['r']} run {record['n']}",
                OUTCOME_WORDS.get(record["outcome"], record["outcome"]),
                record.get("err", ""),
                record.get("rid", ""),
                record.get("msg", ""),
                label,
                _final_answer(detail.get("traj")),
            )
        ).lower()
    return records
