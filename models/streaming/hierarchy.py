"""The hierarchical model: a public prior, a pooled model of all users, each unit's deviation, each item's count.

Every user's listens are read as draws from a distribution over the catalog, ``p(a | u)``. The serving model
estimates it level by level, each level shrunk toward the one above by an amount that follows the released
statistics' own (public) noise and counts, never a constant tuned on one catalog:

1. **prior** — the catalog's mean context ``x_bar`` (public): ``theta_0 = c u_0`` with ``u_0 = x_bar / ||x_bar||``;
   with no data, ``c = 1`` and items rank by ``x . u_0`` (the best data-free scorer on LastFM, 2.47x random play);
   with data, ``c`` is fitted to the projection ``u_0 . b`` (one coordinate: its noise is ``sigma``), and it flattens
   or reverses the prior's order (``c <= 0``) only where the release rejects ``c = 1`` (:func:`prior_scale`).
2. **pooled** — an exponential tilt of the catalog, ``p(a) ∝ exp(x_a . theta)``, fitted to the released pooled
   sum ``b = sum of the listened items' contexts`` and count ``n`` by Gauss-Newton on the likelihood of
   ``b ~ N(n mu(theta), n Sigma(theta) + sigma^2 I)`` with the prior ``theta ~ N(theta_0, tau0^2 I)``; ``tau0^2``
   by type-II maximum likelihood (:func:`eb_prior_variance`). Noise that swamps the data gives ``tau0 -> 0`` and
   the prior's ranking back.
3. **items** — each item's released count ``s_hat_a`` against what the pooled tilt predicts, ``m_a = n p(a)``.
   The level is on only where the largest residual ``r`` clears ``t_K``, which no residual of pure noise clears
   with probability ``1 - LEVEL`` (:func:`clear_threshold`: ``P(max_a r_a > t_K) = LEVEL`` for ``K`` independent
   ``N(0, sigma_items^2)``); elsewhere (LastFM at user level) it says nothing and the content model ranks. Where it
   is on, the release says which rule applies, through the share of the count by which residuals clear the
   universal threshold ``sigma_items sqrt(2 ln K)`` (:data:`CLEAR_MASS`) and that excess in noise standard
   deviations (:data:`CLEAR_EXCESS`): at least 5 % of the count, or 1 sd where the content model ranks the items
   that clear no higher than its median, popularity stands out of the noise and the counts are kept whole (a
   catalog with a steep popularity); less, ``r`` is shrunk by
   ``beta r + (1 - beta) soft(r, t)``, ``(beta, t)`` minimising Stein's unbiased risk estimate for the release's
   noise (:func:`sure_shrinkage`; Donoho & Johnstone 1995). Without noise the counts are taken as they are (online
   popularity, with the content model breaking the ties of unseen items).
4. **units** (when released) — each unit's pooled-style sum ``b_u, n_u`` against the pooled model's prediction:
   ``delta_u = tau^2 A_u (tau^2 A_u^2 + A_u + sigma_u^2 I)^-1 (b_u - n_u mu)`` with ``A_u = n_u Sigma``, the
   exact Gaussian posterior mean of the unit's deviation, ``tau^2`` by the method of moments over units
   (James–Stein / Efron–Morris) where the residuals' excess energy clears its own noise at the level ``LEVEL``
   (:func:`units_prior_variance`), else 0: when the noise dominates, every unit collapses onto the pooled model.

Every level leaves the one above only on evidence at the same level, :data:`LEVEL` (1 %, per release): the pooled
tilt through a 99 % likelihood margin, the items and the units through tests whose null distribution is the
release's own public noise std and counts. Under pure noise each level stays at the one above with probability about
``1 - LEVEL``, and the model ranks as the prior does.

A candidate ``a`` for unit ``u`` scores ``x_a . theta_u + log(p(a) / p_pool(a)) + alpha ||x_a||_{M_u}`` with
``theta_u = theta + delta_u``: up to a constant, ``log p(a | u)`` plus a bonus. That is the serving layer's usual
``x . theta_u + alpha ||x||_M + w * item_a`` with ``w = 1`` and ``item_a`` the item's departure from the content
model (``0`` for an item the release does not cover), ``M_u`` the posterior covariance of ``theta_u``. Everything
here is post-processing of released statistics and the public catalog: it changes no guarantee.

**What is released** (:class:`HierarchyLayout`): per release tick, one vector through one continual-release
mechanism, in blocks ``[pool (d + 1), items (K), units (N (d + 1))]``. One user's contribution in one tick
(:func:`contribution`) is their listens' reward-weighted mean context and their listens' shares of the items,
each weighted by ``min(1, total reward)``: the pool block ``c [x_mean, 1] / sqrt(2)`` (norm <= 1), the items
block ``c w / sum(w)`` (L1 and L2 norm <= 1), the unit block as the pool block in the user's unit's slot. Two
users' blocks have a nonnegative inner product, so they differ by at most ``sqrt(2)`` (:data:`REPLACE_SENSITIVITY`). The
blocks are scaled by public weights so that the block ``l`` gets the share ``s_l`` of ``mu**2`` (Gaussian DP:
one Gaussian mechanism over the scaled blocks is exactly the composition of one per block).

Examples
--------
>>> rng = np.random.default_rng(0)
>>> F = rng.normal(size=(40, 3)); F /= np.linalg.norm(F, axis=1, keepdims=True)
>>> layout = HierarchyLayout(d=3, n_items=40, n_units=2)
>>> v = layout.exact_vector([(0, {5: 1.0}), (1, {5: 1.0, 7: 1.0})], F)
>>> rel = ReleasedHierarchy.from_vector(layout, v, std=0.0)
>>> round(rel.count, 6), rel.items[[5, 7]].round(3).tolist()
(2.0, [1.5, 0.5])
>>> model = solve_hierarchy(rel, F, n_units=2)
>>> int(np.argmax(model.item_scores)), model.theta.shape
(5, (2, 3))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from models.ground.codec import decode_arrays, encode_arrays

__all__ = ["HierarchyLayout", "ReleasedHierarchy", "HierarchyModel", "contribution", "item_shares", "solve_hierarchy",
           "default_shares", "parse_shares", "add_contribution", "add_contributions", "add_rows_in_order", "UNITS_MIN_USERS",
           "prior_direction", "sure_shrinkage", "content_percentile", "item_floor", "eb_prior_variance", "clear_threshold",
           "units_prior_variance",
           "LEVEL", "SHARES", "REPLACE_SENSITIVITY"]

FloatArray = NDArray[np.float64]

#: Default shares of ``mu**2`` by block (units off): chosen on held-out windows of LastFM, the synthetic population
#: and a synthetic tagged catalog (docs/hierarchy.md).
SHARES: dict[str, float] = {"pool": 0.05, "items": 0.95, "units": 0.0}
#: Per-tick L2 sensitivity of each block under *replace* neighbours (a user's contribution against another's):
#: ``||u - v||^2 = ||u||^2 + ||v||^2 - 2 u.v <= 2`` whenever ``u.v >= 0``. The items block is nonnegative; the pool
#: and unit blocks ``c [x_mean, 1] / sqrt(2)`` have ``u.v = c_u c_v (x_u.x_v + 1) / 2 >= 0`` because the means of
#: contexts clipped to norm 1 have ``x_u.x_v >= -1``: ``sqrt(2)`` for all three (found by the audit, tests/privacy).
#: Adding or removing one user moves a block by their contribution alone, norm <= 1: the release calibrated to
#: ``sqrt(2)`` covers the add/remove relation too (the default, ``privacy_relation``; tests/privacy ``hier-ar-*``).
REPLACE_SENSITIVITY: dict[str, float] = {"pool": math.sqrt(2.0), "items": math.sqrt(2.0), "units": math.sqrt(2.0)}
_H = 1.0 / math.sqrt(2.0)  # the pool block is [x_mean, 1] / sqrt(2): norm <= 1 for contexts of norm <= 1
#: The unit block is released when the catalog knows at least this many users per unit (a public count): below it a
#: unit's own signal does not clear its noise, and its share of the budget earns more on the other blocks
#: (measured: docs/hierarchy.md).
UNITS_MIN_USERS = 1000
#: The unit block's share when it is released (the pool keeps its share; the items give up as much).
UNITS_SHARE = 0.2


def default_shares(*, users: int, units: int, private: bool = True) -> dict[str, float]:
    """The blocks' shares of ``mu**2`` from public counts: :data:`SHARES`, plus the unit block where the catalog
    knows at least :data:`UNITS_MIN_USERS` users per unit; without noise every block (nothing to share).

    >>> default_shares(users=1_892, units=100)
    {'pool': 0.05, 'items': 0.95, 'units': 0.0}
    >>> default_shares(users=1_000_000, units=100)
    {'pool': 0.05, 'items': 0.75, 'units': 0.2}
    >>> default_shares(users=10, units=100, private=False)
    {'pool': 1.0, 'items': 1.0, 'units': 1.0}
    """
    if not private:
        return {"pool": 1.0, "items": 1.0, "units": 1.0}
    out = dict(SHARES)
    if units > 1 and users >= UNITS_MIN_USERS * units:
        out["units"] = UNITS_SHARE
        out["items"] = round(out["items"] - UNITS_SHARE, 12)
    return out


def parse_shares(text: str) -> dict[str, float]:
    """``"pool=0.05,items=0.95,units=0"`` -> a shares mapping (the ``hierarchy_shares`` setting).

    >>> parse_shares("pool=1, items=3")
    {'pool': 0.25, 'items': 0.75, 'units': 0.0}
    >>> parse_shares("pool=0,items=1")
    Traceback (most recent call last):
    ...
    ValueError: the pool block needs a positive share (every level above it shrinks toward it), got 'pool=0,items=1'.
    """
    out = {"pool": 0.0, "items": 0.0, "units": 0.0}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name.strip() not in out:
            raise ValueError(f"must be name=share pairs over {sorted(out)}, got {text!r}.")
        try:
            v = float(value)
        except ValueError:
            raise ValueError(f"share of {name.strip()!r} must be a number, got {value!r}.") from None
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"share of {name.strip()!r} must be a non-negative number, got {value!r}.")
        out[name.strip()] = v
    if out["pool"] <= 0:
        raise ValueError(f"the pool block needs a positive share (every level above it shrinks toward it), got "
                         f"{text!r}.")
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


def prior_direction(features: FloatArray) -> FloatArray:
    """``u_0 = x_bar / ||x_bar||``: the catalog's mean context (each clipped to norm 1), a unit vector (public).

    >>> prior_direction(np.array([[3.0, 4.0], [0.0, 1.0]])).round(3).tolist()
    [0.316, 0.949]
    """
    X = np.asarray(features, dtype=np.float64)
    if X.ndim != 2 or not len(X) or not np.isfinite(X).all():
        raise ValueError(f"`features` must be a non-empty finite (n, d) matrix, got shape {X.shape}.")
    X = X / np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    xbar = X.mean(axis=0)
    norm = float(np.linalg.norm(xbar))
    if norm <= 0:
        return np.zeros(X.shape[1])
    out: FloatArray = xbar / norm
    return out


@dataclass(frozen=True)
class HierarchyLayout:
    """Where each block sits in the released vector, and its public weight (see the module docstring).

    ``shares`` are the blocks' shares of ``mu**2`` (normalised over the blocks that are on; ``units`` 0: off);
    ``sensitivity`` the per-tick L2 sensitivity of each block under the relation in force (default: replace).
    The weights make one mechanism of sensitivity 1 per tick give block ``l`` the noise std ``sigma / w_l``.
    """

    d: int
    n_items: int
    n_units: int
    shares: Mapping[str, float] = field(default_factory=lambda: dict(SHARES))
    sensitivity: Mapping[str, float] = field(default_factory=lambda: dict(REPLACE_SENSITIVITY))

    def __post_init__(self) -> None:
        if self.d < 1 or self.n_items < 1 or self.n_units < 1:
            raise ValueError(f"`d`, `n_items` and `n_units` must be positive, got {self.d}, {self.n_items}, "
                             f"{self.n_units}.")
        unknown = set(self.shares) - set(REPLACE_SENSITIVITY)
        if unknown or any(not (v >= 0 and math.isfinite(v)) for v in self.shares.values()):
            raise ValueError(f"`shares` must map {sorted(REPLACE_SENSITIVITY)} to non-negative numbers, got "
                             f"{dict(self.shares)}.")
        if self.shares.get("pool", 0.0) <= 0:
            raise ValueError("the pool block must be on (`shares['pool'] > 0`): every level above it shrinks toward it.")

    @cached_property
    def blocks(self) -> tuple[str, ...]:
        """The blocks that are on, in order (computed once, as are :meth:`slice` and :meth:`weight`)."""
        return tuple(b for b in ("pool", "items", "units") if self.shares.get(b, 0.0) > 0)

    @cached_property
    def _slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for b in self.blocks:
            out[b] = slice(start, start + self.size(b))
            start += self.size(b)
        return out

    @property
    def units(self) -> bool:
        return "units" in self.blocks

    def size(self, block: str) -> int:
        return {"pool": self.d + 1, "items": self.n_items, "units": self.n_units * (self.d + 1)}[block]

    @property
    def dim(self) -> int:
        return sum(self.size(b) for b in self.blocks)

    def slice(self, block: str) -> slice:
        if block not in self._slices:
            raise KeyError(f"block {block!r} is off in this layout ({self.blocks}).")
        return self._slices[block]

    def share(self, block: str) -> float:
        total = sum(self.shares[b] for b in self.blocks)
        return self.shares[block] / total

    def weight(self, block: str) -> float:
        """``w_l = sqrt(s_l) / Delta_l``: the block's scale in the released vector."""
        if block in self._weights:
            return self._weights[block]
        return math.sqrt(self.share(block)) / float(self.sensitivity[block])

    @cached_property
    def _weights(self) -> dict[str, float]:
        """:meth:`weight` of each block that is on, computed once (the fold asks for every user it adds)."""
        return {b: math.sqrt(self.share(b)) / float(self.sensitivity[b]) for b in self.blocks}

    def exact_vector(self, contributions: Iterable[tuple[int, Mapping[int, float]]], features: FloatArray,
                     out: FloatArray | None = None) -> FloatArray:
        """The weighted released vector's exact value: the sum of :func:`contribution` over ``(unit, items)``."""
        v = np.zeros(self.dim) if out is None else out
        for unit, items in contributions:
            add_contribution(v, self, unit, items, features)
        return v


def contribution(items: Mapping[int, float], features: FloatArray) -> tuple[FloatArray, dict[int, float]]:
    """One user's tick: ``(pool block, item shares)`` before the layout's weights (trusted math).

    ``items`` maps each item the user listened to (or acted on with a reward) to its summed reward (an item beyond
    ``features``' rows counts with a zero context); the tick counts
    ``c = min(1, sum of rewards)``; the pool block is ``c [x_mean, 1] / sqrt(2)`` with ``x_mean`` the reward-weighted
    mean of the items' contexts (clipped to norm 1), the item shares ``c w_a / sum(w)``.

    >>> F = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> pool, shares = contribution({0: 1.0, 1: 1.0}, F)
    >>> pool.round(4).tolist(), shares
    ([0.3536, 0.3536, 0.7071], {0: 0.5, 1: 0.5})
    >>> float(np.linalg.norm(contribution({0: 0.25}, F)[0])) <= 1.0
    True
    """
    w, total, c = _tick_weights(items)
    d = features.shape[1]
    if total <= 0:
        return np.zeros(d + 1), {}
    shares = {a: c * r / total for a, r in w.items()}
    xs = np.zeros(d)
    for a, r in w.items():
        if a >= len(features):  # an item the contexts do not cover yet (added to an open catalog): a zero context
            continue
        xs += r * _clipped_context(features[a])
    pool = np.empty(d + 1)
    pool[:d] = xs / total
    pool[d] = 1.0
    pool *= c * _H
    return pool, shares


def _clipped_context(x: FloatArray) -> FloatArray:
    """An item's context clipped to norm 1 (the one computation :func:`contribution` and :func:`add_contributions`
    share, so that both give the same bits)."""
    n = float(np.linalg.norm(x))
    out: FloatArray = x / n if n > 1.0 else x
    return out


def item_shares(items: Mapping[int, float]) -> dict[int, float]:
    """One user's tick as item shares, ``c w_a / sum(w)`` with ``c = min(1, sum of rewards)`` (the items block of
    :func:`contribution`; L1 and L2 norm ``<= 1``).

    >>> item_shares({3: 2.0, 5: 2.0, 7: 0.0})
    {3: 0.5, 5: 0.5}
    """
    w, total, c = _tick_weights(items)
    return {a: c * r / total for a, r in w.items()} if total > 0 else {}


def _tick_weights(items: Mapping[int, float]) -> tuple[dict[int, float], float, float]:
    """A tick's positive rewards by item, their total and the tick's weight ``c = min(1, total)``."""
    w = {int(a): float(r) for a, r in items.items() if r > 0}
    total = sum(w.values())
    return w, total, min(1.0, total)


def add_contribution(v: FloatArray, layout: HierarchyLayout, unit: int, items: Mapping[int, float],
                     features: FloatArray) -> None:
    """Add one user's tick to the weighted exact vector ``v`` (in place)."""
    pool, shares = contribution(items, features)
    if not shares:
        return
    sl = layout.slice("pool")
    v[sl] += layout.weight("pool") * pool
    if "items" in layout.blocks:
        s, w = layout.slice("items"), layout.weight("items")
        for a, share in shares.items():
            v[s.start + a] += w * share
    if layout.units:
        s, w = layout.slice("units"), layout.weight("units")
        start = s.start + unit * (layout.d + 1)
        v[start:start + layout.d + 1] += w * pool


def add_contributions(v: FloatArray, layout: HierarchyLayout, units: NDArray[np.int64], starts: NDArray[np.int64],
                      items: NDArray[np.int64], rewards: FloatArray, features: FloatArray) -> None:
    """Add many users' ticks to ``v`` (in place): the same bits as :func:`add_contribution` for each user in turn.

    User ``i`` (of unit ``units[i]``) holds the items ``items[starts[i]:starts[i + 1]]`` with their summed rewards
    ``rewards[...]``, in the order :func:`add_contribution` would see them (``starts`` has one entry more than
    ``units``). Every sum is taken in the users' order (``np.add.at`` applies repeated indices one after the
    other), and each user's terms are the same floating-point operations as :func:`contribution`'s, so the vector
    is equal bit for bit, not merely up to rounding; the release's offline twin relies on it.

    >>> F = np.array([[1.0, 0.0], [0.0, 3.0]])
    >>> layout = HierarchyLayout(d=2, n_items=3, n_units=2, shares={"pool": 0.5, "items": 0.5, "units": 0.5})
    >>> ticks = [(1, {0: 1.0, 1: 0.5}), (0, {2: 0.0}), (1, {1: 2.0, 2: 1.0})]
    >>> v = np.zeros(layout.dim)
    >>> add_contributions(v, layout, np.array([1, 0, 1]), np.array([0, 2, 3, 5]), np.array([0, 1, 2, 1, 2]),
    ...                   np.array([1.0, 0.5, 0.0, 2.0, 1.0]), F)
    >>> v.tobytes() == layout.exact_vector(ticks, F).tobytes()
    True
    """
    n_users = len(units)
    owner = np.repeat(np.arange(n_users), np.diff(starts))
    positive = rewards > 0  # _tick_weights: only positive rewards count
    owner, a, r = owner[positive], np.asarray(items, dtype=np.int64)[positive], rewards[positive]
    live = np.flatnonzero(np.bincount(owner, minlength=n_users))  # users with a positive reward: total > 0
    if not len(live):
        return
    owner = np.searchsorted(live, owner)  # the pairs' users, numbered among the live ones
    unit = np.asarray(units, dtype=np.int64)[live]
    total = np.zeros(len(live))
    np.add.at(total, owner, r)  # 0.0 + r_1 + r_2 + ...: Python's sum, in the same order
    c = np.minimum(1.0, total)
    shares = c[owner] * r / total[owner]
    d, m = layout.d, len(live)
    # column 0: v's pool block; column 1 + i: live user i's pool block, built in place (users along the rows, so
    # that the block's sum over users is one accumulate along contiguous memory)
    buf = np.empty((d + 1, m + 1))
    buf[:, 0] = v[layout.slice("pool")]
    pool = buf[:, 1:]
    pool[:d] = 0.0
    covered = a < len(features)  # an item beyond the contexts: a zero context (contribution)
    if covered.any():
        owner_c = owner[covered]
        distinct, which = np.unique(a[covered], return_inverse=True)
        contexts = np.array([_clipped_context(features[i]) for i in distinct.tolist()]).reshape(len(distinct), d)
        terms = contexts.T[:, which] * r[covered]  # r x, one column per pair
        # xs += r x item after item: all users' i-th items at once (the pairs are in their users' order)
        sizes = np.bincount(owner_c)
        rank = np.arange(len(owner_c)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        by_rank = np.argsort(rank, kind="stable")
        lo = 0
        for n in np.bincount(rank).tolist():
            pick = by_rank[lo:lo + n]
            pool[:d, owner_c[pick]] += terms[:, pick]  # one pair per user: no repeated index
            lo += n
    pool[:d] /= total  # x_mean
    pool[d] = 1.0
    pool *= c * _H
    if layout.units:
        s, w = layout.slice("units"), layout.weight("units")
        add_rows_in_order(v[s].reshape(layout.n_units, d + 1), unit, (w * pool).T)
    pool *= layout.weight("pool")
    # accumulate: each partial sum is the one before plus the next user's block (never pairwise, unlike sum)
    v[layout.slice("pool")] = np.add.accumulate(buf, axis=1, out=buf)[:, -1]
    if "items" in layout.blocks:
        s, w = layout.slice("items"), layout.weight("items")
        np.add.at(v, s.start + a, w * shares)


def add_rows_in_order(out: FloatArray, rows: NDArray[np.int64], terms: FloatArray) -> None:
    """``out[rows[i]] += terms[i]`` for each ``i`` in turn (in place): each row's sum is taken in that order, so it
    is equal bit for bit to the loop's (``np.add.at`` is too, but slow on rows).

    >>> out = np.array([[1.0, 0.0], [0.0, 0.0]])
    >>> add_rows_in_order(out, np.array([0, 1, 0]), np.array([[1e16, 1.0], [2.0, 2.0], [-1e16, 3.0]]))
    >>> out.tolist()  # (1 + 1e16) - 1e16: the order the loop adds in
    [[0.0, 4.0], [2.0, 2.0]]
    """
    if not len(rows):
        return
    terms = terms.reshape(len(rows), -1)
    order = np.argsort(rows, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(rows[order]) != 0, True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        pick = order[lo:hi]
        row = int(rows[pick[0]])
        column = np.empty((terms.shape[1], hi - lo + 1))
        column[:, 0] = out[row].reshape(-1)
        column[:, 1:] = terms[pick].T
        # accumulate: each partial sum is the one before plus the next term (never pairwise, unlike sum)
        out[row] = np.add.accumulate(column, axis=1)[:, -1].reshape(out.shape[1:])


@dataclass(frozen=True)
class ReleasedHierarchy:
    """The released blocks, unweighted, with their public noise stds (``0``: no noise).

    ``pool`` is ``[sum of the ticks' mean contexts, count] / sqrt(2)`` (so ``count = sqrt(2) pool[d]``), ``items``
    the items' summed shares, ``units`` the per-unit pool blocks (``None`` when that block is off).
    """

    pool: FloatArray
    items: FloatArray | None
    units: FloatArray | None
    std_pool: float
    std_items: float
    std_units: float
    version: int = 0

    SCHEMA = "privrec.ReleasedHierarchy/1"

    @classmethod
    def from_vector(cls, layout: HierarchyLayout, y: FloatArray, *, std: float, version: int = 0
                    ) -> ReleasedHierarchy:
        """Unweight a released vector ``y`` whose noise has std ``std`` per coordinate."""
        def block(name: str) -> tuple[FloatArray | None, float]:
            if name not in layout.blocks:
                return None, 0.0
            w = layout.weight(name)
            return np.asarray(y[layout.slice(name)], dtype=np.float64) / w, std / w

        pool, sp = block("pool")
        items, si = block("items")
        units, su = block("units")
        assert pool is not None
        return cls(pool, items, None if units is None else units.reshape(layout.n_units, layout.d + 1), sp, si, su,
                   int(version))

    @classmethod
    def from_sums(cls, b: FloatArray, count: float, std_b: float, items: FloatArray | None = None,
                  std_items: float = 0.0, version: int = 0) -> ReleasedHierarchy:
        """The pooled block from a released context sum ``b`` (noise std ``std_b`` per coordinate) and an exact
        count, and the item counts if any; no unit block (local mode's population-wide releases).

        >>> rel = ReleasedHierarchy.from_sums(np.array([3.0, 1.0]), 4.0, 0.5)
        >>> rel.count, round(rel.std_pool * math.sqrt(2), 12)
        (4.0, 0.5)
        """
        pool = np.r_[np.asarray(b, dtype=np.float64), float(count)] * _H
        return cls(pool, None if items is None else np.asarray(items, dtype=np.float64), None, float(std_b) * _H,
                   float(std_items), 0.0, int(version))

    @property
    def d(self) -> int:
        return int(self.pool.shape[0]) - 1

    @property
    def count(self) -> float:
        """The released count of user ticks (noisy)."""
        return float(self.pool[-1]) / _H

    def to_mapping(self) -> dict[str, bytes]:
        arrays: dict[str, NDArray[Any]] = {"pool": self.pool}
        if self.items is not None:
            arrays["items"] = self.items
        if self.units is not None:
            arrays["units"] = self.units
        return encode_arrays(arrays, scalars={"std_pool": self.std_pool, "std_items": self.std_items,
                                              "std_units": self.std_units, "version": self.version},
                             schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str | bytes, bytes]) -> ReleasedHierarchy:
        a, s = decode_arrays(mapping, schema=cls.SCHEMA)

        def f(name: str) -> FloatArray | None:
            return None if name not in a else a[name].astype(np.float64)

        pool = f("pool")
        assert pool is not None
        return cls(pool, f("items"), f("units"), float(s["std_pool"] or 0.0), float(s["std_items"] or 0.0),
                   float(s["std_units"] or 0.0), int(s["version"] or 0))


@dataclass(frozen=True)
class HierarchyModel:
    """Serving models from a :class:`ReleasedHierarchy`: ``theta (N, d)``, ``M (N, d, d)``, ``item_scores (K,)``.

    ``theta_u`` is the pooled tilt plus the unit's deviation, ``item_scores`` each item's ``log(p(a) / p_pool(a))``:
    ``x_a . theta_u + item_scores[a]`` ranks a unit's candidates as ``log p(a | u)`` does.
    """

    theta: FloatArray
    M: FloatArray
    item_scores: FloatArray
    info: dict[str, float]


def _rates(F: FloatArray, theta: FloatArray) -> FloatArray:
    """The tilt ``p(a) ∝ exp(x_a . theta)`` over the catalog."""
    z = F @ theta
    p: FloatArray = np.exp(z - z.max())
    p /= p.sum()
    return p


def _tilt(F: FloatArray, theta: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(p, mu, Sigma)`` of the tilt ``p(a) ∝ exp(x_a . theta)`` over the catalog."""
    p = _rates(F, theta)
    mu = p @ F
    S = (F * p[:, None]).T @ F - np.outer(mu, mu)
    return p, mu, S


def _fit_scale(f: FloatArray, y: float, n: float, sigma2: float, *, prior: float = 1.0, prior_var: float = 1.0
               ) -> float:
    """The prior's scale ``c``: the posterior mode of ``y = u_0 . b ~ N(n E_c[f], n Var_c[f] + sigma^2)`` with
    ``c ~ N(prior, prior_var)`` (``f = F u_0``); Newton with the variance held at each step."""
    if n <= 0:
        return prior
    c = prior
    for _ in range(50):
        m, v = _scale_moments(f, c)
        var = n * v + sigma2 + 1e-12
        g = n * v * (y - n * m) / var - (c - prior) / prior_var
        h = (n * v) ** 2 / var + 1.0 / prior_var
        step = float(np.clip(g / h, -2.0, 2.0))
        c += step
        if abs(step) < 1e-8:
            break
    return c


def _scale_moments(f: FloatArray, c: float) -> tuple[float, float]:
    """``(E_c[f], Var_c[f])`` under the tilt ``p(a) ∝ exp(c f_a)`` (``f = F u_0``)."""
    z = c * f
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    m = float(p @ f)
    return m, float(p @ (f - m) ** 2)


def _scale_loglik(f: FloatArray, y: float, n: float, sigma2: float, c: float) -> float:
    """Log-likelihood of ``y = u_0 . b ~ N(n E_c[f], n Var_c[f] + sigma^2)`` at the scale ``c`` (up to a constant)."""
    m, v = _scale_moments(f, c)
    var = n * v + sigma2 + 1e-12
    return -0.5 * (math.log(var) + (y - n * m) ** 2 / var)


def prior_scale(f: FloatArray, y: float, n: float, sigma2: float) -> float:
    """The prior's scale ``c`` (level 1): fitted (:func:`_fit_scale`), but ``c <= 0`` only on evidence.

    A positive scale keeps the prior's order, whatever its size, and its size is the anchor the pooled tilt starts
    from, so it is taken as fitted. A scale at or below 0 flattens or reverses the order: it is taken only where its
    log-likelihood beats ``c = 1``'s by :data:`LIKELIHOOD_MARGIN` (a likelihood-ratio test at :data:`LEVEL`), as every
    other level leaves the one above only on evidence; else ``c = 1``. Without the test a few noisy reports could
    reverse the prior's order.

    >>> f = np.linspace(-1.0, 1.0, 50)
    >>> round(_fit_scale(f, -20.0, 100.0, 400.0), 3), prior_scale(f, -20.0, 100.0, 400.0)  # weak evidence: kept at 1
    (-0.157, 1.0)
    >>> round(prior_scale(f, -300.0, 1000.0, 1.0), 2)   # a thousand listens against it: reversed
    -0.91
    >>> round(prior_scale(f, 300.0, 1000.0, 1.0), 2)    # along it: any positive scale keeps the order
    0.91
    """
    c = _fit_scale(f, y, n, sigma2)
    if c <= 0 and _scale_loglik(f, y, n, sigma2, c) - _scale_loglik(f, y, n, sigma2, 1.0) <= LIKELIHOOD_MARGIN:
        return 1.0
    return c


#: The probability, per release, that a level moves off the one above on pure noise (a false alarm): the pooled
#: level's likelihood margin (:data:`LIKELIHOOD_MARGIN`), the items' threshold (:func:`clear_threshold`) and the
#: units' test (:func:`units_prior_variance`) are all at this level. Not tuned: it is the pooled margin's 99 %.
LEVEL = 0.01
#: The grid of prior variances the type-II likelihood is maximised over (0: the prior alone).
#: ``tau^2`` is the smallest variance whose log-likelihood is within this margin of the maximum: a level moves away
#: from the one above only as far as the data insist (chi-square(1) 99 % / 2 = 3.32; 0 would be the maximum). At 1.35
#: (90 %) LastFM's held-out window fell 0.03 below the prior's ranking at epsilon 1 and 2 (docs/hierarchy.md).
LIKELIHOOD_MARGIN = 3.32
TAU_GRID = np.concatenate([[0.0], np.logspace(-6, 4, 81)])


def eb_prior_variance(r: FloatArray, A: FloatArray, sigma2: float) -> float:
    """``tau^2`` maximising the likelihood of ``r ~ N(0, tau^2 A^2 + A + sigma^2 I)`` (type-II ML, on a grid).

    >>> A = np.eye(3) * 100.0
    >>> eb_prior_variance(np.zeros(3), A, 1.0)
    0.0
    >>> eb_prior_variance(np.full(3, 50.0), A, 1.0) > 0
    True
    """
    lam, Q = np.linalg.eigh(A)
    lam = np.maximum(lam, 0.0)
    rr = (Q.T @ r) ** 2
    v = TAU_GRID[:, None] * lam[None, :] ** 2 + lam[None, :] + sigma2 + 1e-12
    ll = -0.5 * np.sum(np.log(v) + rr[None, :] / v, axis=1)
    # the smallest variance the data do not reject: within the margin of the maximum (a one-sided likelihood interval)
    return float(TAU_GRID[int(np.flatnonzero(ll >= ll.max() - LIKELIHOOD_MARGIN)[0])])


def units_prior_variance(R: FloatArray, nu: FloatArray, S: FloatArray, su2: float, level: float = LEVEL) -> float:
    """``tau^2`` of the units' deviations by the method of moments, where the residuals' excess energy is significant.

    ``R (N, d)`` are the units' residuals ``b_u - n_u mu``, ``nu (N,)`` their released counts, ``S (d, d)`` the
    pooled model's covariance of a context, ``su2`` the unit block's noise variance. The moment estimate is
    ``num / den`` with ``num = sum ||R_u||^2 - sum tr V_u`` and ``den = sum n_u^2 tr(S S)``, ``V_u = n_u S + su2 I``
    (``E num = tau^2 den``; Efron & Morris 1975). With no deviation (``tau^2 = 0``) ``R_u ~ N(0, V_u)`` and
    ``sum ||R_u||^2`` has mean ``m1 = sum tr V_u`` and variance ``2 m2``, ``m2 = sum tr V_u^2``: Satterthwaite's
    ``g chi2_h`` with the same two moments (``g = m2 / m1``, ``h = m1^2 / m2``), its ``1 - level`` quantile by
    Wilson–Hilferty. The level is on, at ``num / den``, only where ``sum ||R_u||^2`` exceeds that quantile; else 0,
    so that under pure noise every unit stays at the pooled model with probability about ``1 - level`` (the plain
    ``max(num / den, 0)`` is positive half the time).

    >>> S, nu, rng = np.eye(2) * 0.5, np.full(10, 100.0), np.random.default_rng(0)
    >>> units_prior_variance(rng.normal(scale=math.sqrt(51.0), size=(10, 2)), nu, S, 1.0)   # pure noise: V_u = 51 I
    0.0
    >>> round(units_prior_variance(rng.normal(scale=20.0, size=(10, 2)), nu, S, 1.0), 3)   # far beyond it
    0.058
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"`level` must be in (0, 1), got {level}.")
    N, d = R.shape
    trS, trSS = float(np.trace(S)), float(np.sum(S * S))
    den = float(np.sum(nu ** 2) * trSS)
    if den <= 0:
        return 0.0
    energy = float(np.sum(R * R))
    m1 = float(np.sum(nu) * trS + N * d * su2)
    m2 = float(np.sum(nu ** 2 * trSS + 2.0 * nu * su2 * trS + d * su2 ** 2))  # tr V_u^2, summed
    g, h = m2 / m1, m1 * m1 / m2
    z = NormalDist().inv_cdf(1.0 - level)
    if energy <= g * h * (1.0 - 2.0 / (9.0 * h) + z * math.sqrt(2.0 / (9.0 * h))) ** 3:
        return 0.0
    return (energy - m1) / den


def _fit_pooled(F: FloatArray, b: FloatArray, n: float, sigma2: float, prior: FloatArray, tau2: float,
                iters: int = 8) -> tuple[FloatArray, FloatArray]:
    """Gauss-Newton posterior mode of the tilt and its covariance (see the module docstring, level 2)."""
    d = F.shape[1]
    if tau2 <= 0 or n <= 0:
        return prior.copy(), np.zeros((d, d))
    theta = prior.copy()
    I = np.eye(d)
    H = I / tau2
    for _ in range(iters):
        _, mu, S = _tilt(F, theta)
        J = n * S
        W = np.linalg.inv(J + (sigma2 + 1e-9) * I)
        JW = J @ W
        H = JW @ J + I / tau2
        g = JW @ (b - n * mu) - (theta - prior) / tau2
        step = np.linalg.solve(H, g)
        norm = float(np.linalg.norm(step))
        if norm > 3.0:
            step *= 3.0 / norm
        theta = theta + step
        if norm < 1e-7:
            break
    cov = np.linalg.inv(H)
    return theta, 0.5 * (cov + cov.T)


#: The fractions of a residual kept below the threshold that :func:`sure_shrinkage` chooses among.
BETAS = np.linspace(0.0, 1.0, 21)


def sure_shrinkage(r: FloatArray, sigma: float) -> tuple[float, float]:
    """``(beta, t)`` of ``f(r) = beta r + (1 - beta) soft(r, t)`` minimising Stein's unbiased risk estimate.

    ``r`` are residuals with Gaussian noise ``sigma``; ``t`` ranges over ``[0, sigma sqrt(2 ln K)]`` (the universal
    threshold: beyond it no residual of pure noise passes) and ``beta`` over :data:`BETAS`. The family holds the
    soft threshold (``beta = 0``; Donoho & Johnstone 1995, sparse signals) and the residual kept whole (``beta = 1``,
    dense signals); SURE is ``sum (1 - beta)^2 min(r^2, t^2) + 2 sigma^2 (beta K + (1 - beta) #{|r| > t}) - K sigma^2``.

    >>> noise = np.random.default_rng(0).normal(size=1000)
    >>> beta, t = sure_shrinkage(noise, 1.0)       # nothing but noise: nothing kept
    >>> beta, t > 2.0
    (0.0, True)
    >>> sure_shrinkage(np.full(100, 50.0), 1.0)    # every residual far above the noise: all kept
    (0.0, 0.0)
    """
    K = len(r)
    if sigma <= 0 or K == 0:
        return 1.0, 0.0
    tmax = sigma * math.sqrt(2.0 * math.log(max(K, 2)))
    a = np.sort(np.abs(r))
    cand = np.concatenate([[0.0], a[a <= tmax], [tmax]])
    cs = np.concatenate([[0.0], np.cumsum(a ** 2)])
    idx = np.searchsorted(a, cand, side="right")
    below = cs[idx] + (K - idx) * cand ** 2   # sum of min(r^2, t^2)
    above = K - idx
    best = (math.inf, 0.0, tmax)
    for beta in BETAS:
        risk = (1.0 - beta) ** 2 * below + 2.0 * sigma**2 * (beta * K + (1.0 - beta) * above) - K * sigma**2
        i = int(np.argmin(risk))
        if risk[i] < best[0] - 1e-9:
            best = (float(risk[i]), float(beta), float(cand[i]))
    return best[1], best[2]


def clear_threshold(k: int, sigma: float, level: float = LEVEL) -> float:
    """``t`` with ``P(max of k independent N(0, sigma^2) > t) = level``: ``sigma z``, ``Phi(z)^k = 1 - level``.

    No item of pure noise clears it, with probability ``1 - level`` per release, whatever ``k`` (Šidák's
    correction, one-sided: only counts above the prediction are evidence of popularity). The universal threshold
    ``sigma sqrt(2 ln k)``, which it replaces as the item level's test, is cleared by noise alone at 8–10 % of
    releases for ``k`` from 1,000 to 20,000 items (that probability falls only as ``1 / sqrt(ln k)``).

    >>> round(clear_threshold(12_523, 1.0), 3), round(math.sqrt(2 * math.log(12_523)), 3)
    (4.798, 4.344)
    >>> round(clear_threshold(1, 2.0), 3)    # one item: the one-sided 99 % quantile
    4.653
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"`level` must be in (0, 1), got {level}.")
    if k < 1 or sigma <= 0:
        return 0.0
    # 1 - (1 - level)^(1/k), computed without cancellation (it is ~level / k)
    tail = -math.expm1(math.log1p(-level) / k)
    return float(sigma) * -NormalDist().inv_cdf(tail)


#: Where the item level is on (an item clears :func:`clear_threshold`), the share of the released count by which
#: items' residuals clear the universal threshold ``sigma sqrt(2 ln K)`` (only the excess counts) above which the
#: item counts are kept whole
#: (``beta = 1``): popularity concentrated enough to stand out of the noise ranks better on the counts than on any
#: shrinkage toward the content model; below it, :func:`sure_shrinkage`. Measured on held-out windows
#: (docs/hierarchy.md): 0 on LastFM at user level, 0.1–0.5 on the synthetic catalogs. Post-processing.
CLEAR_MASS = 0.05
#: Where no item clears :func:`clear_threshold`, the item level says nothing (content alone) rather than SURE's
#: threshold, which lets about 1 % of pure-noise items through (each one a spurious top pick in its pools).
#: An item's rate never drops below this share of the content model's prediction (a released count within the
#: noise of zero does not make an item impossible).
FLOOR = 0.1
#: Where the item level is on and the excess falls short of :data:`CLEAR_MASS`, the counts are also kept whole where
#: the residuals' total excess over the universal threshold reaches this many noise standard deviations and the
#: content model does not rank the items that clear it above its median (:func:`content_percentile` <= 0.5): those
#: items are popular beyond the noise, so where content puts them no higher than a coin would, content is no guide
#: to the rest either, and the counts rank them. A false alarm of pure noise (the largest of ``K`` residuals past
#: :func:`clear_threshold`) carries 0.66–0.78 sd of excess on average and reaches 1 sd at 7–15 % of its false
#: alarms: 0.07–0.15 % of pure-noise releases, for ``K`` from 1,000 to 12,523 (simulated, 200,000 releases each),
#: and of those, half again by the median. Held out (docs/hierarchy.md): on the synthetic tagged catalog, where the
#: items that clear sit at content's 29th–43rd percentile (medians over a run's ticks) and SURE's soft threshold
#: ranked every other item by content (worse than random play there), +0.04–0.55 at ε ≤ 2 (federated ε ≤ 4); on
#: LastFM, where they sit at its 93rd–97th (never below the 58th), and on the population, nothing moves. Without
#: the content condition LastFM's held-out 20,000 events fell from 2.61 to 2.26 at ε = 8 (the counts of 12,500
#: artists ranked by their noise). Post-processing.
CLEAR_EXCESS = 1.0


def item_floor(features: FloatArray, theta: FloatArray, count: float) -> FloatArray:
    """``FLOOR m_a``, the item level's floor, where ``m_a = count p_pool(a)`` is the pooled tilt ``theta``'s
    prediction of item ``a``'s count (as :func:`solve_hierarchy` computes it). Without noise the item level keeps
    each count whole, ``lambda_a = max(count_a, FLOOR m_a)``: a new count moves its own item's term alone.

    >>> item_floor(np.eye(2), np.zeros(2), 40.0).tolist()   # a flat tilt: each of 2 items predicted 20 listens
    [2.0, 2.0]
    """
    return FLOOR * float(count) * _rates(np.asarray(features, dtype=np.float64), np.asarray(theta, dtype=np.float64))


def content_percentile(p: FloatArray, items: NDArray[np.int64]) -> float:
    """The mean percentile of ``items`` in the content model's ranking ``p`` (0: its last, 1: its first; ties share
    their middle rank, so a content model that tells no item apart puts every item at 0.5).

    >>> content_percentile(np.array([0.1, 0.2, 0.3, 0.4, 0.5]), np.array([4, 3]))
    0.875
    >>> content_percentile(np.full(4, 0.25), np.array([0]))
    0.5
    """
    k = len(p)
    if k < 2 or len(items) == 0:
        return 0.5
    order = np.sort(p)
    below = np.searchsorted(order, p[items], side="left")
    upto = np.searchsorted(order, p[items], side="right")
    return float(np.mean((below + upto - 1) / 2.0) / (k - 1))


def solve_hierarchy(rel: ReleasedHierarchy, features: FloatArray, *, n_units: int = 1, u0: FloatArray | None = None
                    ) -> HierarchyModel:
    """Serving models from released blocks and the public catalog (module docstring, levels 1–4).

    ``n_units``: the rows of ``theta`` and ``M`` when the release has no unit block (every unit is then served the
    pooled model); with a unit block, its own number of units. Item counts beyond the catalog's rows (capacity an
    open catalog has not filled) are not used; ``item_scores`` has one entry per catalog row.
    """
    F = np.asarray(features, dtype=np.float64)
    K, d = F.shape
    if rel.d != d:
        raise ValueError(f"the release has contexts of length {rel.d}, the catalog {d}.")
    if rel.items is not None and rel.items.shape[0] > K:  # capacity an open catalog does not fill (yet): not covered
        rel = replace(rel, items=rel.items[:K])
    u0 = prior_direction(F) if u0 is None else np.asarray(u0, dtype=np.float64)
    n = max(rel.count, 0.0)
    b = rel.pool[:d] / _H
    sigma2 = (rel.std_pool / _H) ** 2
    # 1. the prior's scale along u_0
    c = prior_scale(F @ u0, float(u0 @ b), n, sigma2) if n > 0 else 1.0
    prior = c * u0
    # 2. the pooled tilt
    tau0 = 0.0
    if n > 0:
        _, mu0, S0 = _tilt(F, prior)
        tau0 = eb_prior_variance(b - n * mu0, n * S0, sigma2)
    theta, cov = _fit_pooled(F, b, n, sigma2, prior, tau0)
    p_pool, mu, S = _tilt(F, theta)
    p = p_pool
    info = {"count": n, "prior_scale": c, "tau0_sq": tau0}
    # 3. the items
    if rel.items is not None and n > 0:
        k = rel.items.shape[0]
        m = n * p[:k]
        r = rel.items - m
        # the test: does any item depart from the content model? No item of pure noise clears `clear` (at LEVEL)
        clear = clear_threshold(k, rel.std_items)
        signal = k > 0 and float(r.max()) > clear
        universal = rel.std_items * math.sqrt(2.0 * math.log(max(k, 2)))
        excess = float(np.maximum(r - universal, 0.0).sum()) if signal else 0.0
        clear_mass = excess / n
        clear_sd = excess / rel.std_items if rel.std_items > 0 else 0.0  # no noise: SURE keeps every residual whole
        whole = signal and clear_mass >= CLEAR_MASS  # popularity stands out of the noise: the counts, kept whole
        if signal and not whole and clear_sd >= CLEAR_EXCESS:  # or it stands out where content does not see it
            info["item_clear_pct"] = pct = content_percentile(p_pool[:k], np.flatnonzero(r > universal))
            whole = pct <= 0.5
        if whole:
            beta, t = 1.0, 0.0
        elif signal:
            beta, t = sure_shrinkage(r, rel.std_items)
        else:  # no item clears the test: nothing in the counts is told from noise; content alone
            beta, t = 0.0, math.inf
        info["item_clear_mass"] = clear_mass
        info["item_clear_sd"] = clear_sd
        lam = np.maximum(m + beta * r + (1.0 - beta) * np.sign(r) * np.maximum(np.abs(r) - t, 0.0), FLOOR * m)
        q = p.copy()
        q[:k] = lam / max(n, 1e-300)
        p = q / q.sum()
        mu = p @ F
        S = (F * p[:, None]).T @ F - np.outer(mu, mu)
        info["item_threshold_sd"] = t / rel.std_items if rel.std_items > 0 and math.isfinite(t) else 0.0
        info["item_kept_below"] = beta
    # the item term: log(p(a) / p_pool(a)), the item's departure from the pooled content model (0: none; an item
    # the release does not cover, e.g. one added to an open catalog after it, is served by content alone)
    residual = np.log(np.maximum(p, 1e-300) / np.maximum(p_pool, 1e-300))
    # 4. the units
    N = int(n_units) if rel.units is None else rel.units.shape[0]
    delta = np.zeros((N, d))
    M = np.broadcast_to(cov, (N, d, d)).copy()
    if rel.units is not None:
        bu = rel.units[:, :d] / _H
        nu = np.maximum(rel.units[:, d] / _H, 0.0)
        su2 = (rel.std_units / _H) ** 2
        R = bu - nu[:, None] * mu[None, :]
        A = nu[:, None, None] * S[None]
        tau2 = units_prior_variance(R, nu, S, su2)
        info["tau_units_sq"] = tau2
        if tau2 > 0:
            I = np.eye(d)
            V = tau2 * np.einsum("uab,ubc->uac", A, A) + A + (su2 + 1e-9) * I
            Kg = tau2 * np.einsum("uab,ubc->uac", A, np.linalg.inv(V))
            delta = np.einsum("uab,ub->ua", Kg, R)
            M = M + tau2 * I - tau2 * np.einsum("uab,ubc->uac", Kg, A)
    M = 0.5 * (M + M.transpose(0, 2, 1))
    return HierarchyModel(theta[None, :] + delta, M, residual, info)
