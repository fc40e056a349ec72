"""The README tells the truth: its rollout guide runs, its outcome table names every error.

The "Writing a rollout" section marks each file it shows with ``<!-- readme-file: PATH -->``
on the line before the fence; the files are written into a workspace exactly as printed and
run against the loopback model server. The ``error_type`` table is compared with the
``error_type`` strings the package's own source produces.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import workspaces  # noqa: F401 - imports LiteLLM once, before in-process runs
from model_server import ModelServer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE = ROOT / "pytest_osmosis"

_Function = ast.FunctionDef | ast.AsyncFunctionDef
_MARKED = re.compile(r"<!-- readme-file: (\S+) -->\n```(\w*)\n(.*?)\n```\n", re.DOTALL)


def _section(heading: str) -> str:
    """The README's ``## heading`` section, up to the next ``## `` heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _guide_files() -> dict[str, tuple[str, str]]:
    """``{path: (fence language, content)}`` of the files the rollout guide shows."""
    return {
        m.group(1): (m.group(2), m.group(3) + "\n")
        for m in _MARKED.finditer(_section("Writing a rollout"))
    }


def test_every_python_block_of_the_guide_is_a_marked_file() -> None:
    """An unmarked example would never be run, so it could drift without anyone noticing."""
    section = _section("Writing a rollout")
    marked = [lang for lang, _ in _guide_files().values() if lang == "python"]
    assert len(marked) == section.count("```python") >= 2


def test_the_rollout_guide_runs_as_printed(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    files = _guide_files()
    assert {
        "pytest.ini",
        "data/arith.jsonl",
        "configs/eval/arith.toml",
        "rollouts/arith/main.py",
        "rollouts/arith-openai/main.py",
    } <= set(files)
    for path, (_, content) in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    # What the guide says to do for its second rollout: copy the config, set `rollout`.
    config = files["configs/eval/arith.toml"][1]
    second, count = re.subn(r'^rollout = "arith"', 'rollout = "arith-openai"', config, flags=re.M)
    assert count == 1
    (pytester.path / "configs/eval/arith-openai.toml").write_text(second, encoding="utf-8")

    # Plain `pytest`, as the layout says: the guide's pytest.ini enables the plugin.
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=6, skipped=2)
    for name in ("arith", "arith-openai"):
        result.stdout.fnmatch_lines([f"configs/eval/{name}.toml::row_3_run_0 SKIPPED*"])
    runs = {
        json.loads((p / "manifest.json").read_text())["inputs"]["rollout"]["name"]: p
        for p in (pytester.path / ".osmosis" / "evals").iterdir()
        if not p.name.startswith(".")
    }
    # Each rollout's own code ran: the httpx one writes reply.json, the openai one verdict.txt.
    assert (runs["arith"] / "artifacts" / "row_0_run_0" / "reply.json").is_file()
    assert (runs["arith-openai"] / "artifacts" / "row_0_run_0" / "verdict.txt").is_file()
    assert model_env.requests_total >= 8  # the model answered every attempt


# ------------------------------------------------------------------ error types


def _modules() -> Iterator[ast.Module]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield ast.parse(path.read_text(encoding="utf-8"), str(path))


def _strings(node: ast.expr, functions: dict[str, _Function], calls: list[ast.Call]) -> set[str]:
    """The values an ``error_type`` expression can take, read from the source.

    A constant is itself; a call to a package function is each constant it returns; an
    f-string over a parameter expands with the constants that parameter is called with.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
        returns = [
            n.value
            for n in ast.walk(functions[node.func.id])
            if isinstance(n, ast.Return) and n.value
        ]
        return set().union(*(_strings(r, functions, calls) for r in returns))
    if isinstance(node, ast.JoinedStr):
        values = [""]
        for part in node.values:
            if isinstance(part, ast.Constant):
                values = [v + str(part.value) for v in values]
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
                options = _argument_values(part.value.id, node, functions, calls)
                values = [v + o for v in values for o in options]
        return set(values)
    return set()


def _argument_values(
    param: str, where: ast.AST, functions: dict[str, _Function], calls: list[ast.Call]
) -> set[str]:
    """Constants passed for ``param`` of the function whose body holds ``where``."""
    for name, function in functions.items():
        if any(n is where for n in ast.walk(function)):
            params = [a.arg for a in function.args.args]
            if param not in params:
                continue
            index = params.index(param)
            found: set[str] = set()
            for call in calls:
                if isinstance(call.func, ast.Name) and call.func.id == name:
                    args = call.args[index : index + 1] + [
                        k.value for k in call.keywords if k.arg == param
                    ]
                    found |= {
                        a.value
                        for a in args
                        if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    }
            return found
    return set()


def produced_error_types() -> set[str]:
    """Every ``error_type`` the package writes: ``"error_type": ...`` in a result dict, the
    ``error_type`` argument of a class constructed with one (``_PhaseFailed``), the
    ``error_type=`` keyword of a result builder (``outcome.failure``), or an exception
    class's ``error_type = "..."`` (``model/cache.py::CacheMiss``)."""
    trees = list(_modules())
    functions: dict[str, _Function] = {}
    calls: list[ast.Call] = []
    carriers: dict[str, int] = {}  # class name -> position of its error_type argument
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, node)
                params = [a.arg for a in node.args.args]
                if "error_type" in params and params[:1] != ["self"]:
                    carriers[node.name] = params.index("error_type")  # faults._item_failure
            elif isinstance(node, ast.Call):
                calls.append(node)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        params = [a.arg for a in item.args.args][1:]
                        if "error_type" in params:
                            carriers[node.name] = params.index("error_type")
                    elif (
                        isinstance(item, ast.Assign)
                        and [getattr(t, "id", None) for t in item.targets] == ["error_type"]
                        and isinstance(item.value, ast.Constant)
                    ):
                        found.add(str(item.value.value))
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "error_type":
                        found |= _strings(value, functions, calls)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in carriers
            ):
                args = node.args[carriers[node.func.id] : carriers[node.func.id] + 1]
                args += [k.value for k in node.keywords if k.arg == "error_type"]
                for arg in args:
                    found |= _strings(arg, functions, calls)
            elif isinstance(node, ast.Call):  # a builder's keyword (outcome.failure, RowResult)
                for k in node.keywords:
                    if k.arg == "error_type":
                        found |= _strings(k.value, functions, calls)
    return found


def documented_error_types() -> set[str]:
    """The first column of the README's ``| `error_type` | ... |`` table."""
    lines = _section("Outcomes").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("| `error_type` |"))
    except StopIteration:
        return set()
    names = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1].strip()
        names.add(cell.strip("`"))
    return names


def test_the_source_scan_finds_the_error_types_we_know() -> None:
    """Guards the scan itself: f-strings over a phase name and the categorizer included."""
    produced = produced_error_types()
    assert {
        "agent_error",
        "validation_error",
        "timeout",
        "workflow_timeout",
        "grader_timeout",
        "worker_crashed",
    } <= produced, produced


def test_the_outcome_table_lists_every_error_type_we_produce() -> None:
    produced, documented = produced_error_types(), documented_error_types()
    assert not produced - documented, (
        f"missing from README's error_type table: {sorted(produced - documented)}"
    )
    assert not documented - produced, (
        f"README lists error types nothing produces: {sorted(documented - produced)}"
    )
