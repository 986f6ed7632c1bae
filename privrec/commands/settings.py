"""``privrec settings``: the table of every setting, and the files generated from their declarations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: The repository this command belongs to (the generated files' root by default).
REPO = Path(__file__).resolve().parents[2]


def register(sub: Any) -> None:
    p = sub.add_parser("settings", help="print the table of every setting; --check / --write its generated files",
                       description="Every setting is declared once (pipeline/config/settings.py). Without flags, "
                                   "print the table of them (docs/settings.md). --check lists the generated files "
                                   "(deploy/privrec.env.example, deploy/k8s/configmap.yaml, docs/settings.md) that "
                                   "differ from the declarations and exits 1 if any does; --write rewrites them.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    what.add_argument("--write", action="store_true", help="rewrite the generated files that are out of date")
    p.add_argument("--root", type=Path, default=REPO, help="the repository holding the files (default: this one)")
    p.set_defaults(func=_settings)


def _settings(args: argparse.Namespace) -> int:
    from privrec.ops import settings_files

    if args.write:
        for rel in settings_files.write(args.root):
            print(f"privrec settings: wrote {rel}")
        return 0
    if args.check:
        old = settings_files.stale(args.root)
        for rel in old:
            print(f"privrec settings: {rel} is out of date (run privrec settings --write)", file=sys.stderr)
        return 1 if old else 0
    print(settings_files.settings_table(), end="")
    return 0
