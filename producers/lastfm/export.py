"""LastFM in the generic catalog format: :func:`write_catalog_dir` writes a built LastFM catalog as a directory.

``items.csv`` (artist id, name, the 25 features written with ``repr``, so they read back bit for bit),
``users.csv`` (user, unit = friend-graph cluster), ``edges.csv`` (each friendship once) and ``events.csv``
(the replay's events; ``timestamp`` is the event's index in LastFM's replay order, so a replay of the file
plays them in the same order). Built by :func:`producers.catalog.build_catalog`, the directory gives LastFM's
features, units and CoLin ``W`` exactly (tests/component/test_lastfm_generic.py): the pipeline serves LastFM through
that one path (:func:`pipeline.data.catalog_open.lastfm_catalog`).
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .catalog import LastFMCatalog
from .clusters import friend_edges
from .raw import read_raw

__all__ = ["write_catalog_dir"]


def write_catalog_dir(cat: LastFMCatalog, out: Path) -> Path:
    """Write ``cat`` as a catalog directory at ``out`` (atomically: a temporary directory renamed into place).

    An existing ``out`` is left as it is (another process wrote the same export).
    """
    out = Path(out)
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with (tmp / "items.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["item", "name", "features"])
            for a, x in zip(cat.artist_ids, cat.feature_matrix):
                w.writerow([a, cat.artist_names.get(a, ""), " ".join(repr(float(v)) for v in x)])
        with (tmp / "users.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "unit"])
            for u in cat.users:
                w.writerow([u, cat.user_cluster[u]])
        users = np.asarray([int(u) for u in cat.users], dtype=np.int64)
        edges = friend_edges(read_raw(cat.data_dir).friends, users)
        with (tmp / "edges.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "friend"])
            for i, j in edges.tolist():
                w.writerow([cat.users[i], cat.users[j]])
        ev = cat.event_arrays()
        with (tmp / "events.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "item", "timestamp", "reward"])
            for i, (u, a) in enumerate(zip(ev.users.tolist(), ev.arms.tolist())):
                w.writerow([u, a, i, 1])
        try:
            os.replace(tmp, out)
        except OSError:  # another process renamed its copy first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
