"""Numbers comparing our build with BanditLib's preprocessed sample in ``bandit/``.

The sample (see ``bandit/README.md`` in the data directory):

- ``processed_events_shuffled_select100_max_observation_part2.dat``: header
  ``userid\\ttimestamp\\tarm_pool``; rows ``mapped user id, ms timestamp,
  [25 artist ids]`` with the positive first. Mapped user ids are the 1-based
  rank of the original HetRec userID.
- ``user_friends.dat.mapped.cluster``: spectral cluster labels; line ``k``
  (0-based) is mapped user ``k``, so line 0 and the lines after 1892 are padding.
- ``user_relation_adjacency_list.dat.part.200.select.100``: METIS parts;
  line ``i`` is mapped user ``i + 1``; ``10000`` = user not selected.

:func:`compare_with_authors_sample` returns plain JSON-able numbers;
``python -m producers.lastfm compare`` prints them.
"""

from __future__ import annotations

import ast
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from producers.lastfm.catalog import LastFMCatalog
from producers.lastfm.clusters import friend_edges
from producers.lastfm.events import madrid_midnight_ms
from producers.lastfm.raw import DataFormatError, DatasetNotFoundError, read_raw

__all__ = ["SAMPLE_FILES", "read_sample_events", "partition_stats", "compare_with_authors_sample"]

SAMPLE_FILES = {
    "events": "processed_events_shuffled_select100_max_observation_part2.dat",
    "spectral": "user_friends.dat.mapped.cluster",
    "metis": "user_relation_adjacency_list.dat.part.200.select.100",
}
_UNSELECTED = 10000


def read_sample_events(path: Path) -> tuple[NDArray[np.int64], NDArray[np.int64], list[list[int]]]:
    """Read BanditLib's events file: mapped user ids, timestamps (ms), pools (positive first)."""
    users: list[int] = []
    ts: list[int] = []
    pools: list[list[int]] = []
    with path.open(encoding="utf-8") as f:
        header = f.readline().strip().split("\t")
        if header != ["userid", "timestamp", "arm_pool"]:
            raise DataFormatError(path, 1, f"expected header ['userid', 'timestamp', 'arm_pool'], got {header}")
        for i, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                u, t, p = line.rstrip("\r\n").split("\t")
                pool = ast.literal_eval(p)
                users.append(int(u))
                ts.append(int(t))
                pools.append([int(a) for a in pool])
            except (ValueError, SyntaxError) as exc:
                raise DataFormatError(path, i, f"expected `user<TAB>ts<TAB>[ids]`, got {line[:80]!r} ({exc})") from None
    return np.array(users, dtype=np.int64), np.array(ts, dtype=np.int64), pools


def _stats(values: NDArray[Any]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"n": 0}
    return {
        "n": int(v.size),
        "min": float(v.min()),
        "median": float(np.median(v)),
        "mean": round(float(v.mean()), 3),
        "max": float(v.max()),
    }


def partition_stats(labels: NDArray[np.int64], edges: NDArray[np.int64]) -> dict[str, Any]:
    """Sizes, intra-cluster friendship fraction and normalised cut of a partition.

    Parameters
    ----------
    labels
        Cluster of each user; negative = user not assigned (ignored, with its edges).
    edges
        Undirected friendships as user index pairs.

    Examples
    --------
    >>> partition_stats(np.array([0, 0, 1, 1]), np.array([[0, 1], [1, 2], [2, 3]]))["normalized_cut"]
    0.667
    """
    keep = (labels[edges[:, 0]] >= 0) & (labels[edges[:, 1]] >= 0)
    e = edges[keep]
    assigned = labels[labels >= 0]
    sizes = np.bincount(assigned)
    sizes = sizes[sizes > 0]
    a, b = labels[e[:, 0]], labels[e[:, 1]]
    n_lab = int(assigned.max()) + 1 if assigned.size else 0
    vol = np.bincount(np.r_[a, b], minlength=n_lab).astype(np.float64)
    cut = np.bincount(np.r_[a[a != b], b[a != b]], minlength=n_lab).astype(np.float64)
    ncut = float(np.sum(np.divide(cut, vol, out=np.zeros_like(cut), where=vol > 0)))
    return {
        "users": int(assigned.size),
        "clusters": int(sizes.size),
        "size": _stats(sizes),
        "largest_sizes": sorted(sizes.tolist(), reverse=True)[:5],
        "clusters_of_size_le_2": int((sizes <= 2).sum()),
        "friendships": int(len(e)),
        "intra_cluster_friendship_fraction": round(float((a == b).mean()) if len(e) else 0.0, 4),
        "normalized_cut": round(ncut, 3),
        "cluster_graph_edges": int(len({(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist()) if x != y})),
    }


def compare_with_authors_sample(
    catalog: LastFMCatalog, bandit_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Compare our events and clusters with BanditLib's sample.

    Parameters
    ----------
    catalog
        Our build (its ``params.positives`` decides which pairs are ours).
    bandit_dir
        Folder with the sample; ``None`` means ``<catalog.data_dir>/bandit``.

    Returns
    -------
    dict
        ``{"sample": ..., "ours_same_users": ..., "ours_all": ..., "overlap": ...,
        "clusters": ...}``; all numbers (see ``docs/lastfm.md``).

    Raises
    ------
    DatasetNotFoundError
        If the sample folder or one of its files is missing.
    """
    bdir = Path(bandit_dir) if bandit_dir is not None else catalog.data_dir / "bandit"
    missing = [f for f in SAMPLE_FILES.values() if not (bdir / f).is_file()]
    if missing:
        raise DatasetNotFoundError(bdir, missing)
    raw = read_raw(catalog.data_dir)
    users = np.array([int(u) for u in catalog.users], dtype=np.int64)  # sorted = BanditLib's mapping order
    tagged_pairs = {(int(u), int(a)) for u, a in raw.tagged[:, :2].tolist()}
    listened_pairs = {(int(u), int(a)) for u, a in raw.listened[:, :2].tolist()}
    tag_days: dict[tuple[int, int], set[int]] = {}
    for u, a, _, day, month, year in raw.tagged.tolist():
        tag_days.setdefault((u, a), set()).add(madrid_midnight_ms(year, month, day))
    taggers = Counter(a for _, a in tagged_pairs)  # artist -> number of users who tagged it
    tagged_artists = set(taggers)

    # --- the sample's events -------------------------------------------------------------
    s_mapped, s_ts, s_pools = read_sample_events(bdir / SAMPLE_FILES["events"])
    s_users = users[s_mapped - 1]
    s_pos = np.array([p[0] for p in s_pools], dtype=np.int64)
    s_pairs = list(zip(s_users.tolist(), s_pos.tolist()))
    s_neg = [(u, a) for u, p in zip(s_users.tolist(), s_pools) for a in p[1:]]
    s_per_user = np.array(list(Counter(s_users.tolist()).values()))
    s_pair_count = Counter(s_pairs)
    s_userset = set(s_users.tolist())
    first_tag = {k: min(v) for k, v in tag_days.items()}
    sample = {
        "events": len(s_pools),
        "users": len(s_userset),
        "events_per_user": _stats(s_per_user),
        "pool_sizes": dict(Counter(len(p) for p in s_pools)),
        "pools_with_distinct_arms": sum(len(set(p)) == len(p) for p in s_pools),
        "positive_slot_0_fraction": 1.0,
        "distinct_positive_pairs": len(s_pair_count),
        "events_per_positive_pair": _stats(np.array(list(s_pair_count.values()))),
        "distinct_positive_artists": len(set(s_pos.tolist())),
        "distinct_artists_in_pools": len({a for p in s_pools for a in p}),
        "pool_artists_that_are_tagged_artists_fraction": round(
            float(np.mean([a in tagged_artists for p in s_pools for a in p])), 4
        ),
        "positives_tagged_fraction": round(float(np.mean([p in tagged_pairs for p in s_pairs])), 4),
        "positives_listened_fraction": round(float(np.mean([p in listened_pairs for p in s_pairs])), 4),
        "negatives_tagged_by_user_fraction": round(float(np.mean([p in tagged_pairs for p in s_neg])), 6),
        "negatives_listened_by_user_fraction": round(float(np.mean([p in listened_pairs for p in s_neg])), 6),
        "ts_equals_first_tag_day_fraction": round(
            float(np.mean([first_tag.get(p) == t for p, t in zip(s_pairs, s_ts.tolist())])), 4
        ),
        "ts_equals_some_tag_day_fraction": round(
            float(np.mean([t in tag_days.get(p, ()) for p, t in zip(s_pairs, s_ts.tolist())])), 4
        ),
        "positive_taggers_mean": round(float(np.mean([taggers.get(a, 0) for a in s_pos.tolist()])), 3),
        "negative_taggers_mean": round(float(np.mean([taggers.get(a, 0) for _, a in s_neg])), 3),
    }

    # --- ours -----------------------------------------------------------------------------
    table = catalog.event_arrays()
    o_users, o_arms, o_pools = table.users, table.arms, table.pools
    same = np.isin(o_users, list(s_userset))
    slot = np.argmax(o_pools == o_arms[:, None], axis=1)

    def ours(mask: NDArray[np.bool_]) -> dict[str, Any]:
        u, a, p = o_users[mask], o_arms[mask], o_pools[mask]
        pairs = list(zip(u.tolist(), a.tolist()))
        neg_mask = p != a[:, None]
        neg_pairs = list(zip(np.repeat(u, p.shape[1] - 1).tolist(), p[neg_mask].tolist()))
        return {
            "events": int(mask.sum()),
            "users": int(len(np.unique(u))),
            "events_per_user": _stats(np.unique(u, return_counts=True)[1]),
            "pool_sizes": {int(p.shape[1]): int(mask.sum())},
            "pools_with_distinct_arms": int(sum(len(set(r)) == len(r) for r in p.tolist())),
            "positive_slot_0_fraction": round(float((slot[mask] == 0).mean()), 4),
            "distinct_positive_artists": int(len(np.unique(a))),
            "distinct_artists_in_pools": int(len(np.unique(p))),
            "positives_tagged_fraction": round(float(np.mean([x in tagged_pairs for x in pairs])), 4),
            "positives_listened_fraction": round(float(np.mean([x in listened_pairs for x in pairs])), 4),
            "negatives_tagged_by_user_fraction": round(float(np.mean([x in tagged_pairs for x in neg_pairs])), 6),
            "negatives_listened_by_user_fraction": round(
                float(np.mean([x in listened_pairs for x in neg_pairs])), 6
            ),
            "positive_taggers_mean": round(float(np.mean([taggers.get(x, 0) for x in a.tolist()])), 3),
            "negative_taggers_mean": round(float(np.mean([taggers.get(x, 0) for _, x in neg_pairs])), 3),
        }

    ours_same = ours(same)
    ours_all = ours(np.ones(len(o_users), dtype=bool))
    our_pairs_same = set(zip(o_users[same].tolist(), o_arms[same].tolist()))
    their_pairs = set(s_pair_count)
    overlap = {
        "sample_pairs": len(their_pairs),
        "our_pairs_for_sample_users": len(our_pairs_same),
        "common_pairs": len(their_pairs & our_pairs_same),
        "sample_pairs_in_ours_fraction": round(len(their_pairs & our_pairs_same) / max(1, len(their_pairs)), 4),
        "our_pairs_in_sample_fraction": round(len(their_pairs & our_pairs_same) / max(1, len(our_pairs_same)), 4),
        "sample_events_whose_pair_is_ours_fraction": round(
            float(np.mean([p in our_pairs_same for p in s_pairs])), 4
        ),
    }

    # --- clusters ---------------------------------------------------------------------------
    edges = friend_edges(raw.friends, users)
    ours_labels = np.array([catalog.user_cluster[str(u)] for u in users.tolist()], dtype=np.int64)
    spectral = np.loadtxt(bdir / SAMPLE_FILES["spectral"], dtype=np.int64)
    if spectral.shape[0] < len(users) + 1:
        raise DataFormatError(bdir / SAMPLE_FILES["spectral"], 0, f"expected >= {len(users) + 1} lines, got {spectral.shape[0]}")
    spectral = spectral[1 : len(users) + 1]
    metis = np.loadtxt(bdir / SAMPLE_FILES["metis"], dtype=np.int64)
    if metis.shape[0] != len(users):
        raise DataFormatError(bdir / SAMPLE_FILES["metis"], 0, f"expected {len(users)} lines, got {metis.shape[0]}")
    metis = np.where(metis == _UNSELECTED, -1, metis)
    sample_user_idx = np.searchsorted(users, sorted(s_userset))
    clusters = {
        "ours": partition_stats(ours_labels, edges),
        "banditlib_spectral": partition_stats(spectral, edges),
        "banditlib_metis_select100": partition_stats(metis, edges),
        "ours_vs_banditlib_spectral_ari": round(float(adjusted_rand_score(spectral, ours_labels)), 4),
        "ours_vs_banditlib_spectral_nmi": round(float(normalized_mutual_info_score(spectral, ours_labels)), 4),
        "sample_users_in_metis_selection": int((metis[sample_user_idx] >= 0).sum()),
        "sample_users_clusters_ours": int(len(np.unique(ours_labels[sample_user_idx]))),
        "sample_users_clusters_metis": int(len(np.unique(metis[sample_user_idx]))),
    }
    return {
        "params": {k: getattr(catalog.params, k) for k in ("seed", "d", "n_clusters", "pool_size", "positives")},
        "sample": sample,
        "ours_same_users": ours_same,
        "ours_all": ours_all,
        "overlap": overlap,
        "clusters": clusters,
    }
