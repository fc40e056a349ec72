"""pytest-osmosis: run an Osmosis evaluation workspace as a pytest session.

``contract §x.y`` in a comment refers to section x.y of docs/contract.md.
"""

from __future__ import annotations

__version__ = "0.1.0"
