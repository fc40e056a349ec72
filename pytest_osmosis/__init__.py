"""pytest-osmosis: run an Osmosis evaluation workspace as a pytest session."""

from __future__ import annotations

__version__ = "0.1.0"
