"""Shared pieces of the benchmarks: workspace generators, a timed subprocess runner, the
loopback model server, and the printed table.

Every benchmark builds its own workspaces in a temporary directory, runs the things it
compares one after the other in the same invocation, and prints the measured numbers
with the ratio against the target of ``../shared/design.md`` §3. Nothing here is imported
by the plugin or the test suite.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL_SERVER = REPO / "tests" / "model_server.py"
PYTHON = sys.executable

# LiteLLM must never reach the internet (its cost map would otherwise be fetched).
OFFLINE_ENV = {
    "LITELLM_OFFLINE_MODE": "true",
    "HF_HUB_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}

SERVES_ITSELF = """
# `osmosis eval run` executes the entrypoint as a script: the rollout serves itself.
if __name__ == "__main__":
    import uvicorn
    from osmosis_ai.rollout.server import create_rollout_server

    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")),
        log_level="warning",
    )
"""
"""The tail of a benchmark rollout (it needs `os` imported and a `backend`)."""

# The rollout every eval workspace uses. Its behaviour comes from the environment so one
# workspace serves the 200 ms run and the 0 ms run alike:
#   BENCH_MODE   sleep (default): await asyncio.sleep(BENCH_SLEEP); no model call
#                bridge: one POST through the bridge with one client shared by every
#                row (the way a rollout that cares about cost would write it)
#   BENCH_CLIENT httpx (default, httpx's default limits), aiohttp, httpx-per-call (a new
#                httpx client per call, the costly pattern) or bridge_client (the plugin's
#                ready client: the attempt's URL and bearer over one pool per process)
#   BENCH_SLEEP  seconds to await in sleep mode (0: an instant workflow)
#   BENCH_COUNT  if set, every workflow execution appends one byte to this file
#   BENCH_CALLS  model calls a row makes in bridge mode, one after the other (default 1):
#                k calls a row against 1 separates per-row cost from per-call cost
ROLLOUT = """
import asyncio
import os

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowConfig, AgentWorkflowOutput, Grader, LocalBackend,
    get_rollout_context,
)

MODE = os.environ.get("BENCH_MODE", "sleep")
SLEEP = float(os.environ.get("BENCH_SLEEP", "0"))
COUNT = os.environ.get("BENCH_COUNT")
CLIENT = os.environ.get("BENCH_CLIENT", "httpx")
CALLS = int(os.environ.get("BENCH_CALLS", "1"))
_client = None


async def _ask(prompt):
    global _client
    rollout = get_rollout_context()
    url = rollout.chat_completions_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {rollout.api_key}"}
    body = {"model": "bench", "messages": prompt}
    if CLIENT == "aiohttp":
        import aiohttp

        if _client is None:
            _client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with _client.post(url, headers=headers, json=body) as response:
            response.raise_for_status()
            answer = await response.json()
    elif CLIENT == "httpx-per-call":
        import httpx

        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(url, headers=headers, json=body)
            response.raise_for_status()
            answer = response.json()
    elif CLIENT == "bridge_client":
        from pytest_osmosis.rollout import bridge_client

        response = await bridge_client().post("chat/completions", json=body)
        response.raise_for_status()
        answer = response.json()
    else:
        import httpx

        if _client is None:
            # One client for the session: the plugin runs every workflow on one long-lived
            # loop. httpx's default limits on purpose: raising keep-alive to the concurrency
            # makes httpcore's pool scan cost ~13 ms CPU a call at 64 in flight (measured).
            _client = httpx.AsyncClient(timeout=60)
        response = await _client.post(url, headers=headers, json=body)
        response.raise_for_status()
        answer = response.json()
    return answer["choices"][0]["message"]["content"]


class BenchWorkflow(AgentWorkflow):
    async def run(self, ctx):
        if COUNT:
            with open(COUNT, "a") as fh:
                fh.write("x")
        if MODE == "bridge":
            for _ in range(CALLS):
                answer = await _ask(ctx.prompt)
        else:
            if SLEEP:
                await asyncio.sleep(SLEEP)
            answer = "ok"
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class BenchGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


# A workflow_config without max_concurrent advertises no in-flight cap, so batch_size
# decides the rows in flight (without one the SDK's rule caps them at 4, contract §5).
backend = LocalBackend(
    workflow=BenchWorkflow,
    grader=BenchGrader,
    workflow_config=AgentWorkflowConfig(name="bench"),
)

""" + SERVES_ITSELF

# `osmosis eval run`'s engine (LocalEvalRunner, osmosis-ai 0.3.8) driven offline in
# process, as tests/test_sdk_routes.py drives it: its LiteLLM bridge, its rollout server
# in a child process. One JSON argument: root, name (the rollout, dataset and config
# stem), model, batch_size, output (its output root) and run (the run name). Stages and
# notes go to stderr; "FIRST RESULT" to stdout when the first row completes; the last
# stdout line is {"succeeded", "failed", "total"}.
SDK_RUN = r"""
import asyncio, contextlib, json, sys
from pathlib import Path
from osmosis_ai.eval.local.dataset import resolve_explicit_dataset_file, select_rows
from osmosis_ai.eval.local.runner import EvalRunSpec, LocalEvalOptions, LocalEvalRunner

args = json.loads(sys.argv[1])
root, name = Path(args["root"]), args["name"]
seen = []


class Hooks:
    def note(self, message): print("note:", message, file=sys.stderr, flush=True)
    def warning(self, message): print("warning:", message, file=sys.stderr, flush=True)
    def stage(self, message): print("stage:", message, file=sys.stderr, flush=True)
    def status(self, message): return contextlib.nullcontext()
    async def confirm_dispatch(self, *, pending, model_path): return None
    async def confirm_new_run(self, *, run_name, total): return False
    def resolve_secrets(self, names): return {}
    def progress(self, snapshot):
        if snapshot.completed and not seen:
            seen.append(1)
            print("FIRST RESULT", flush=True)


dataset = resolve_explicit_dataset_file(root / "data" / f"{name}.jsonl")
spec = {"batch_size": args["batch_size"]} if args.get("batch_size") else {}
runner = LocalEvalRunner(
    spec=EvalRunSpec(rollout_name=name, entrypoint="main.py", model_path=args["model"],
                     dataset_name=name, **spec),
    options=LocalEvalOptions(name=args["run"], server_interpreter=sys.executable),
    dataset=dataset,
    selection=select_rows(dataset.path, extension=dataset.extension),
    rollout_dir=root / "rollouts" / name,
    output_root=Path(args["output"]),
    hooks=Hooks(),
)
summary = asyncio.run(runner.run())
print(json.dumps({"succeeded": summary.succeeded, "failed": summary.failed,
                  "total": summary.total_work_items}), flush=True)
"""


def eval_workspace(
    root: Path, rows: int, *, batch_size: int = 64, name: str = "bench", row_bytes: int = 0
) -> Path:
    """An Osmosis eval workspace with ``rows`` rows; returns its root.

    ``row_bytes`` pads each prompt so rows have roughly that size on disk (0: ~60 bytes).
    """
    (root / "configs" / "eval").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    (root / "rollouts" / name).mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "configs" / "eval" / f"{name}.toml").write_text(
        "[experiment]\n"
        f'rollout = "{name}"\n'
        'entrypoint = "main.py"\n'
        'model_path = "openai/bench"\n'
        f'dataset = "{name}"\n'
        "[evaluation]\n"
        f"batch_size = {batch_size}\n"
        "pass_threshold = 1.0\n"
        "[secrets]\n"
        "required = []\n"
    )
    with open(root / "data" / f"{name}.jsonl", "w", encoding="utf-8") as fh:
        for i in range(rows):
            row = {"user_prompt": f"What is {i} + 1?", "ground_truth": str(i + 1)}
            if row_bytes:
                pad = row_bytes - len(json.dumps(row)) - 20
                if pad > 0:
                    row["user_prompt"] += " " + "x" * pad
            fh.write(json.dumps(row) + "\n")
    (root / "rollouts" / name / "main.py").write_text(ROLLOUT)
    return root


def plain_suite(root: Path, tests: int, *, sleep: float = 0.0) -> Path:
    """A plain pytest suite: ``tests`` parametrized tests, each sleeping ``sleep`` s."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    body = f"time.sleep({sleep})" if sleep else "pass"
    (root / "test_plain.py").write_text(
        "import time\n\nimport pytest\n\n\n"
        f"@pytest.mark.parametrize('i', range({tests}))\n"
        f"def test_item(i):\n    {body}\n"
    )
    return root


@dataclass
class Run:
    """One measured subprocess."""

    label: str
    cmd: list[str]
    wall: float
    cpu: float  # user + system seconds of the process and every child it waited for
    rc: int
    stdout: str
    stderr: str
    maxrss_mb: float | None = None

    @property
    def pytest_seconds(self) -> float | None:
        """pytest's own "in X s" (session start to end; no interpreter or plugin start-up)."""
        found = re.findall(r" in (\d+(?:\.\d+)?)s", self.stdout)
        return float(found[-1]) if found else None

    def summary_line(self) -> str:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        for line in reversed(lines):
            if re.search(r"\b(passed|failed|error|no tests ran|deselected|collected)\b", line):
                return line.strip("= ")
        return lines[-1] if lines else ""

    def check(self, expect: str | None = None) -> Run:
        """Fail loudly when the run did not do what the benchmark measures."""
        ok = self.rc == 0 and (expect is None or expect in self.stdout)
        if not ok:
            tail = "\n".join((self.stdout + "\n" + self.stderr).splitlines()[-30:])
            raise SystemExit(
                f"benchmark run {self.label!r} failed (rc {self.rc}, expected {expect!r}):\n"
                f"$ {' '.join(self.cmd)}\n{tail}"
            )
        return self


def measured_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measured command: offline, with ``env`` on top.

    Dropped: PYTEST_ADDOPTS and PYTEST_PLUGINS (ours alone decide the command line);
    PYTHONPATH, unless it is exactly this repository (a worktree measures its own plugin
    source); PYTHONDONTWRITEBYTECODE: a user's Python caches bytecode, so compiling the
    plugin's source again at every start (~0.2 s of CPU) is not what a user waits for.
    """
    full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        full_env.pop(name, None)
    if os.environ.get("PYTHONPATH") == str(REPO):
        full_env["PYTHONPATH"] = str(REPO)
    return full_env


def run(
    label: str,
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    rss: bool = False,
    timeout: float = 600,
) -> Run:
    """Run ``cmd`` to completion; wall time from spawn to exit, CPU from RUSAGE_CHILDREN.

    With ``rss`` the command runs under ``/usr/bin/time -f %M`` so its own peak RSS is
    reported (RUSAGE_CHILDREN's ru_maxrss is the largest child ever, not a delta).
    """
    full_env = measured_env(env)
    argv = list(cmd)
    rss_file = None
    if rss:
        rss_file = tempfile.NamedTemporaryFile(prefix="bench-rss-", delete=False)
        rss_file.close()
        argv = ["/usr/bin/time", "-f", "%M", "-o", rss_file.name, *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    maxrss = None
    if rss_file is not None:
        text = Path(rss_file.name).read_text().strip().splitlines()
        os.unlink(rss_file.name)
        maxrss = int(text[-1]) / 1024 if text and text[-1].isdigit() else None
    return Run(label, list(cmd), wall, cpu, proc.returncode, proc.stdout, proc.stderr, maxrss)


def pytest_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", *args]


def osmosis_cmd(*args: str, output: Path | None = None) -> list[str]:
    extra = ["--osmosis-output", str(output)] if output is not None else []
    return pytest_cmd("--osmosis-eval", "-q", *extra, *args)


def sdk_installed() -> bool:
    """Whether ``osmosis eval run`` can run here: the SDK side runs under the same
    interpreter as ours, so each configuration (with, without the SDK) measures itself."""
    return all(importlib.util.find_spec(name) is not None for name in ("osmosis_ai", "uvicorn"))


def sdk_cmd(
    root: Path,
    *,
    output: Path,
    batch_size: int,
    name: str = "bench",
    model: str = "openai/bench",
    run_name: str = "sdk",
) -> list[str]:
    """``osmosis eval run`` over the workspace at ``root`` (see ``SDK_RUN``)."""
    args = {
        "root": str(root),
        "name": name,
        "model": model,
        "batch_size": batch_size,
        "output": str(output),
        "run": run_name,
    }
    return [PYTHON, "-c", SDK_RUN, json.dumps(args)]


def sdk_result(r: Run) -> dict[str, int]:
    """The counts the SDK run printed last (empty when it printed none)."""
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def sdk_run(
    label: str, root: Path, *, output: Path, batch_size: int, env: dict[str, str], rows: int
) -> Run:
    """One measured ``osmosis eval run`` that must finish every row successfully."""
    r = run(label, sdk_cmd(root, output=output, batch_size=batch_size), cwd=root, env=env)
    counts = sdk_result(r)
    if r.rc != 0 or counts.get("succeeded") != rows:
        tail = "\n".join((r.stdout + "\n" + r.stderr).splitlines()[-30:])
        raise SystemExit(f"SDK run {label!r} failed (rc {r.rc}, {counts}):\n{tail}")
    return r


def metrics_of(output: Path) -> dict[str, Any]:
    """metrics.json of the single run directory under ``output``."""
    runs = [p for p in output.iterdir() if not p.name.startswith(".")]
    if len(runs) != 1:
        raise SystemExit(f"expected one run directory under {output}, found {runs}")
    return dict(json.loads((runs[0] / "metrics.json").read_text()))


def duration_s(metrics: dict[str, Any]) -> float | None:
    """metrics.json duration (this invocation, from pytest_sessionstart to finalize)."""
    for where in (metrics.get("eval_run", {}), metrics, metrics.get("summary", {})):
        if isinstance(where, dict) and isinstance(where.get("duration_ms"), (int, float)):
            return float(where["duration_ms"]) / 1000.0
    return None


@contextlib.contextmanager
def model_server(delay: float, *, tls: bool = False) -> Iterator[dict[str, str]]:
    """Start ``tests/model_server.py`` as its own process; yields the env that points at it.

    It is a separate process so its CPU never lands in a measured run's RUSAGE_CHILDREN
    delta (it is only reaped after every measurement). ``tls`` serves https with a
    certificate made here for 127.0.0.1 (openssl, self-signed): a provider's honest
    stand-in (a TLS handshake, encrypted bytes), which clients trust through
    ``SSL_CERT_FILE`` (httpx and LiteLLM read it), verification left on.
    """
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as name:
        argv = [PYTHON, str(MODEL_SERVER), "--port", "0", "--delay", str(delay)]
        trust: dict[str, str] = {}
        if tls:
            cert, key = self_signed_certificate(Path(name))
            argv += ["--tls", str(cert), str(key)]
            trust = {"SSL_CERT_FILE": str(cert)}
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("https://" if tls else "http://"):
                raise SystemExit(f"model server did not start (said {url!r})")
            yield {
                "OPENAI_API_BASE": url,
                "OPENAI_BASE_URL": url,
                "OPENAI_API_KEY": "sk-bench-model-server",
                **trust,
            }
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def self_signed_certificate(where: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, made now (no key is kept in the repository)."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@contextlib.contextmanager
def tempdir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        yield Path(name)


def plugin_version() -> str:
    """The commit the plugin source is at (``+dirty`` when pytest_osmosis/ has changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "pytest_osmosis"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head or 'unknown'}{'+dirty' if dirty else ''}"


def header(title: str) -> None:
    print(f"{title}: plugin {plugin_version()}, Python {sys.version.split()[0]}, {loadavg()}")


def loadavg() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} (1/5 min), {os.cpu_count()} cpus"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


@dataclass
class Sdk:
    """The SDK's side of a check: ``osmosis eval run`` on the same workload.

    ``ratio`` is ours / the SDK's on the quantity ``of`` names (below 1: ours is smaller,
    which for a time or a cost means faster or cheaper). ``na`` is one word saying why a
    check has no SDK side.
    """

    figure: str = ""
    ratio: float | None = None
    of: str = ""
    na: str | None = None

    def cell(self) -> str:
        """The table's SDK column."""
        if self.na is not None:
            return f"n/a ({self.na})"
        if self.ratio is None:
            return "-"
        return f"{self.ratio:.2f}x {self.of}"


def versus_sdk(figure: str, ours: float, theirs: float, of: str) -> Sdk:
    return Sdk(figure=figure, ratio=ours / theirs if theirs else None, of=of)


def no_sdk(word: str) -> Sdk:
    """A check without an SDK side; ``word`` says why (``pytest-only``, ``no-cache``)."""
    return Sdk(na=word)


def sdk_absent() -> Sdk:
    """A check whose SDK side did not run: osmosis-ai is not installed, or --no-sdk."""
    return Sdk(na="skipped" if sdk_installed() else "not-installed")


@dataclass
class Check:
    """One target: the measured value, the limit, and the ratio that is compared."""

    name: str
    measured: str
    target: str
    ratio: float
    limit: float
    higher_is_better: bool = False
    notes: list[str] = field(default_factory=list)
    sdk: Sdk | None = None

    @property
    def ok(self) -> bool:
        return self.ratio >= self.limit if self.higher_is_better else self.ratio <= self.limit


def print_runs(runs: Sequence[Run]) -> None:
    print(f"{'run':44} {'wall s':>8} {'cpu s':>8} {'pytest s':>9}  summary")
    for r in runs:
        ps = r.pytest_seconds
        pst = f"{ps:9.2f}" if ps is not None else f"{'-':>9}"
        print(f"{r.label[:44]:44} {r.wall:8.2f} {r.cpu:8.2f} {pst}  {r.summary_line()[:60]}")


def print_checks(title: str, checks: Sequence[Check]) -> None:
    print(f"\n== {title} ==")
    for c in checks:
        sign = ">=" if c.higher_is_better else "<="
        verdict = "MET" if c.ok else "MISSED"
        print(f"{c.name}: {c.measured}")
        print(f"    ratio {c.ratio:.3f} (target {sign} {c.limit:g}: {c.target}) -> {verdict}")
        if c.sdk is not None:
            print(f"    SDK: {c.sdk.cell()}" + (f": {c.sdk.figure}" if c.sdk.figure else ""))
        for note in c.notes:
            print(f"    {note}")


def as_json(checks: Sequence[Check]) -> list[dict[str, Any]]:
    return [
        {
            "name": c.name,
            "measured": c.measured,
            "target": c.target,
            "ratio": c.ratio,
            "limit": c.limit,
            "higher_is_better": c.higher_is_better,
            "ok": c.ok,
            "notes": c.notes,
            "sdk": None if c.sdk is None else dataclasses.asdict(c.sdk),
        }
        for c in checks
    ]


def finish(title: str, checks: Sequence[Check], json_path: str | None) -> None:
    print_checks(title, checks)
    if json_path:
        Path(json_path).write_text(json.dumps(as_json(checks), indent=2))
