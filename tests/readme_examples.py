"""The README's ``Extending`` examples, as printed: the tests run them (test_gate.py,
test_dataset_session.py), so the examples cannot drift from what works."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(index: int) -> str:
    """The *index*-th python block of ``## Extending: gate rules and dataset formats``."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Extending: gate rules and dataset formats\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks: list[str] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return blocks[index]
