"""The ``pytest-osmosis`` subcommands that ``cli.EXTENSIONS`` adds: ``cache`` and the CI ones.

Each module exposes ``add_<name>_parser(subparsers)``; ``cli.py`` owns the top-level parser.
"""
