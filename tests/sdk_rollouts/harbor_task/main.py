"""harbor-task: each row is one Harbor trial of the task template in ``tasks/``. Harbor's
own ``oracle`` agent runs the task's ``solution/solve.sh`` in the task's Docker sandbox
and the task's ``tests/test.sh`` writes the reward. Without a Docker daemon every trial
fails before the agent runs, as it does under ``osmosis eval run``."""

from __future__ import annotations

import os
from pathlib import Path

import uvicorn
from harbor.trial.queue import TrialQueue
from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.server import create_rollout_server

TASKS = Path(__file__).resolve().parent / "tasks"


def main() -> None:
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=1), tasks_dir=TASKS, agent="oracle"
    )
    app = create_rollout_server(backend=backend)
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))


if __name__ == "__main__":
    main()
