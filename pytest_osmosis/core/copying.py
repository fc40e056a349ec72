"""One deep copy for the per-row values a rollout receives (prompt, metadata, messages).

``copy.deepcopy`` walks every value through its memo and dispatch tables: for the small
JSON-shaped values of a row that is most of the cost of copying them, once per row and
phase. Dicts with string keys, lists, strings, numbers, booleans and None are copied
directly here; anything else (a pydantic model, a tuple, a custom object) goes to
``copy.deepcopy``, so the result is the same as deepcopy's for every value, except that
an object referenced twice inside one JSON-shaped value is copied twice (rows parsed from
a dataset never share one).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

T = TypeVar("T")

_ATOMS = (str, int, float, bool, type(None))


def deep_copy(value: T) -> T:
    """A deep copy of ``value`` (see the module docstring)."""
    return _copy(value)  # type: ignore[no-any-return]


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        copied = {}
        for key, item in value.items():
            if type(key) is not str:
                return copy.deepcopy(value)
            copied[key] = _copy(item)
        return copied
    if kind is list:
        return [_copy(item) for item in value]
    return copy.deepcopy(value)
