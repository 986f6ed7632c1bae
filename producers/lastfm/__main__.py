"""``python -m producers.lastfm build|compare [--data-dir D] [--seed S] [--positives P]``.

``build`` builds (or loads) the catalog and prints its manifest as JSON;
``compare`` also prints :func:`compare_with_authors_sample` as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from producers.lastfm.catalog import load_catalog
from producers.lastfm.compare import compare_with_authors_sample


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m producers.lastfm", description=__doc__)
    parser.add_argument("command", choices=["build", "compare"])
    parser.add_argument(
        "--data-dir", default=None, help="HetRec folder (default: $PRIVREC_DATA_DIR or ../shared/data/lastfm-2k)"
    )
    parser.add_argument(
        "--cache-dir", default=None, help="cache root (default: $PRIVREC_CACHE_DIR or ~/.cache/privrec/lastfm)"
    )
    parser.add_argument("--no-cache", action="store_true", help="build in memory, ignore the cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--positives", choices=["tagged", "listened"], default="tagged")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    catalog = load_catalog(
        args.data_dir, seed=args.seed, positives=args.positives, cache_dir=args.cache_dir, use_cache=not args.no_cache
    )
    out = dict(catalog.info)
    out["load_seconds"] = round(time.perf_counter() - t0, 3)
    out["cluster_sizes"] = catalog.cluster_sizes.tolist()
    if args.command == "compare":
        out = {"build": out, "comparison": compare_with_authors_sample(catalog)}
    json.dump(out, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
