"""Build a catalog directory into arrays: item features, user units, the unit graph ``W``; cached on disk.

Features (``items.csv``): a row's ``features`` when given (scaled down to L2 norm 1 when longer, the context
bound ``Lx = 1`` of the privacy sensitivities), else from its ``tags``: the tag labels (lower-cased) are
counted per item, weighted by scikit-learn's TF-IDF (``TfidfTransformer()`` defaults: smoothed idf, L2 rows),
projected on a ``TruncatedSVD`` to ``d`` dimensions (padded with zeros when there are fewer tag labels than
``d``), and scaled to L2 norm 1. The fitted transform (vocabulary, idf weights, SVD components) is saved with
the built catalog: an item added later (``POST /items`` with tags) gets its features from the same fitted
transform (:meth:`TagFeaturizer.transform`), so it lands in the same space as the items of the build.

Units (who shares a model), in this order:

1. ``users.csv`` has a ``unit`` column: users with the same label share a unit (labels sorted, as numbers when
   they all are, and numbered 0..);
2. else ``edges.csv`` exists: the friend graph over the users of ``users.csv`` and of the edges is cut into
   ``min(units, users)`` clusters, as for LastFM (:func:`producers.lastfm.clusters.cluster_users`);
3. else the public rule: ``unit = SHA-256(user id) mod units`` (:func:`hash_unit`).

``W`` is CoLin's matrix of inter-unit friendships (:func:`producers.lastfm.clusters.colin_w`) when
``edges.csv`` exists, else the identity. A user who is not in the catalog (a new user) is assigned by the
public rule 3 in every case: it needs nothing but the id, so the assignment reveals nothing about anyone's data.

A build is cached under ``$PRIVREC_CACHE_DIR`` (default ``~/.cache/privrec``) in ``catalogs/<key>``; the key
hashes the build parameters and the bytes of every present file, so a changed, added or removed file rebuilds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from producers.lastfm import cache as _cache
from producers.lastfm.clusters import cluster_users, colin_w

from .format import FILES, CatalogFormatError, read_edges, read_items, read_users

__all__ = ["TagFeaturizer", "BuiltCatalog", "build_catalog", "load_built", "hash_unit", "default_root",
           "SCHEMA"]

#: Version of the cached layout; bump when the build changes.
SCHEMA = 1

FloatArray = NDArray[np.float64]


def hash_unit(user: str, n_units: int) -> int:
    """The public unit of a user: the first 8 bytes of SHA-256 of the id (big-endian) modulo ``n_units``.

    >>> hash_unit("alice", 16), hash_unit("alice", 16) == hash_unit("alice", 16)
    (15, True)
    """
    return int.from_bytes(hashlib.sha256(user.encode("utf-8")).digest()[:8], "big") % n_units


def _unit_norm(X: FloatArray) -> FloatArray:
    norms = np.linalg.norm(X, axis=1)
    out: FloatArray = X / np.where(norms > 0, norms, 1.0)[:, None]
    return out


@dataclass(frozen=True)
class TagFeaturizer:
    """The fitted tags → features transform: vocabulary, TF-IDF weights, SVD components (``k x V``), ``d``.

    Examples
    --------
    >>> f = TagFeaturizer.fit([["rock", "pop"], ["rock"], ["jazz", "Pop"], ["jazz"]], d=2, seed=0)
    >>> X = f.transform([["rock", "pop"], ["jazz"]])
    >>> X.shape, np.allclose(np.linalg.norm(X, axis=1), 1.0)
    ((2, 2), True)
    """

    vocabulary: tuple[str, ...]
    idf: FloatArray
    components: FloatArray
    d: int

    @staticmethod
    def _counts(tags: list[list[str]], index: dict[str, int]) -> sp.csr_matrix:
        indptr = [0]
        cols: list[int] = []
        for ts in tags:
            for t in ts:
                j = index.get(t.casefold())
                if j is not None:
                    cols.append(j)
            indptr.append(len(cols))
        return sp.csr_matrix((np.ones(len(cols)), np.asarray(cols, dtype=np.int64), np.asarray(indptr)),
                             shape=(len(tags), len(index)))

    @classmethod
    def fit(cls, tags: list[list[str]], d: int, seed: int = 0) -> TagFeaturizer:
        """Fit on the tag lists of the catalog's items (TF-IDF, then truncated SVD to at most ``d`` components)."""
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfTransformer

        vocab = tuple(sorted({t.casefold() for ts in tags for t in ts}))
        if not vocab:
            raise ValueError("no tags to fit features on")
        index = {t: i for i, t in enumerate(vocab)}
        counts = cls._counts(tags, index)
        tfidf = TfidfTransformer().fit(counts)
        idf = np.asarray(tfidf.idf_, dtype=np.float64)
        k = min(d, len(vocab) - 1, counts.shape[0] - 1)
        if k < 1 or len(vocab) <= d:  # fewer labels than dimensions: the TF-IDF coordinates themselves
            comps = np.eye(len(vocab), dtype=np.float64)
        else:
            X = tfidf.transform(counts)
            comps = TruncatedSVD(n_components=k, random_state=seed).fit(X).components_.astype(np.float64)
        return cls(vocab, idf, comps, d)

    def transform(self, tags: list[list[str]]) -> FloatArray:
        """Features (``len(tags) x d``, unit L2 norm; a zero row when no tag is in the vocabulary)."""
        index = {t: i for i, t in enumerate(self.vocabulary)}
        counts = self._counts(tags, index)
        X = sp.csr_matrix(counts.multiply(self.idf[None, :]))
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        X = sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ X
        Z = np.asarray(X @ self.components.T)
        out = np.zeros((len(tags), self.d))
        out[:, :Z.shape[1]] = Z[:, :self.d]
        return _unit_norm(out)

    def known(self, tags: list[str]) -> bool:
        """Whether at least one of ``tags`` is in the vocabulary (else the features would be zero)."""
        vocab = set(self.vocabulary)
        return any(t.casefold() in vocab for t in tags)

    def arrays(self) -> dict[str, NDArray[Any]]:
        return {"vocabulary": np.asarray(self.vocabulary, dtype=str), "idf": self.idf,
                "components": self.components, "d": np.asarray(self.d)}

    @classmethod
    def from_arrays(cls, a: dict[str, NDArray[Any]]) -> TagFeaturizer:
        return cls(tuple(str(t) for t in a["vocabulary"].tolist()), a["idf"], a["components"], int(a["d"]))


@dataclass(frozen=True)
class BuiltCatalog:
    """A built catalog: items (ids, names, features), users and their units, ``W``, the tag transform."""

    root: Path
    item_ids: tuple[str, ...]
    item_names: tuple[str, ...]
    features: FloatArray
    users: tuple[str, ...]
    user_units: NDArray[np.int64]
    W: FloatArray
    unit_rule: str
    featurizer: TagFeaturizer | None
    info: dict[str, Any]

    @property
    def n_units(self) -> int:
        return int(self.W.shape[0])


def default_root() -> Path:
    """``$PRIVREC_CACHE_DIR/catalogs``, else ``~/.cache/privrec/catalogs``."""
    env = os.environ.get(_cache.CACHE_DIR_ENV)
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "privrec") / "catalogs"


def _units(root: Path, n_units: int, seed: int) -> tuple[list[str], NDArray[np.int64], FloatArray, str]:
    users = read_users(root)
    edges = read_edges(root)
    ids = list(users.ids) if users is not None else []
    if users is not None and users.units is not None:
        labels = sorted(set(users.units))
        if all(lab.isdecimal() for lab in labels):  # numeric labels keep their numbers' order (0, 1, 2, ..., 10)
            labels.sort(key=int)
        number = {lab: i for i, lab in enumerate(labels)}
        units = np.asarray([number[u] for u in users.units], dtype=np.int64)
        rule, n = "users.csv unit", len(labels)
    elif edges is not None:
        seen = set(ids)
        for a, b in edges:
            for u in (a, b):
                if u not in seen:
                    seen.add(u)
                    ids.append(u)
        if not ids:
            raise CatalogFormatError("edges.csv", None, None, "no users")
        n = min(n_units, len(ids))
        units = np.empty(0, dtype=np.int64)  # filled below, once the edges are indexed
        rule = f"clusters of edges.csv ({n})"
    else:
        units = np.asarray([hash_unit(u, n_units) for u in ids], dtype=np.int64)
        return ids, units, np.eye(n_units), f"SHA-256(user) mod {n_units}"
    if edges is None:
        return ids, units, np.eye(n), rule
    pos = {u: i for i, u in enumerate(ids)}
    pairs = np.asarray([(pos[a], pos[b]) for a, b in edges if a in pos and b in pos and a != b],
                       dtype=np.int64).reshape(-1, 2)
    pairs = np.unique(np.sort(pairs, axis=1), axis=0).reshape(-1, 2)
    if not len(units):
        units = cluster_users(len(ids), pairs, n, seed)
    return ids, units, colin_w(units, pairs, n), rule


def _build(root: Path, d: int, n_units: int, seed: int) -> BuiltCatalog:
    t0 = time.perf_counter()
    items = read_items(root, d)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    X = np.zeros((len(items.ids), d))
    given = np.asarray([x is not None for x in items.features])
    for i, x in enumerate(items.features):
        if x is not None:
            X[i] = x
    norms = np.linalg.norm(X, axis=1)
    longer = norms > 1.0 + 1e-9  # (a unit vector written out may read back 1 ulp longer: kept bit for bit)
    X[longer] /= norms[longer, None]
    tagged = [t for t in items.tags if t]
    featurizer = TagFeaturizer.fit(tagged, d, seed) if tagged else None
    need = np.flatnonzero(~given)
    if len(need):
        assert featurizer is not None  # every row without features has tags (read_items)
        X[need] = featurizer.transform([items.tags[i] for i in need])
    t_feat = time.perf_counter() - t0
    t0 = time.perf_counter()
    users, units, W, rule = _units(root, n_units, seed)
    t_units = time.perf_counter() - t0
    info = {"counts": {"items": len(items.ids), "items_with_features": int(given.sum()),
                       "items_from_tags": int(len(need)), "users": len(users), "units": int(W.shape[0]),
                       "tag_labels": 0 if featurizer is None else len(featurizer.vocabulary)},
            "unit_rule": rule,
            "build_seconds": {"read": round(t_read, 3), "features": round(t_feat, 3), "units": round(t_units, 3)}}
    return BuiltCatalog(root, tuple(items.ids), tuple(items.names), X, tuple(users), units, W, rule, featurizer,
                        info)


def build_catalog(root: str | os.PathLike[str], *, d: int = 25, units: int = 100, seed: int = 0,
                  cache_dir: str | os.PathLike[str] | None = None, use_cache: bool = True) -> BuiltCatalog:
    """Build (or read from the cache) the catalog directory ``root``.

    Parameters
    ----------
    root
        The catalog directory (``items.csv`` and the optional files).
    d
        Feature dimension (rows of ``features`` must have exactly ``d`` values).
    units
        Clusters of ``edges.csv``, or units of the hash rule (a ``unit`` column decides its own number).
    seed
        Public seed of the SVD and of the spectral clustering.
    cache_dir
        Cache root (default :func:`default_root`).
    use_cache
        ``False`` builds in memory and neither reads nor writes the cache.

    Raises
    ------
    CatalogFormatError
        A file is missing or malformed (the message names file, line and column).
    ValueError
        A parameter is out of range.
    """
    path = Path(root).expanduser().resolve()
    if d < 1:
        raise ValueError(f"`d` must be positive, got {d}.")
    if units < 1:
        raise ValueError(f"`units` must be positive, got {units}.")
    if not path.is_dir():
        raise CatalogFormatError(str(path), None, None, "not a directory (a catalog is a directory holding "
                                                        "items.csv)")
    if not (path / "items.csv").is_file():
        raise CatalogFormatError("items.csv", None, None, f"missing file (looked for {path / 'items.csv'})")
    inputs = {f: _cache.file_sha256(path / f) for f in FILES[:3] if (path / f).is_file()}
    params = {"d": d, "units": units, "seed": seed}
    key = _cache.cache_key(SCHEMA, params, inputs)
    entry = (Path(cache_dir).expanduser() if cache_dir is not None else default_root()) / key
    if use_cache and entry.is_dir():
        try:
            return load_built(entry, path)
        except (OSError, ValueError, KeyError):
            shutil.rmtree(entry, ignore_errors=True)  # corrupt: rebuilt below
    built = _build(path, d, units, seed)
    if use_cache:
        arrays: dict[str, dict[str, NDArray[Any]]] = {
            "items": {"ids": np.asarray(built.item_ids, dtype=str), "features": built.features},
            "users": {"ids": np.asarray(built.users, dtype=str), "units": built.user_units},
            "graph": {"W": built.W},
        }
        if built.featurizer is not None:
            arrays["featurizer"] = built.featurizer.arrays()
        meta = {**built.info, "schema": SCHEMA, "key": key, "params": params, "inputs": inputs,
                "unit_rule_text": built.unit_rule, "has_featurizer": built.featurizer is not None}
        _cache.write_entry(entry, arrays, meta, {"names": list(built.item_names)})
    built.info["cache"] = {"hit": False, "entry": str(entry) if use_cache else None}
    return built


def load_built(entry: Path, root: Path) -> BuiltCatalog:
    """Read a cached build (see :func:`build_catalog`)."""
    _, meta = _cache.read_entry(entry, [])
    names = ["items", "users", "graph"] + (["featurizer"] if meta["has_featurizer"] else [])
    arrays, _ = _cache.read_entry(entry, names)
    it, us = arrays["items"], arrays["users"]
    feat = TagFeaturizer.from_arrays(arrays["featurizer"]) if meta["has_featurizer"] else None
    info = {k: meta[k] for k in ("counts", "unit_rule", "build_seconds")}
    info["cache"] = {"hit": True, "entry": str(entry)}
    return BuiltCatalog(root, tuple(it["ids"].tolist()), tuple(_cache.read_document(entry, "names")),
                        it["features"].astype(np.float64), tuple(us["ids"].tolist()),
                        us["units"].astype(np.int64), arrays["graph"]["W"].astype(np.float64),
                        meta["unit_rule_text"], feat, info)
