"""The ``privrec`` command.

Every subcommand lives in its own module under :mod:`privrec.commands` and
exposes ``register(subparsers)``; this file discovers and wires them, so
features add commands without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

# d≈25 linear algebra is faster single-threaded here (set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def command_modules() -> list[str]:
    """Every module of :mod:`privrec.commands`, in name order."""
    import privrec.commands as pkg

    return [f"{pkg.__name__}.{m.name}" for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="privrec",
        description="Streaming contextual-bandit recommender with differential privacy.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in command_modules():
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
