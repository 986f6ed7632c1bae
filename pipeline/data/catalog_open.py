"""A catalog directory (:mod:`producers.catalog`) as the pipeline's :class:`~pipeline.data.catalog.Catalog`.

:class:`OpenCatalog` is open on both sides:

* users: a user who is not in the catalog is assigned a unit by the public rule
  ``SHA-256(user id) mod n_units`` (:func:`producers.catalog.hash_unit`): served from their first request and
  learned from at their first feedback; the rule needs only the id, so the assignment spends no privacy;
* items: :meth:`OpenCatalog.add_items` appends items (features given, or from the catalog's fitted tag
  transform); rows never move, so a row index stays valid for every reader.

``/recommend`` without ``candidates`` ranks every item (:attr:`OpenCatalog.rank_all`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from producers.catalog.build import BuiltCatalog, build_catalog, hash_unit

from .catalog_base import FloatArray, _Base

__all__ = ["OpenCatalog", "LastFMOpenCatalog", "open_catalog", "lastfm_catalog"]


class OpenCatalog(_Base):
    """A built catalog directory: items, users with their units, ``W``; new users and items welcome.

    Parameters
    ----------
    built
        The build (:func:`producers.catalog.build_catalog`).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "items.csv").write_text("item,features\\na,1 0\\nb,0 1\\n")
    >>> cat = OpenCatalog(build_catalog(root, d=2, units=4, use_cache=False))
    >>> cat.unit_of("someone new") == cat.unit_of("someone new"), cat.n_units, cat.arm_row("b")
    (True, 4, 1)
    """

    #: ``/recommend`` without candidates ranks every item, not a fixed pool.
    rank_all = True

    def __init__(self, built: BuiltCatalog) -> None:
        self.built = built
        self.name = built.root.name
        self.W = built.W
        self._user_unit = {u: int(c) for u, c in zip(built.users, built.user_units.tolist())}
        self._arm_ids: list[str] = list(built.item_ids)
        self._arm_rows = {a: i for i, a in enumerate(self._arm_ids)}
        self._names = list(built.item_names)
        self._features = np.ascontiguousarray(built.features, dtype=np.float64)
        #: float32 copy of the features: ranking every item (pipeline.serve.serving) moves half the bytes
        self.features32 = self._features.astype(np.float32)
        self._n_built = len(self._arm_ids)
        self._grow = threading.Lock()
        h = hashlib.sha256(_Base.fingerprint.func(self).encode())  # type: ignore[attr-defined]
        for a in self._arm_ids:
            h.update(a.encode() + b"\0")
        #: names the build (features, ids, units, ``W``), not the items added while running
        self.fingerprint = h.hexdigest()[:16]

    def unit_of(self, user: str) -> int:
        """The user's unit: from the catalog, else the public rule ``SHA-256(user) mod n_units``."""
        u = self._user_unit.get(user)
        return hash_unit(user, self.n_units) if u is None else u

    def arm_name(self, arm: str) -> str:
        name = self._names[self.arm_row(arm)]
        return name or arm

    @property
    def default_pool(self) -> Sequence[str]:
        """The configured pool, else every item."""
        return self._default_pool_override or self._arm_ids

    @property
    def n_items(self) -> int:
        return len(self._arm_ids)

    @property
    def item_capacity(self) -> int:
        """Coordinates of the item term's reward sums, fixed at start: the built items plus
        ``max(1024, built items)`` for items added while running (an item beyond gets no item-term sum)."""
        return self._n_built + max(1024, self._n_built)

    def features_from_tags(self, tags: list[list[str]]) -> FloatArray:
        """Features of new items from the build's fitted tag transform (ValueError: no transform / no known tag)."""
        f = self.built.featurizer
        if f is None:
            raise ValueError("this catalog has no tag transform (no item of the build has tags): give features")
        for ts in tags:
            if not f.known(ts):
                raise ValueError(f"none of the tags {ts} is known to the catalog's tag transform")
        return f.transform(tags)

    def add_items(self, ids: Sequence[str], features: FloatArray, names: Sequence[str] | None = None) -> list[str]:
        """Append new items (features ``len(ids) x d``, scaled to norm <= 1); known ids are skipped.

        Returns the ids that were added. Rows are appended, never moved, and the feature matrix is replaced
        (not written in place), so a reader holding the old matrix keeps a consistent view.
        """
        X = np.asarray(features, dtype=np.float64).reshape(len(ids), self.d)
        norms = np.linalg.norm(X, axis=1)
        X = np.where((norms > 1.0)[:, None], X / np.where(norms > 0, norms, 1.0)[:, None], X)
        with self._grow:
            seen: set[str] = set()
            fresh = []
            for i, a in enumerate(ids):
                if a not in self._arm_rows and a not in seen:
                    seen.add(a)
                    fresh.append(i)
            if not fresh:
                return []
            start = len(self._arm_ids)
            feats = np.vstack([self._features, X[fresh]])
            feats32 = feats.astype(np.float32)
            for j, i in enumerate(fresh):
                self._arm_rows[ids[i]] = start + j
                self._arm_ids.append(ids[i])
                self._names.append("" if names is None else names[i])
            self._features = feats
            self.features32 = feats32
        return [ids[i] for i in fresh]


def open_catalog(path: str, *, d: int, units: int, seed: int) -> OpenCatalog:
    """Build (or read from the cache) the catalog directory ``path`` (see :func:`producers.catalog.build_catalog`)."""
    return OpenCatalog(build_catalog(path, d=d, units=units, seed=seed))


class LastFMOpenCatalog(OpenCatalog):
    """HetRec LastFM (friend-graph clusters) served through the generic path: its export
    (:func:`producers.lastfm.export.write_catalog_dir`) built like any catalog directory.

    As :class:`~pipeline.data.catalog.LastFMCatalogAdapter` (``graph="clusters"``): the name ``lastfm``, the same
    features, units, ``W`` and fingerprint (namespaces made before keep working), the 25 most often logged
    artists as the default pool; in addition, users the catalog does not list are served (the public rule).
    """

    rank_all = False  # LastFM's default pool stays the 25 most often logged artists

    def __init__(self, built: BuiltCatalog, lastfm: Any) -> None:
        super().__init__(built)
        self.name = "lastfm"
        self.lastfm = lastfm
        self.fingerprint = _Base.fingerprint.func(self)  # type: ignore[attr-defined]
        self._popular = lastfm.most_logged(25)

    def arm_name(self, arm: str) -> str:
        self.arm_row(arm)
        return str(self.lastfm.artist_names.get(arm, f"artist {arm}"))

    @property
    def item_capacity(self) -> int:
        """The built artists only: the item term keeps the shape that namespaces made before recorded (an artist
        added while running is served and learned from by the bandit, with no item-term sum)."""
        return self._n_built

    @property
    def default_pool(self) -> Sequence[str]:
        """The configured pool, else the 25 most often logged artists."""
        return self._default_pool_override or self._popular


def lastfm_catalog(data_dir: str | None, *, d: int) -> LastFMOpenCatalog:
    """LastFM through the generic path: built (or read from its cache), exported once as a catalog directory
    (next to the catalog builds, keyed by LastFM's own cache key), then built as any directory."""
    from producers.catalog.build import default_root
    from producers.lastfm import load_catalog as load_lastfm
    from producers.lastfm.export import write_catalog_dir

    lf = load_lastfm(data_dir, d=d, progress=False)
    root = write_catalog_dir(lf, default_root() / f"lastfm-{lf.info['key']}")
    return LastFMOpenCatalog(build_catalog(root, d=d, units=lf.n_clusters, seed=lf.params.seed), lf)
