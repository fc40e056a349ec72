"""A plan's work keys, made when asked (issue 30 item 5: a list of them was ~0.1 KB a row)."""

from __future__ import annotations

import pytest

from pytest_osmosis.workspace.plan import AllKeys


@pytest.mark.parametrize(("rows", "n"), [(0, 1), (1, 1), (5, 1), (4, 3), (7, 2)])
def test_all_keys_are_the_list_they_replace(rows: int, n: int) -> None:
    expected = [(r, i) for r in range(rows) for i in range(n)]
    keys = AllKeys(rows, n)
    assert list(keys) == expected
    assert len(keys) == len(expected)
    assert [keys[i] for i in range(len(keys))] == expected
    assert [keys[-i] for i in range(1, len(keys) + 1)] == [expected[-i] for i in range(1, len(expected) + 1)]
    assert keys[1:4] == expected[1:4]
    assert keys[::-2] == expected[::-2]
    assert list(reversed(keys)) == expected[::-1]
    for key in expected:
        assert key in keys
        assert keys.index(key) == expected.index(key)
    for outside in [(rows, 0), (0, n), (-1, 0), (0, -1), (0,), "0", (0.0, 0), None]:
        assert outside not in keys
    for index in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            keys[index]
