"""Which frames of a row's traceback the rollout's author is shown (runner._rollout_frames)."""

import sysconfig
import traceback

from pytest_osmosis.execution.runner import _PACKAGE_DIR, _rollout_frames

API = (_PACKAGE_DIR,)
RUNNER = f"{_PACKAGE_DIR}/execution/runner.py"
ROLLOUT = "/ws/rollouts/calc/main.py"
LIBRARY = f"{sysconfig.get_path('purelib')}/pydantic/main.py"
STDLIB = f"{sysconfig.get_path('stdlib')}/asyncio/tasks.py"


def _stack(*files: str) -> traceback.StackSummary:
    return traceback.StackSummary.from_list([(f, n, f"f{n}", None) for n, f in enumerate(files)])


def _shown(*files: str) -> list[tuple[str, int]]:
    return [(f.filename, f.lineno or 0) for f in _rollout_frames(_stack(*files), API)]


def test_below_the_rollouts_call_into_the_api_nothing_is_shown() -> None:
    shown = _shown(STDLIB, RUNNER, ROLLOUT, f"{_PACKAGE_DIR}/rollout.py", LIBRARY, STDLIB)
    assert shown == [(STDLIB, 0), (ROLLOUT, 2)]


def test_code_the_api_calls_back_keeps_its_frames() -> None:
    """A hook the API calls (a base class's method calling the author's override) is the
    author's: its frames stay, the API's own between them do not."""
    tool = "/ws/rollouts/calc/tools.py"
    shown = _shown(RUNNER, ROLLOUT, f"{_PACKAGE_DIR}/rollout.py", tool, LIBRARY)
    assert shown == [(ROLLOUT, 1), (tool, 3), (LIBRARY, 4)]


def test_a_rollout_installed_in_place_is_the_authors() -> None:
    editable = "/home/me/src/wordcount/wordcount/count.py"
    assert _shown(RUNNER, ROLLOUT, editable) == [(ROLLOUT, 1), (editable, 2)]
