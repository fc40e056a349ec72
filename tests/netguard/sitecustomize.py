"""Installs the loopback-only network guard in every Python subprocess of the test run.

tests/conftest.py puts this directory on PYTHONPATH; Python imports `sitecustomize`
at start-up. It shadows any other sitecustomize on the path (the project's venvs
have none).
"""

import os

import osmosis_netguard

osmosis_netguard.install(os.environ.get(osmosis_netguard.LOG_ENV))
