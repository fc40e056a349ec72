"""The report's HTML comes from Jinja2 templates (``report/templates/``), autoescaped.

Every value a template prints is escaped unless it is ``Markup`` (the CSS, an SVG chart,
a fragment built by another template), so no page builds HTML from strings by hand.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

__all__ = ["Markup", "render"]


@cache
def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("pytest_osmosis.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,  # a name the caller forgot is an error, not ""
    )


def render(template: str, **context: Any) -> str:
    """``templates/<template>`` filled with *context*."""
    return _environment().get_template(template).render(**context)
