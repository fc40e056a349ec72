"""pytest-osmosis: run an Osmosis evaluation workspace as a pytest session.

``contract §x.y`` in a comment refers to section x.y of docs/contract.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

import json as _json

#: ``json.dumps``/``json.loads`` as the plugin found them, before any rollout is imported
#: (results/stdjson.py: what the run directory is written and read with).
_JSON_AT_START = (_json.dumps, _json.loads)
