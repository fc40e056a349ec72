"""tool-calc: workflow and grader live in the `my_rollout` package beside this file.

The backend names them with dotted "module:attr" strings, the way a rollout keeps
main.py to the server wiring only.
"""

from __future__ import annotations

import os

import uvicorn
from my_rollout import ROLLOUT_NAME
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


def main() -> None:
    backend = LocalBackend(
        workflow="my_rollout.workflow:ToolCalcWorkflow",
        workflow_config="my_rollout.config:workflow_config",
        grader="my_rollout.grading:ToolCalcGrader",
        grader_config="my_rollout.config:grader_config",
    )
    app = create_rollout_server(backend=backend)
    print(f"serving {ROLLOUT_NAME}")
    uvicorn.run(app, host="0.0.0.0", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))


if __name__ == "__main__":
    main()
