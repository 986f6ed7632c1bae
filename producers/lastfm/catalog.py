"""The LastFM catalog: features, clusters, collaboration graph and event stream, cached.

:func:`load_catalog` is the entry point. It reads the HetRec files from the
data directory, builds (or loads from the cache) every artifact of the
papers' protocol and returns a :class:`LastFMCatalog`:

- ``feature(artist_id)`` / ``features_of(pool)``: unit-norm ``d``-dim arm features;
- ``cluster_of(user)`` / ``user_cluster``: the user's friend-graph cluster;
- ``W`` (CoLin, column-stochastic) and ``adjacency`` (GOB.Lin, binary) over clusters;
- ``events(limit)``: the logged positives in replay order, each with its pool.

Ids are strings, as in the ``interactions`` topic: user ids and artist ids are
the original HetRec ids (``"2"``, ``"51"``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from producers.lastfm import cache as _cache
from producers.lastfm.clusters import cluster_users, colin_w, friend_edges, gob_adjacency
from producers.lastfm.events import EventArrays, Positives, build_events
from producers.lastfm.features import build_features
from producers.lastfm.raw import REQUIRED_FILES, read_raw, resolve_data_dir

__all__ = ["SCHEMA", "BuildParams", "LastFMEvent", "LastFMCatalog", "load_catalog"]

#: Version of the cached layout and of the build logic; bump it when either changes.
SCHEMA = 1

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BuildParams:
    """Everything besides the input files that determines the built artifacts.

    Parameters
    ----------
    seed
        Seed of the SVD, the clustering, the negatives and the event order.
    d
        Feature dimension (papers: 25).
    n_clusters
        Number of user clusters (papers: 100).
    pool_size
        Arms per event, the positive included (papers: 25).
    positives
        ``"tagged"`` (default; what BanditLib's events use) or ``"listened"``
        (the papers' stated reward). See ``docs/lastfm.md``.
    """

    seed: int = 0
    d: int = 25
    n_clusters: int = 100
    pool_size: int = 25
    positives: Positives = "tagged"

    def __post_init__(self) -> None:
        for name in ("seed", "d", "n_clusters", "pool_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"`{name}` must be an int, got {value!r}.")
        if self.seed < 0:
            raise ValueError(f"`seed` must be non-negative, got {self.seed}.")
        if self.d < 1:
            raise ValueError(f"`d` must be positive, got {self.d}.")
        if self.n_clusters < 1:
            raise ValueError(f"`n_clusters` must be positive, got {self.n_clusters}.")
        if self.pool_size < 2:
            raise ValueError(f"`pool_size` must be at least 2, got {self.pool_size}.")
        if self.positives not in ("tagged", "listened"):
            raise ValueError(f"`positives` must be 'tagged' or 'listened', got {self.positives!r}.")


@dataclass(frozen=True, slots=True)
class LastFMEvent:
    """One logged positive and the pool it is replayed in.

    Attributes
    ----------
    event_id
        ``"lastfm:<positives>:<user>:<artist>"``: names the logged pair, so it
        is the same for every seed and build.
    user
        Original HetRec user id.
    arm
        Artist id of the logged positive (reward 1).
    reward
        Reward of ``arm``: always ``1.0``; every other pool arm has reward 0.
    pool
        ``pool_size`` distinct artist ids, ``arm`` among them at a random slot.
    ts
        First time the user tagged ``arm`` (ms since the epoch, Madrid
        midnight of the logged day); ``None`` for a listened pair never tagged.
    """

    event_id: str
    user: str
    arm: str
    reward: float
    pool: tuple[str, ...]
    ts: float | None

    def to_interaction(
        self, chosen_arm: str | None = None, *, ts: float | None = None, rec_id: str | None = None
    ) -> dict[str, Any]:
        """The ``interactions`` topic value (DESIGN §7) for showing ``chosen_arm``.

        Parameters
        ----------
        chosen_arm
            The arm a policy picked from ``pool``; ``None`` means the logged
            ``arm``. The reward is 1 iff it is the logged arm.
        ts
            Event time in ms; ``None`` means the logged ``ts``.
        rec_id
            The recommendation this feedback answers, if any.

        Raises
        ------
        ValueError
            If ``chosen_arm`` is not in ``pool``, or no time is known.

        Examples
        --------
        >>> ev = LastFMEvent("lastfm:tagged:2:52", "2", "52", 1.0, ("7", "52"), 1238536800000.0)
        >>> ev.to_interaction("7")  # doctest: +NORMALIZE_WHITESPACE
        {'event_id': 'lastfm:tagged:2:52', 'user': '2', 'arm': '7', 'context': None,
         'reward': 0.0, 'ts': 1238536800000.0, 'rec_id': None}
        """
        arm = self.arm if chosen_arm is None else chosen_arm
        if arm not in self.pool:
            raise ValueError(f"`chosen_arm` must be one of the event's pool {list(self.pool)}, got {arm!r}.")
        when = self.ts if ts is None else float(ts)
        if when is None:
            raise ValueError(f"`ts` is required: event {self.event_id!r} has no logged time.")
        return {
            "event_id": self.event_id,
            "user": self.user,
            "arm": arm,
            "context": None,
            "reward": 1.0 if arm == self.arm else 0.0,
            "ts": when,
            "rec_id": rec_id,
        }


def _readonly(a: NDArray[Any]) -> NDArray[Any]:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class LastFMCatalog:
    """Built LastFM artifacts; create it with :func:`load_catalog`.

    Attributes
    ----------
    params
        The build parameters.
    data_dir
        Where the raw files were read.
    artist_ids
        Artists that have features (were tagged at least once), sorted by id.
        Only these appear in pools.
    feature_matrix
        ``(len(artist_ids), d)`` read-only, row ``i`` for ``artist_ids[i]``;
        every row has L2 norm 1.
    artist_index
        ``artist id -> row`` of ``feature_matrix``.
    artist_names
        ``artist id -> name`` from ``artists.dat`` (17,632 artists; 390 tagged
        artists have no entry there and so no name).
    users
        Every user id found in any file, sorted numerically.
    user_cluster
        ``user id -> cluster`` in ``0..n_clusters-1`` (0 is the largest).
    W
        ``(n_clusters, n_clusters)`` CoLin matrix; columns sum to 1, diagonal > 0.
    adjacency
        ``(n_clusters, n_clusters)`` GOB.Lin graph, 0/1, symmetric, zero diagonal.
    info
        Counts, timings and cache details (the JSON manifest of the cache entry).
    """

    params: BuildParams
    data_dir: Path
    artist_ids: tuple[str, ...]
    feature_matrix: FloatArray
    artist_index: Mapping[str, int]
    artist_names: Mapping[str, str]
    users: tuple[str, ...]
    user_cluster: Mapping[str, int]
    W: FloatArray
    adjacency: FloatArray
    info: Mapping[str, Any]
    _ev_users: NDArray[np.int64] = field(repr=False)
    _ev_arms: NDArray[np.int64] = field(repr=False)
    _ev_pools: NDArray[np.int64] = field(repr=False)
    _ev_ts: FloatArray = field(repr=False)

    @property
    def d(self) -> int:
        """Feature dimension."""
        return int(self.feature_matrix.shape[1])

    @property
    def n_clusters(self) -> int:
        """Number of user clusters."""
        return int(self.W.shape[0])

    @property
    def n_events(self) -> int:
        """Number of events in the stream."""
        return int(self._ev_users.shape[0])

    @property
    def cluster_sizes(self) -> NDArray[np.int64]:
        """Users per cluster (non-increasing)."""
        return np.bincount(np.fromiter(self.user_cluster.values(), dtype=np.int64), minlength=self.n_clusters)

    def feature(self, artist_id: str) -> FloatArray:
        """Unit-norm feature vector (read-only) of one artist.

        Raises
        ------
        KeyError
            If the artist has no features (unknown, or never tagged).
        """
        try:
            row = self.artist_index[str(artist_id)]
        except KeyError:
            raise KeyError(
                f"`artist_id` {artist_id!r} has no features: it is not a tagged LastFM artist."
            ) from None
        out: FloatArray = self.feature_matrix[row]
        return out

    def features_of(self, artist_ids: Sequence[str]) -> FloatArray:
        """``(len(artist_ids), d)`` feature rows of a pool, in the given order (a copy)."""
        try:
            rows = [self.artist_index[str(a)] for a in artist_ids]
        except KeyError as exc:
            raise KeyError(
                f"`artist_ids` contains {exc.args[0]!r}, which has no features: it is not a tagged LastFM artist."
            ) from None
        out: FloatArray = self.feature_matrix[rows]
        return out

    def most_logged(self, n: int = 25) -> list[str]:
        """The ``n`` artists most often logged in the event stream (the default pool of serving)."""
        counts = np.bincount(self._ev_arms.astype(np.int64))
        popular = np.argsort(-counts)[:8 * n]
        return [str(a) for a in popular if counts[a] > 0 and str(a) in self.artist_index][:n]

    def cluster_of(self, user: str) -> int:
        """The cluster (model unit of CoLin / GOB.Lin) of a user.

        Raises
        ------
        KeyError
            If the user is not a LastFM user.
        """
        try:
            return self.user_cluster[str(user)]
        except KeyError:
            raise KeyError(f"`user` {user!r} is not a LastFM user (ids are HetRec userIDs such as '2').") from None

    def event_arrays(self) -> EventArrays:
        """The whole stream as read-only integer arrays (original ids), in replay order.

        For offline experiments that do not want one object per event; row
        ``i`` is the ``i``-th event of :meth:`events`.
        """
        return EventArrays(
            users=self._ev_users,
            arms=self._ev_arms,
            pools=self._ev_pools,
            ts=self._ev_ts,
            n_dropped_no_features=int(self.info["counts"]["positives_dropped_no_features"]),
        )

    def events(self, limit: int | None = None, start: int = 0) -> Iterator[LastFMEvent]:
        """Iterate over the logged events in replay (shuffled) order.

        Parameters
        ----------
        limit
            Yield at most this many events; ``None`` means all.
        start
            Index of the first event (to resume a replay).
        """
        if limit is not None and limit < 0:
            raise ValueError(f"`limit` must be non-negative or None, got {limit}.")
        if start < 0:
            raise ValueError(f"`start` must be non-negative, got {start}.")
        stop = self.n_events if limit is None else min(self.n_events, start + limit)
        tag = self.params.positives
        for i in range(start, stop):
            user, arm = str(self._ev_users[i]), str(self._ev_arms[i])
            ts = float(self._ev_ts[i])
            yield LastFMEvent(
                event_id=f"lastfm:{tag}:{user}:{arm}",
                user=user,
                arm=arm,
                reward=1.0,
                pool=tuple(str(a) for a in self._ev_pools[i].tolist()),
                ts=None if np.isnan(ts) else ts,
            )


_ARTIFACTS = ["features", "events", "clusters"]


def _build(data_dir: Path, params: BuildParams, progress: bool) -> tuple[
    dict[str, dict[str, NDArray[Any]]], dict[str, Any], dict[str, str]
]:
    timings: dict[str, float] = {}
    # One BLAS/OpenMP thread: on 2 shared cores, k-means and the SVD ran 5-15x slower
    # with the default thread pools (oversubscription), and one thread is reproducible.
    with threadpool_limits(limits=1), tqdm(total=4, desc="LastFM build", unit="step", disable=not progress) as bar:
        t0 = time.perf_counter()
        bar.set_postfix_str("reading files")
        raw = read_raw(data_dir)
        timings["read"] = time.perf_counter() - t0
        bar.update()

        t0 = time.perf_counter()
        bar.set_postfix_str("features (TF-IDF + SVD)")
        artist_ids, features = build_features(raw.tagged, raw.tags, params.d, params.seed)
        timings["features"] = time.perf_counter() - t0
        bar.update()

        t0 = time.perf_counter()
        bar.set_postfix_str("events and pools")
        ev = build_events(raw.listened, raw.tagged, artist_ids, params.positives, params.pool_size, params.seed)
        timings["events"] = time.perf_counter() - t0
        bar.update()

        t0 = time.perf_counter()
        bar.set_postfix_str("clusters (spectral) and W")
        users = np.unique(np.concatenate([raw.listened[:, 0], raw.tagged[:, 0], raw.friends.ravel()]))
        edges = friend_edges(raw.friends, users)
        labels = cluster_users(len(users), edges, params.n_clusters, params.seed)
        W = colin_w(labels, edges, params.n_clusters)
        adjacency = gob_adjacency(W)
        timings["clusters"] = time.perf_counter() - t0
        bar.update()

    sizes = np.bincount(labels, minlength=params.n_clusters)
    artifacts = {
        "features": {"artist_ids": artist_ids, "features": features},
        "events": {"users": ev.users, "arms": ev.arms, "pools": ev.pools, "ts": ev.ts},
        "clusters": {"users": users, "labels": labels, "W": W, "adjacency": adjacency},
    }
    counts = {
        "users": int(len(users)),
        "users_with_events": int(len(np.unique(ev.users))),
        "artists_in_artists_dat": len(raw.artist_names),
        "artists_with_features": int(len(artist_ids)),
        "events": int(len(ev.users)),
        "events_without_ts": int(np.isnan(ev.ts).sum()),
        "positives_dropped_no_features": ev.n_dropped_no_features,
        "friendships": int(len(edges)),
        "cluster_size_max": int(sizes.max()),
        "cluster_size_median": float(np.median(sizes)),
        "cluster_size_min": int(sizes.min()),
        "intra_cluster_friendship_fraction": float(
            (labels[edges[:, 0]] == labels[edges[:, 1]]).mean() if len(edges) else 0.0
        ),
        "gob_edges": int(adjacency.sum() // 2),
    }
    meta = {"counts": counts, "build_seconds": {k: round(v, 3) for k, v in timings.items()}}
    names = {str(k): v for k, v in sorted(raw.artist_names.items())}
    return artifacts, meta, names


def load_catalog(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    d: int = 25,
    n_clusters: int = 100,
    pool_size: int = 25,
    positives: Positives = "tagged",
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    progress: bool | None = None,
) -> LastFMCatalog:
    """Build or load the LastFM catalog.

    Parameters
    ----------
    data_dir
        Folder with the HetRec 2011 files; ``None`` means ``$PRIVREC_DATA_DIR``
        or ``../shared/data/lastfm-2k`` next to the repository.
    seed, d, n_clusters, pool_size, positives
        Build parameters, see :class:`BuildParams`.
    cache_dir
        Cache root; ``None`` means ``$PRIVREC_CACHE_DIR`` or
        ``~/.cache/privrec/lastfm``.
    use_cache
        ``False`` builds in memory and neither reads nor writes the cache.
    progress
        Show a tqdm bar while building; ``None`` means "if stderr is a terminal".

    Returns
    -------
    LastFMCatalog
        ``info["cache"]`` says whether the cache was hit and where the entry is.

    Raises
    ------
    DatasetNotFoundError
        If the directory or a required file is missing (names both, and where
        to download the dataset).
    DataFormatError
        If a file is malformed.
    ValueError
        If a parameter is out of range.
    """
    params = BuildParams(seed=seed, d=d, n_clusters=n_clusters, pool_size=pool_size, positives=positives)
    path = resolve_data_dir(data_dir)
    show = sys.stderr.isatty() if progress is None else progress
    inputs = {name: _cache.file_sha256(path / name) for name in REQUIRED_FILES}
    key = _cache.cache_key(SCHEMA, asdict(params), inputs)
    root = Path(cache_dir).expanduser() if cache_dir is not None else _cache.default_cache_dir()
    entry = root / key

    artifacts: dict[str, dict[str, NDArray[Any]]] | None = None
    hit = False
    if use_cache and entry.is_dir():
        try:
            artifacts, meta = _cache.read_entry(entry, _ARTIFACTS)
            names = _cache.read_document(entry, "artist_names")
            hit = True
        except (OSError, ValueError, KeyError):
            artifacts = None  # Corrupt or partial entry: rebuild below (the new one replaces it).
    if artifacts is None:
        artifacts, meta, names = _build(path, params, show)
        meta.update({"schema": SCHEMA, "key": key, "params": asdict(params), "inputs": inputs})
        if use_cache:
            if entry.exists():  # The corrupt entry that failed to load.
                shutil.rmtree(entry, ignore_errors=True)
            _cache.write_entry(entry, artifacts, meta, {"artist_names": names})
    info = dict(meta)
    info["cache"] = {"hit": hit, "entry": str(entry) if use_cache else None}

    feats, ev, cl = artifacts["features"], artifacts["events"], artifacts["clusters"]
    artist_ids = tuple(str(a) for a in feats["artist_ids"].tolist())
    users = tuple(str(u) for u in cl["users"].tolist())
    return LastFMCatalog(
        params=params,
        data_dir=path,
        artist_ids=artist_ids,
        feature_matrix=_readonly(feats["features"].astype(np.float64)),
        artist_index=MappingProxyType({a: i for i, a in enumerate(artist_ids)}),
        artist_names=MappingProxyType(dict(names)),
        users=users,
        user_cluster=MappingProxyType({u: int(c) for u, c in zip(users, cl["labels"].tolist())}),
        W=_readonly(cl["W"].astype(np.float64)),
        adjacency=_readonly(cl["adjacency"].astype(np.float64)),
        info=MappingProxyType(info),
        _ev_users=_readonly(ev["users"]),
        _ev_arms=_readonly(ev["arms"]),
        _ev_pools=_readonly(ev["pools"]),
        _ev_ts=_readonly(ev["ts"]),
    )
