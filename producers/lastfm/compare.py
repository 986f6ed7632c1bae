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
                if not (p.startswith("[") and p.endswith("]")):
                    raise ValueError("pool is not a [..] list")
                pools.append([int(a) for a in p[1:-1].split(",")])
                users.append(int(u))
                ts.append(int(t))
            except ValueError as exc:
                raise DataFormatError(path, i, f"expected `user<TAB>ts<TAB>[ids]`, got {line[:80]!r} ({exc})") from None
    return np.array(users, dtype=np.int64), np.array(ts, dtype=np.int64), pools


def _keys(users: NDArray[Any], artists: NDArray[Any]) -> NDArray[np.int64]:
    return (np.asarray(users, dtype=np.int64) << 32) | np.asarray(artists, dtype=np.int64)


def _frac_in(keys: NDArray[np.int64], sorted_keys: NDArray[np.int64], digits: int = 4) -> float:
    if keys.size == 0:
        return 0.0
    return round(float(np.isin(keys, sorted_keys, assume_unique=False).mean()), digits)


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
    tagged_keys = np.unique(_keys(raw.tagged[:, 0], raw.tagged[:, 1]))
    listened_keys = np.unique(_keys(raw.listened[:, 0], raw.listened[:, 1]))
    taggers = np.bincount((tagged_keys & 0xFFFFFFFF).astype(np.int64))  # artist -> users who tagged it
    tag_ms = np.array([madrid_midnight_ms(y, m, d) for d, m, y in raw.tagged[:, 3:6].tolist()], dtype=np.int64)
    row_keys = _keys(raw.tagged[:, 0], raw.tagged[:, 1])
    tag_days = set(zip(row_keys.tolist(), tag_ms.tolist()))
    order = np.lexsort((tag_ms, row_keys))
    first = np.r_[True, row_keys[order][1:] != row_keys[order][:-1]]
    first_tag = dict(zip(row_keys[order][first].tolist(), tag_ms[order][first].tolist()))

    def n_taggers(artists: NDArray[np.int64]) -> NDArray[np.int64]:
        ok = (artists >= 0) & (artists < len(taggers))
        out = np.zeros(artists.shape, dtype=np.int64)
        out[ok] = taggers[artists[ok]]
        return out

    def pool_stats(
        u: NDArray[np.int64], a: NDArray[np.int64], p: NDArray[np.int64], slot: NDArray[np.int64]
    ) -> dict[str, Any]:
        """``p``: pools padded with -1; ``slot``: position of the positive in each pool."""
        valid = p >= 0
        neg = valid & (p != a[:, None])
        neg_keys = _keys(np.broadcast_to(u[:, None], p.shape)[neg], p[neg])
        srt = np.sort(np.where(valid, p, -1), axis=1)
        distinct = ~((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(axis=1)
        pos_keys = _keys(u, a)
        return {
            "events": int(len(u)),
            "users": int(len(np.unique(u))),
            "events_per_user": _stats(np.unique(u, return_counts=True)[1]),
            "pool_sizes": {int(k): int(v) for k, v in zip(*np.unique(valid.sum(axis=1), return_counts=True))},
            "pools_with_distinct_arms": int(distinct.sum()),
            "positive_slot_0_fraction": round(float((slot == 0).mean()), 4),
            "distinct_positive_pairs": int(len(np.unique(pos_keys))),
            "distinct_positive_artists": int(len(np.unique(a))),
            "distinct_artists_in_pools": int(len(np.unique(p[valid]))),
            "pool_artists_with_features_fraction": round(float(np.isin(p[valid], artist_ids).mean()), 4),
            "positives_tagged_fraction": _frac_in(pos_keys, tagged_keys),
            "positives_listened_fraction": _frac_in(pos_keys, listened_keys),
            "negatives_tagged_by_user_fraction": _frac_in(neg_keys, tagged_keys, 6),
            "negatives_listened_by_user_fraction": _frac_in(neg_keys, listened_keys, 6),
            "positive_taggers_mean": round(float(n_taggers(a).mean()), 3),
            "negative_taggers_mean": round(float(n_taggers(p[neg]).mean()), 3),
        }

    artist_ids = np.array([int(x) for x in catalog.artist_ids], dtype=np.int64)

    # --- the sample's events (positive first) ----------------------------------------------
    s_mapped, s_ts, s_pools = read_sample_events(bdir / SAMPLE_FILES["events"])
    if s_mapped.size and (s_mapped.min() < 1 or s_mapped.max() > len(users)):
        raise DataFormatError(
            bdir / SAMPLE_FILES["events"], 0,
            f"mapped user ids must be in [1, {len(users)}], got [{s_mapped.min()}, {s_mapped.max()}]",
        )
    s_users = users[s_mapped - 1]
    width = max((len(p) for p in s_pools), default=0)
    s_p = np.full((len(s_pools), width), -1, dtype=np.int64)
    for i, row in enumerate(s_pools):
        s_p[i, : len(row)] = row
    s_pos = s_p[:, 0]
    s_pair_keys = _keys(s_users, s_pos)
    sample = pool_stats(s_users, s_pos, s_p, np.zeros(len(s_users), dtype=np.int64))
    sample["events_per_positive_pair"] = _stats(np.unique(s_pair_keys, return_counts=True)[1])
    days_per_pair = Counter(k for k, _ in tag_days)
    pair_keys, pair_events = np.unique(s_pair_keys, return_counts=True)
    sample["pairs_with_one_event_per_tag_day_fraction"] = round(
        float(np.mean([days_per_pair.get(k, 0) == n for k, n in zip(pair_keys.tolist(), pair_events.tolist())]))
        if len(pair_keys) else 0.0,
        4,
    )
    sample["ts_equals_first_tag_day_fraction"] = round(
        float(np.mean([first_tag.get(k) == t for k, t in zip(s_pair_keys.tolist(), s_ts.tolist())])), 4
    )
    sample["ts_equals_some_tag_day_fraction"] = round(
        float(np.mean([(k, t) in tag_days for k, t in zip(s_pair_keys.tolist(), s_ts.tolist())])), 4
    )

    # --- ours ------------------------------------------------------------------------------
    table = catalog.event_arrays()
    o_users, o_arms, o_pools = table.users, table.arms, table.pools
    slot = np.argmax(o_pools == o_arms[:, None], axis=1)
    s_userset = np.unique(s_users)
    same = np.isin(o_users, s_userset)
    ours_same = pool_stats(o_users[same], o_arms[same], o_pools[same], slot[same])
    ours_all = pool_stats(o_users, o_arms, o_pools, slot)
    ours_keys = np.unique(_keys(o_users[same], o_arms[same]))
    their_keys = np.unique(s_pair_keys)
    common = int(np.isin(their_keys, ours_keys).sum())
    overlap = {
        "sample_pairs": int(len(their_keys)),
        "our_pairs_for_sample_users": int(len(ours_keys)),
        "common_pairs": common,
        "sample_pairs_in_ours_fraction": round(common / max(1, len(their_keys)), 4),
        "our_pairs_in_sample_fraction": round(common / max(1, len(ours_keys)), 4),
        "sample_events_whose_pair_is_ours_fraction": _frac_in(s_pair_keys, ours_keys),
    }

    # --- clusters ---------------------------------------------------------------------------
    edges = friend_edges(raw.friends, users)
    ours_labels = np.array([catalog.user_cluster[str(u)] for u in users.tolist()], dtype=np.int64)
    spectral = np.loadtxt(bdir / SAMPLE_FILES["spectral"], dtype=np.int64)
    if spectral.shape[0] < len(users) + 1:
        raise DataFormatError(
            bdir / SAMPLE_FILES["spectral"], 0, f"expected >= {len(users) + 1} lines, got {spectral.shape[0]}"
        )
    spectral = spectral[1 : len(users) + 1]
    metis = np.loadtxt(bdir / SAMPLE_FILES["metis"], dtype=np.int64)
    if metis.shape[0] != len(users):
        raise DataFormatError(bdir / SAMPLE_FILES["metis"], 0, f"expected {len(users)} lines, got {metis.shape[0]}")
    metis = np.where(metis == _UNSELECTED, -1, metis)
    sample_user_idx = np.searchsorted(users, s_userset)
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
