"""The ``privrec`` command.

Every subcommand lives in its own module under :mod:`privrec.commands` and
exposes ``register(subparsers)``; this file only wires them together, so
features can add commands without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# d≈25 linear algebra is faster single-threaded here (set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# Modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "privrec.commands.experiment",
    "privrec.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="privrec",
        description="Streaming contextual-bandit recommender with differential privacy.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ValueError as exc:  # bad parameters: one clear line, no traceback
        print(f"privrec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
