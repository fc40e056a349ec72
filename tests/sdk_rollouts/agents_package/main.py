"""times-agent: a package-style rollout whose workflow, tool and grader live in the
``times_agent`` package beside this file; ``main()`` serves the backend on the port
``osmosis eval run`` names. The OpenAI Agents integration it imports pulls in urllib3,
which binds ``::1`` port 0 when imported (its IPv6 probe)."""

from __future__ import annotations

import os

import uvicorn
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from times_agent.grading import ProductGrader
from times_agent.workflow import TimesConfig, TimesWorkflow


def main() -> None:
    backend = LocalBackend(
        workflow=TimesWorkflow,
        workflow_config=TimesConfig(name="times-agent"),
        grader=ProductGrader,
    )
    uvicorn.run(
        create_rollout_server(backend=backend),
        host="127.0.0.1",
        port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
    )


if __name__ == "__main__":
    main()
