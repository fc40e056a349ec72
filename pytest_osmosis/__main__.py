"""``python -m pytest_osmosis``: the ``pytest-osmosis`` command without the console script."""

from __future__ import annotations

import sys

from pytest_osmosis.cli import main

if __name__ == "__main__":
    sys.exit(main())
