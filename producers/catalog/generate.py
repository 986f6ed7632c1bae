"""Generate catalog directories of chosen shapes from a public seed (tests, benchmarks, examples).

:func:`write_catalog` writes ``items.csv`` and, as asked, ``users.csv``, ``edges.csv`` and ``events.csv``
with the shapes that real data sets have and LastFM lacks: string ids, non-ASCII names and tags, items
without tags but with features, no users file, no graph, any size. Events follow a planted taste: each
user group prefers the items of a few tag "genres", so a learning recommender beats random play.

Examples
--------
>>> import tempfile
>>> root = write_catalog(Path(tempfile.mkdtemp()), n_items=30, n_users=8, seed=1)
>>> sorted(p.name for p in root.iterdir())
['edges.csv', 'events.csv', 'items.csv', 'users.csv']
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

__all__ = ["write_catalog", "GENRES"]

#: Tag genres of generated items (non-ASCII on purpose).
GENRES = ("Action", "Comédie", "Drama", "ドキュメンタリー", "Jazz", "Rock", "Pop", "Nachrichten", "Sport", "Kids",
          "Sci-Fi", "Horror")


def write_catalog(root: Path, *, n_items: int = 200, n_users: int = 50, n_events: int = 0, seed: int = 0,
                  d: int = 8, feature_share: float = 0.0, users_file: bool = True, units_column: bool = False,
                  edges: bool = True, events: bool = True, n_groups: int = 4, zipf: float = 0.0) -> Path:
    """Write a catalog directory at ``root`` (created) and return it.

    Parameters
    ----------
    n_items, n_users, n_events
        Sizes (``n_events`` 0: ``10 * n_users`` when ``events``).
    seed
        Public seed of everything random.
    d
        Length of the ``features`` column of the items that have one.
    feature_share
        Share of items given ``features`` and no ``tags`` (the others have tags and no features).
    users_file, units_column, edges, events
        Which optional files (and the ``unit`` column of ``users.csv``) to write.
    n_groups
        Taste groups of users (each prefers three genres; friends are mostly inside a group).
    zipf
        Exponent of a Zipf popularity over the items (``0``: none, every item of a genre equally likely): item
        ``i`` of popularity rank ``k`` (a public random permutation) is drawn with weight ``k ** -zipf``, inside the
        user group's genres as outside them. The other draws are the same whatever ``zipf`` is.
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    item_ids = [f"sku-{i:06d}-{'αβγδ'[i % 4]}" for i in range(n_items)]
    genre = rng.integers(0, len(GENRES), n_items)
    has_features = rng.random(n_items) < feature_share
    with (root / "items.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["item", "name", "tags", "features"])
        for i, item in enumerate(item_ids):
            tags = [GENRES[genre[i]], f"decade={1950 + 10 * int(rng.integers(0, 7))}s"]
            if rng.random() < 0.5:
                tags.append(GENRES[int(rng.integers(0, len(GENRES)))])
            tags += [f"kw-{min(int(rng.zipf(1.3)), 5000)}" for _ in range(int(rng.integers(0, 4)))]  # a long tail
            x = rng.normal(size=d)
            x[genre[i] % d] += 3.0
            w.writerow([item, f"Titel Nº {i} «{GENRES[genre[i]]}»", "" if has_features[i] else "|".join(tags),
                        " ".join(f"{v:.6f}" for v in x / np.linalg.norm(x)) if has_features[i] else ""])
    users = [f"user-{u}@example.org" for u in range(n_users)]
    group = rng.integers(0, n_groups, n_users)
    if users_file:
        with (root / "users.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "unit"] if units_column else ["user"])
            for u, user in enumerate(users):
                w.writerow([user, f"group-{group[u]}"] if units_column else [user])
    if edges and n_users > 1:
        with (root / "edges.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "friend"])
            for u in range(n_users):
                for _ in range(3):
                    same = np.flatnonzero(group == group[u]) if rng.random() < 0.9 else np.arange(n_users)
                    v = int(rng.choice(same))
                    if v != u:
                        w.writerow([users[u], users[v]])
    if events:
        liked = [rng.choice(len(GENRES), 3, replace=False) for _ in range(n_groups)]
        n_ev = n_events or 10 * n_users
        weight = None
        if zipf > 0:  # a stream of its own, so that zipf = 0 draws exactly what it always drew
            ranks = np.random.default_rng([seed, 1]).permutation(n_items) + 1
            weight = ranks.astype(np.float64) ** -float(zipf)
        pick = np.random.default_rng([seed, 2])
        with (root / "events.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["user", "item", "timestamp", "reward"])
            for e in range(n_ev):
                u = int(rng.integers(0, n_users))
                pool = np.flatnonzero(np.isin(genre, liked[group[u]]))
                in_genres = bool(len(pool)) and rng.random() < 0.8
                i = int(rng.choice(pool)) if in_genres else int(rng.integers(0, n_items))
                if weight is not None:  # the same branch, the item drawn by popularity instead
                    among = pool if in_genres else np.arange(n_items)
                    cdf = np.cumsum(weight[among])
                    i = int(among[min(int(np.searchsorted(cdf, pick.random() * cdf[-1])), len(among) - 1)])
                w.writerow([users[u], item_ids[i], 1_600_000_000 + 60 * e, 1])
    return root
