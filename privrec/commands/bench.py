"""``privrec bench``: speed measurements that print numbers and write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark; print numbers and write JSON")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    _register_core(bsub)
    # every other module of privrec.bench with a `register(bsub)` adds its own benchmark
    import importlib
    import pkgutil

    import privrec.bench as pkg

    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
        if hasattr(mod, "register"):
            mod.register(bsub)


def _register_core(bsub: Any) -> None:
    c = bsub.add_parser("core", help="in-process speed of one decide+update (d=25, 10 users)",
                        description="Time select+update of LinUCB, CoLin, GOB.Lin and their DP variants "
                                    "in-process; writes core.json to --out.")
    c.add_argument("--out", type=Path, required=True, help="output directory")
    c.add_argument("--steps", type=int, default=5000, help="timed steps per algorithm (default 5000)")
    c.add_argument("--d", type=int, default=25, help="context dimension (default 25)")
    c.add_argument("--users", type=int, default=10, help="number of users N (default 10)")
    c.set_defaults(func=_core)


def _core(args: argparse.Namespace) -> int:
    from privrec.bench.core import bench_core

    if args.steps < 100:
        raise ValueError(f"`--steps` must be at least 100, got {args.steps}.")
    doc = bench_core(steps=args.steps, d=args.d, n_users=args.users)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "core.json").write_text(json.dumps(doc, indent=2) + "\n")
    for k, v in doc.items():
        if k.endswith("_us") and isinstance(v, float):
            print(f"{k:>16}: {v:9.1f} µs per decide+update")
    if "speedup_vs_mabwiser_linucb" in doc:
        per_repeat = ", ".join(f"{r:.1f}" for r in doc["speedup_vs_mabwiser_linucb_by_repeat"])
        print(f"LinUCB vs MABWiser's LinUCB: {doc['speedup_vs_mabwiser_linucb']:.1f}x (by repeat: {per_repeat}; "
              f"target >= 50x)")
    print(f"machine yardstick: sum(range(1000)) takes {doc['machine']['python_speed_us']:.1f} µs here "
          f"(wall-clock numbers scale with it)")
    print(f"wrote {args.out}/core.json", file=sys.stderr)
    return 0
