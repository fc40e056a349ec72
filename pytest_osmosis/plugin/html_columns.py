"""pytest-html: a reward column in its results table (registered only when it is installed).

pytest-html's public hooks add a header cell and one cell per report row; the reward
comes from the result the row's report carries (``report.osmosis``, also under xdist), so
the column says what the journal says. Reports of other tests, and the phases of an eval
item that carry no result, get an empty cell.
"""

from __future__ import annotations

from html import escape
from typing import Any

import pytest


class HtmlHooks:
    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.insert(2, '<th class="sortable" data-column-type="reward">Reward</th>')

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        cells.insert(2, f'<td class="col-reward">{escape(reward_cell(report))}</td>')


def reward_cell(report: Any) -> str:
    """The reward to two places; the error type for an errored row; else nothing."""
    result = getattr(report, "osmosis", None)
    if not isinstance(result, dict):
        return ""
    reward = result.get("reward")
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        return f"{reward:.2f}"
    return str(result.get("error_type") or "")
