"""Serving: UCB recommendations from the published serving models only.

This module reads nothing but ``{ns}:model:*`` keys (:mod:`pipeline.config.keys`);
it does not import :mod:`pipeline.state.trusted`, and a test proves both (an
import check and a scan of every key the serving path reads). A request
costs one small read of the model's version plus, on a cache miss, one
unit's model (``d + d*d`` floats). Scores are kept per unit and model version
(:class:`_Scores`, docs/serving-cache.md): a unit's first request of a version
scores every catalog item (``O(n d^2)``; a catalog beyond :data:`SCORE_WHOLE_ROWS`
items: the rows requests name, as they name them), the next requests only index
them, bit for bit the scores :func:`~models.ground.linalg.ucb_scores` gives the
request's own candidates (its rows are scored independently of each other).

The exploration width is the unit's own ``width`` when its model hash has
one (the per-unit baselines ``ss-*`` / ``dgs-*``: e.g. Shariff & Sheffet's
width from the unit's noisy ``V``), else the model's global ``alpha``.

Examples
--------
``recommend("3", ["10", "11", "12"], k=2)`` returns::

    {"user": "3", "unit": 3, "rec_id": "…", "model_version": 17,
     "items": [{"item": "11", "name": "arm 11", "score": …, "mean": …, "bonus": …}, …]}
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from models.ground.linalg import ucb_scores

from ..data.catalog import Catalog, UnknownArmError, UnknownUserError
from ..config.redisconn import connect
from ..config.keys import PublicKeys

__all__ = ["Recommender", "ModelNotReadyError", "BadRequest", "recommend", "rank_catalog", "MAX_K", "RANKED",
           "SCORE_CACHE_BYTES", "SCORE_WHOLE_ROWS"]

#: Largest list a request may ask for.
MAX_K = 100
#: Up to this many model units, a new model version is read for every unit at once; beyond, unit by unit.
PREFETCH_UNITS = 256
#: Default bound of the kept item scores (:class:`_Scores`), in bytes: least recently used units go first.
SCORE_CACHE_BYTES = 64 * 2**20
#: Catalogs up to this many items are scored whole at a unit's first request of a model version; larger ones
#: only at the rows the requests name (each row once per unit and version).
SCORE_WHOLE_ROWS = 4096


class BadRequest(ValueError):
    """A request parameter is invalid; the message says which and why."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"`{parameter}`: {message}")
        self.parameter = parameter


class ModelNotReadyError(RuntimeError):
    """No serving model has been published yet."""


@dataclass
class _UnitModel:
    version: int
    theta: np.ndarray
    M: np.ndarray
    width: float | None = None  # the unit's own exploration width, if its model has one


@dataclass
class _Scores:
    """One unit's scores of catalog rows under one served model: ``model`` (the very object :meth:`Recommender.
    unit_model` returned: a new version is a new object), ``alpha`` and the item ``term``.

    ``table`` has a row per quantity and a column per catalog row: the score (``mean + bonus (+ popular)``,
    summed in that order, as scoring the request's candidates would), the mean, the bonus and, with an item
    term, its part (popularity); a column is valid where ``done``. It grows when items are added (rows never
    move). ``whole``: every column is scored; ``finite``: every value scored so far is finite.
    """

    model: _UnitModel
    alpha: float
    term: tuple[float, np.ndarray] | None
    table: np.ndarray
    done: np.ndarray
    whole: bool = False
    finite: bool = True

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes + self.done.nbytes)


class Recommender:
    """Scores candidates for a user from the serving model of the user's unit.

    Parameters
    ----------
    client
        Redis client (only ``{ns}:model:*`` keys are read).
    namespace
        Key namespace of the pipeline.
    catalog
        Public catalog: user → unit, arm → features and name.
    meta_ttl
        Seconds the model's metadata (its version) may be reused before it is read again.
    score_cache_bytes
        Bound of the item scores kept per unit and model version (least recently used units are dropped; the
        unit being served is always kept).
    """

    def __init__(self, client: redis.Redis, namespace: str, catalog: Catalog, *, meta_ttl: float = 0.0,
                 score_cache_bytes: int = SCORE_CACHE_BYTES) -> None:
        self.r = client
        self.keys = PublicKeys(namespace)
        self.catalog = catalog
        self.meta_ttl = float(meta_ttl)
        self._cache: dict[int, _UnitModel] = {}
        # (model version, (weight, popularity) or None: no item term) of the item term
        self._items: tuple[int, tuple[float, np.ndarray] | None] | None = None
        self._meta: dict[str, str] = {}
        self._meta_at = -math.inf
        self._lock = threading.Lock()
        # unit -> ((unit model version, items, alpha), its best MAX_K rows): a catalog ranked whole (rank_all)
        self._ranked: dict[int, tuple[tuple[int, int, float], np.ndarray]] = {}
        self._refreshing: set[int] = set()  # units whose list a background thread is scoring again
        self._refresher: ThreadPoolExecutor | None = None
        # unit -> its scores under the model it was last served with, least recently used first
        self._scores: OrderedDict[int, _Scores] = OrderedDict()
        self._scores_bytes = 0
        self.score_cache_bytes = int(score_cache_bytes)

    def meta(self) -> dict[str, str]:
        """The served model's metadata (version, algorithm, alpha, privacy statement, ...).

        Re-read at most every ``meta_ttl`` seconds (0: on every call).
        """
        now = time.monotonic()
        if self._meta and now - self._meta_at < self.meta_ttl:
            return self._meta
        raw = self.r.hgetall(self.keys.model_meta)
        if not raw:
            raise ModelNotReadyError("no serving model has been published yet")
        self._meta = {k.decode(): v.decode() for k, v in raw.items()}
        self._meta_at = now
        return self._meta

    def unit_model(self, unit: int, version: int) -> _UnitModel:
        """The serving model of ``unit`` at ``version`` (cached).

        Up to :data:`PREFETCH_UNITS` units, a new version is fetched for all units at once (after a release the
        first requests would otherwise each block on their own round trip); beyond (every LastFM user,
        ``graph = "users"``) only the unit asked for. A unit without an ``M`` of its own (no interactions yet,
        every-user models) gets the model's public prior ``meta["M_prior"]``.
        """
        hit = self._cache.get(unit)
        if hit is not None and hit.version == version:
            return hit
        n = self.catalog.n_units
        units = range(n) if n <= PREFETCH_UNITS else [unit]
        with self.r.pipeline(transaction=False) as pipe:
            for u in units:
                pipe.hgetall(self.keys.model_unit(u))
            raws = pipe.execute()
        d = self.catalog.d
        fresh: dict[int, _UnitModel] = {}
        for u, raw in zip(units, raws):
            if raw:
                w = raw.get(b"width")
                m = raw.get(b"M")
                M = self._prior(d) if m is None else np.frombuffer(m, dtype="<f8").reshape(d, d).copy()
                fresh[u] = _UnitModel(int(raw[b"version"]), np.frombuffer(raw[b"theta"], dtype="<f8").copy(), M,
                                      None if w is None else float(w))
        with self._lock:
            self._cache.update(fresh)
        model = fresh.get(unit)
        if model is None:
            raise ModelNotReadyError(f"no serving model for unit {unit}")
        return model

    def _prior(self, d: int) -> np.ndarray:
        text = self.meta().get("M_prior")
        if text is None:
            raise ModelNotReadyError("the serving model has a unit without a width and no prior")
        return np.frombuffer(bytes.fromhex(text), dtype="<f8").reshape(d, d).copy()

    def item_term(self, version: int) -> tuple[float, np.ndarray] | None:
        """``(weight, popularity per catalog row)`` of the served item term at ``version``, or ``None`` (off).

        Cached per model version, the absence too: a model without an item term costs no Redis read per request.
        """
        hit = self._items
        if hit is not None and hit[0] == version:
            return hit[1]
        raw = self.r.hgetall(self.keys.model_items)
        term = None if not raw else (float(raw[b"weight"]), np.frombuffer(raw[b"pop"], dtype="<f8").copy())
        if not raw or int(raw[b"version"]) == version:  # (written with the meta: absent now, absent at `version`)
            with self._lock:
                self._items = (version, term)
        return term

    def recommend(self, user: str, candidates: Sequence[str] | None = None, k: int = 10) -> dict[str, Any]:
        """Top-``k`` of ``candidates`` (default: the catalog's default pool) by UCB score."""
        if not isinstance(user, str) or not user:
            raise BadRequest("user", "must be a non-empty user id")
        try:
            unit = self.catalog.unit_of(user)
        except UnknownUserError as exc:
            raise BadRequest("user", str(exc)) from None
        if candidates is None and getattr(self.catalog, "rank_all", False):
            return self._rank_all(user, unit, k)
        pool = list(self.catalog.default_pool if candidates is None else candidates)
        if not pool:
            raise BadRequest("candidates", "must name at least one item")
        if len(set(pool)) != len(pool):
            raise BadRequest("candidates", "must not repeat items")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise BadRequest("k", f"must be an integer in [1, {MAX_K}], got {k!r}")
        try:
            rows = self.catalog.arm_rows(pool)
        except UnknownArmError as exc:
            raise BadRequest("candidates", str(exc)) from None
        meta = self.meta()
        version = int(meta["version"])
        model = self.unit_model(unit, version)
        alpha = model.width if model.width is not None else float(meta["alpha"])
        return self._answer(user, unit, model, alpha, self.item_term(version), pool, rows, k)

    def _answer(self, user: str, unit: int, model: _UnitModel, alpha: float, term: tuple[float, np.ndarray] | None,
                pool: Sequence[str], rows: Sequence[int] | np.ndarray, k: int) -> dict[str, Any]:
        """The answer: the top ``k`` of ``pool`` (catalog ``rows``) by UCB score, ties in pool order."""
        r = np.asarray(rows, dtype=np.intp)
        kept = self._scored(unit, model, alpha, term, r)
        if kept.finite:  # Python's sort is stable under reverse=True too (ties in pool order), and on a
            # short pool ~1.6x faster than numpy's argsort with its array wrappers
            scores = kept.table[0].take(r).tolist()
            picked = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)[:k]
        else:  # NaN is unordered in Python's sort; numpy's stable argsort puts it last
            picked = (-kept.table[0].take(r)).argsort(kind="stable")[: min(k, len(pool))].tolist()
        # the top items' score, mean, bonus (and popularity) as Python floats, in one take and one conversion
        top = kept.table.take(r.take(picked), axis=1).tolist()
        name = self.catalog.arm_name
        if kept.term is None and kept.finite:  # a finite sum has finite terms: no _num per value
            items = [{"item": pool[i], "name": name(pool[i]), "score": s, "mean": m, "bonus": b}
                     for i, s, m, b in zip(picked, top[0], top[1], top[2])]
        else:
            p_ = top[3] if kept.term is not None else None
            items = [{"item": pool[i], "name": name(pool[i]), "score": _num(top[0][j]), "mean": _num(top[1][j]),
                      "bonus": _num(top[2][j]), **({} if p_ is None else {"popularity": _num(p_[j])})}
                     for j, i in enumerate(picked)]
        return {
            "user": user,
            "unit": unit,
            "rec_id": os.urandom(16).hex(),  # 32 random hex digits, as uuid4().hex, at a quarter of its cost
            "model_version": model.version,
            "items": items,
        }

    def _scored(self, unit: int, model: _UnitModel, alpha: float, term: tuple[float, np.ndarray] | None,
                rows: np.ndarray) -> _Scores:
        """The unit's kept scores under ``(model, alpha, term)``, with every row of ``rows`` scored.

        A unit's first request under a model (a new version: a new ``model`` object; or a new item term)
        replaces its entry; rows not scored yet are scored now (:meth:`_fill`). Least recently used units are
        dropped beyond :attr:`score_cache_bytes`.
        """
        n = len(self.catalog.feature_matrix)
        with self._lock:
            kept = self._scores.get(unit)
            if kept is None or kept.model is not model or kept.alpha != alpha or kept.term is not term:
                if kept is not None:
                    self._scores_bytes -= kept.nbytes
                kept = self._scores[unit] = _Scores(model, alpha, term, np.empty((3 if term is None else 4, n)),
                                                    np.zeros(n, dtype=bool))
                self._scores_bytes += kept.nbytes
            self._scores.move_to_end(unit)
            if not (kept.whole and len(kept.done) == n) and (
                    n <= SCORE_WHOLE_ROWS or int(rows.max(initial=-1)) >= len(kept.done)
                    or not kept.done.take(rows).all()):
                before = kept.nbytes
                try:
                    self._fill(kept, rows)
                finally:  # (the entry may have grown before an error)
                    self._scores_bytes += kept.nbytes - before
            while self._scores_bytes > self.score_cache_bytes and len(self._scores) > 1:
                self._scores_bytes -= self._scores.popitem(last=False)[1].nbytes
            return kept

    def _fill(self, kept: _Scores, rows: np.ndarray) -> None:
        """Score the rows of ``rows`` not scored yet (in a catalog of at most :data:`SCORE_WHOLE_ROWS` items:
        every row not scored yet) and keep them; items added since the entry was made get columns first."""
        X = self.catalog.feature_matrix  # read once: items may be appended (the matrix is replaced, rows stay)
        n, have = len(X), len(kept.done)
        if n > have:
            kept.table = np.concatenate([kept.table, np.empty((len(kept.table), n - have))], axis=1)
            kept.done = np.concatenate([kept.done, np.zeros(n - have, dtype=bool)])
        whole = n <= SCORE_WHOLE_ROWS
        todo = np.flatnonzero(~kept.done) if whole else rows[~kept.done.take(rows)]
        # ucb_scores scores each row independently of the others: bit for bit the request's own scoring
        mean, bonus = ucb_scores(kept.model.theta, kept.model.M, X.take(todo, axis=0), kept.alpha)
        if kept.term is None:
            score = mean + bonus
        else:
            # an item added after the release (or beyond the item capacity) has no released sum: 0 (_pad)
            popular = kept.term[0] * _pad(kept.term[1], todo)
            score = mean + bonus + popular
            kept.table[3, todo] = popular
        kept.table[0, todo] = score
        kept.table[1, todo] = mean
        kept.table[2, todo] = bonus
        kept.done[todo] = True
        kept.whole = whole
        kept.finite = kept.finite and bool(np.isfinite(score).all())

    def _rank_all(self, user: str, unit: int, k: int) -> dict[str, Any]:
        """Top-``k`` of every catalog item for ``user``: the unit's best rows (:meth:`_ranking`) scored by the
        current model and sorted."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise BadRequest("k", f"must be an integer in [1, {MAX_K}], got {k!r}")
        override = getattr(self.catalog, "_default_pool_override", None)
        if override:
            return self.recommend(user, override, k)
        meta = self.meta()
        version = int(meta["version"])
        model = self.unit_model(unit, version)
        alpha = model.width if model.width is not None else float(meta["alpha"])
        term = self.item_term(version)
        ids = self.catalog.arm_ids  # type: ignore[attr-defined]  # (a catalog that ranks all items has them)
        rows = self._ranking(unit, model, alpha, term)
        return self._answer(user, unit, model, alpha, term, [ids[r] for r in rows.tolist()], rows, k)

    def _ranking(self, unit: int, model: _UnitModel, alpha: float,
                 term: tuple[float, np.ndarray] | None) -> np.ndarray:
        """The unit's best :data:`RANKED` catalog rows (ties by row), kept per unit until its model changes.

        The first request of a unit scores every item (:func:`rank_catalog`) in the request. After a new model
        version (or new items), the unit's list is scored again in a background thread (BLAS releases the GIL,
        so the server keeps answering) and, meanwhile, requests get the previous list's rows, which
        :meth:`_rank_all` scores with the current model: one release tick of staleness in which rows
        are candidates, never in the scores.
        """
        X32 = self.catalog.features32  # type: ignore[attr-defined]  # read once: items may be appended meanwhile
        key = (model.version, len(X32), alpha)
        hit = self._ranked.get(unit)
        if hit is not None and hit[0] == key:
            return hit[1]
        if hit is None:
            rows = rank_catalog(X32, self.catalog.feature_matrix, model.theta, model.M, alpha, term)
            with self._lock:
                self._ranked[unit] = (key, rows)
            return rows
        with self._lock:
            start = unit not in self._refreshing
            self._refreshing.add(unit)
        if start:
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="privrec-rank")
            self._refresher.submit(self._refresh, unit, key, X32, model, alpha, term)
        return hit[1]

    def _refresh(self, unit: int, key: tuple[int, int, float], X32: np.ndarray, model: _UnitModel, alpha: float,
                 term: tuple[float, np.ndarray] | None) -> None:
        try:
            rows = rank_catalog(X32, self.catalog.feature_matrix, model.theta, model.M, alpha, term)
            with self._lock:
                old = self._ranked.get(unit)
                if old is None or old[0][:2] <= key[:2]:  # never replace a newer list
                    self._ranked[unit] = (key, rows)
        finally:
            with self._lock:
                self._refreshing.discard(unit)


#: Rows kept per unit when a catalog is ranked whole: the largest ``k`` plus a margin for the next model.
RANKED = MAX_K + 32


def rank_catalog(X32: np.ndarray, X: np.ndarray, theta: np.ndarray, M: np.ndarray, alpha: float,
                 term: tuple[float, np.ndarray] | None, n: int = RANKED) -> np.ndarray:
    """The ``n`` best rows of ``X`` by UCB score (``x θ + α sqrt(x M x)`` + the item term), in order.

    Every item is scored in float32 (``X32``: one matrix product ``X [θ | M]`` for the means and the widths'
    ``X M``, then the row sums of ``X M ∘ X``; half the bytes of float64); the best ``n`` are scored again in
    float64 and sorted (ties by row), so the order is float64's unless items lie within float32's rounding
    (~1e-6) of the ``n``-th score.
    """
    T = np.empty((X32.shape[1], X32.shape[1] + 1), dtype=np.float32)
    T[:, 0] = theta
    T[:, 1:] = M
    Z = X32.dot(T)
    mean = Z[:, 0].copy()
    XM = Z[:, 1:]
    XM *= X32
    q = XM.sum(axis=1)
    score = np.sqrt(np.maximum(q, 0.0, out=q), out=q)
    score *= np.float32(alpha)
    score += mean
    if term is not None:
        score += (term[0] * _pad(term[1], np.arange(len(X32)))).astype(np.float32)
    n = min(len(X32), n)
    top = np.argpartition(-score, n - 1)[:n] if n < len(X32) else np.arange(len(X32))
    m64, b64 = ucb_scores(theta, M, X[top], alpha)
    s64 = m64 + b64 + (0.0 if term is None else term[0] * _pad(term[1], top))
    out: np.ndarray = top[np.lexsort((top, -s64))]
    return out


def _pad(pop: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``pop[rows]``, 0 for rows beyond ``pop`` (items added after the release, or beyond the item capacity)."""
    if len(rows) == 0 or (int(rows.max()) if isinstance(rows, np.ndarray) else max(rows)) < len(pop):  # common
        out: np.ndarray = pop.take(rows)
        return out
    rows = np.asarray(rows)
    if len(pop) == 0:
        return np.zeros(len(rows))
    return np.where(rows < len(pop), pop[np.minimum(rows, len(pop) - 1)], 0.0)


def _num(x: float) -> float:
    v = float(x)
    return v if math.isfinite(v) else 0.0


_default: Recommender | None = None


def recommend(user: str, candidates: Sequence[str] | None = None, k: int = 10, *,
              recommender: Recommender | None = None) -> dict[str, Any]:
    """Module-level convenience: recommend with ``recommender`` or one built from the environment settings."""
    global _default
    rec = recommender
    if rec is None:
        if _default is None:
            from ..data.catalog import load_catalog
            from ..config.settings import Settings

            s = Settings.from_mapping({})
            if s.redis_url is None:
                raise RuntimeError("set REDIS_URL (or pass `recommender=`) to use pipeline.serve.serving.recommend")
            _default = Recommender(connect(s.redis_url), s.namespace, load_catalog(s))
        rec = _default
    return rec.recommend(user, candidates, k)
