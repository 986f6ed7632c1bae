"""Local mode's item statistic: one-hot item reports with a blanket of fake messages, shuffled.

The item term (how many positives each item got, :mod:`models.ground.items`) is a histogram over the
whole catalog (``K`` items, 12,523 on LastFM). A single-message local randomizer (k-RR) over ``K``
values cannot hide a rare item among fewer than ``K`` users (Ghazi et al. 2021: error
``Omega(min(n^{1/4}, sqrt(K)))`` for one message per user), so a device sends several *messages*:

* its item, as one message ``a``, with probability ``r`` (the reward, in ``[0, 1]``; LastFM's is 0/1):
  one-hot, nothing else identifies it;
* a **blanket**: for every item ``j`` of the catalog, independently, a fake message ``j`` with
  probability ``p`` (:meth:`ItemBlanket.randomize`; in practice ``Bin(K, p)`` distinct random items).

The shuffler mixes the messages of ``n`` distinct users (one report each) — every message on its own, with
no user, no version and no order — and the analyzer sees only the histogram ``h`` of the messages:
``h_j = s_j + N_j`` with ``s_j`` the batch's positives of item ``j`` and ``N_j ~ Bin(n, p)``
independent across items. :meth:`ItemBlanket.estimate` removes the known mean: ``h - n p`` is unbiased
with variance ``n p (1 - p)`` per item, *whatever* ``K``. This is the shuffled histogram protocol of
Balcer & Cheu, "Separating Local & Shuffled Differential Privacy via Histograms" (ITC 2020,
arXiv:1911.06879, Section 3), whose error does not depend on the domain size.

Privacy (the analysis here; Balcer & Cheu give a sufficient condition, this module computes the
exact trade-off numerically). Neighbours replace one user's report of the batch: another item, or none.
The worst case moves one message from item ``a`` to item ``b`` (a one-item change is a marginal of it),
so one batch is the pair ``P = (X + 1, Y)``, ``Q = (X, Y + 1)`` with ``X, Y ~ Bin(n, p)`` independent
(every other item's count has the same law under both). Its privacy loss under ``P`` is
``L = log((X + 1)(1 - p) / ((n - X) p)) + log((n - Y + 1) p / (Y (1 - p)))`` (``+inf`` when ``X = n``
or ``Y = 0``: ``Q`` cannot produce it), and by the symmetry ``a <-> b`` the reverse direction has the
same law. ``delta(epsilon) = P(L = inf) + E[(1 - e^{epsilon - L})_+]`` (the hockey-stick divergence).
A user at user level is in at most ``cap`` batches per epoch (one report per batch, ``cap`` reports per
epoch: the device's contribution cap), so the epoch's guarantee is the ``cap``-fold composition of that
pair: ``L`` summed over ``cap`` independent copies (:func:`blanket_delta`, by convolution of the loss
distribution on a grid of step ``grid``, every loss rounded *up*: an upper bound on ``delta``). The
fakes of the user's own report count in the blanket (they are independent of the user's data); a
party that colludes with ``c`` users of the batch removes their fakes (``n - c`` in the bound).

Against the operator of the shuffler (who sees who sent which encrypted messages) nothing is hidden
by the shuffle; against the analyzer (who sees the messages, not who sent them) the guarantee above
holds. The fakes cost ``K p`` messages per report: ``p`` falls as ``1 / n``, so large batches are cheap.

Examples
--------
>>> blanket = ItemBlanket(n_items=1000, batch=500, epsilon=2.0, delta=1e-5, cap=1)
>>> round(blanket.p * blanket.batch, 1)        # fake messages per item per batch (the blanket's mean)
14.5
>>> g = blanket.guarantee()
>>> g.epsilon <= 2.0, g.delta
(True, 1e-05)
>>> msgs = blanket.randomize(3, reward=1.0, rng=np.random.default_rng(0))
>>> 3 in msgs.tolist(), len(msgs) < 40
(True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy import signal, stats

__all__ = ["ItemBlanket", "BlanketGuarantee", "blanket_delta", "blanket_epsilon", "blanket_reaches", "calibrate_blanket",
           "codebook", "nearest_code", "pair_losses", "smallest_batch", "ITEM_STREAM", "MAX_P"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Noise stream of a device's item messages (keyed by the device's seed and the report's version).
ITEM_STREAM = 2
#: Grid of the privacy loss (nats): every loss is rounded up to a multiple, so ``delta`` is an upper bound.
GRID = 1e-4
#: Probability mass of each binomial's tails left out of the loss distribution (added to ``delta``).
TAIL = 1e-15
#: The largest fake probability the calibration tries (half the catalog per report, per batch).
MAX_P = 0.5


def _check(n: int, p: float, compositions: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"`n` (distinct users in the batch) must be an integer >= 1, got {n!r}.")
    if not 0.0 < p < 1.0:
        raise ValueError(f"`p` (probability of a fake message per item) must be in (0, 1), got {p!r}.")
    if isinstance(compositions, bool) or not isinstance(compositions, (int, np.integer)) or compositions < 1:
        raise ValueError(f"`compositions` must be an integer >= 1, got {compositions!r}.")


def pair_losses(n: int, p: float) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, float]:
    """The two independent parts of one batch's privacy loss under ``P`` (see the module docstring).

    Returns ``(l1, w1, l2, w2, infinite)``: loss values and their probabilities for the item that
    gains the message (``X``) and the one that loses it (``Y``), restricted to the binomial's bulk
    (tails of mass ``<= TAIL`` each are counted in ``infinite``, with the outcomes ``Q`` cannot produce).

    Examples
    --------
    >>> l1, w1, l2, w2, inf = pair_losses(2, 0.5)
    >>> l1.round(4).tolist(), w1.round(4).tolist()   # X in {0, 1}: log((x + 1) / (2 - x))
    ([-0.6931, 0.6931], [0.25, 0.5])
    >>> inf                                        # P(X = 2) + P(Y = 0)
    0.5
    """
    _check(n, p, 1)
    lo = max(0, int(stats.binom.ppf(TAIL, n, p)) - 1)
    hi = min(n, int(stats.binom.isf(TAIL, n, p)) + 1)
    x = np.arange(lo, hi + 1, dtype=np.float64)
    w = stats.binom.pmf(x, n, p)
    odds = math.log((1.0 - p) / p)
    left_out = max(0.0, 1.0 - float(w.sum()))  # both tails
    m1 = x < n                                   # X = n: Q(X + 1 = n + 1) = 0
    l1 = np.log(x[m1] + 1.0) - np.log(n - x[m1]) + odds
    m2 = x >= 1                                  # Y = 0: Q needs Y + 1 >= 1 message
    l2 = np.log(n - x[m2] + 1.0) - np.log(x[m2]) - odds
    infinite = float(stats.binom.pmf(n, n, p) + stats.binom.pmf(0, n, p)) + 2.0 * left_out
    return l1, w[m1], l2, w[m2], min(1.0, infinite)


def _grid_pmf(losses: FloatArray, weights: FloatArray, grid: float) -> tuple[int, FloatArray]:
    """``(offset, pmf)``: the losses rounded up to the grid, as a pmf over ``offset + i`` grid steps."""
    idx = np.ceil(losses / grid).astype(np.int64)
    off = int(idx.min())
    pmf: FloatArray = np.bincount(idx - off, weights=weights).astype(np.float64)
    return off, pmf


@lru_cache(maxsize=512)
def _composed(n: int, p: float, compositions: int, grid: float) -> tuple[int, FloatArray, float]:
    l1, w1, l2, w2, infinite = pair_losses(n, p)
    o1, f1 = _grid_pmf(l1, w1, grid)
    o2, f2 = _grid_pmf(l2, w2, grid)
    off, pmf = o1 + o2, signal.fftconvolve(f1, f2)
    one_off, one = off, np.clip(pmf, 0.0, None)
    off, pmf = one_off, one
    for _ in range(compositions - 1):
        off, pmf = off + one_off, np.clip(signal.fftconvolve(pmf, one), 0.0, None)
    finite = 1.0 - (1.0 - infinite) ** compositions
    pmf.setflags(write=False)
    return off, pmf, finite


def blanket_delta(epsilon: float, n: int, p: float, *, compositions: int = 1, grid: float = GRID) -> float:
    """``delta`` at ``epsilon`` of ``compositions`` shuffled batches of ``n`` users, fakes with probability ``p``.

    An upper bound: losses rounded up to ``grid``, binomial tails counted as infinite loss.

    Parameters
    ----------
    epsilon : float
        Central ``epsilon``, ``>= 0``.
    n : int
        Distinct users in each batch (their fakes form the blanket).
    p : float
        Probability of a fake message per item per report.
    compositions : int, optional
        Batches a user is in (the device's cap per epoch).
    grid : float, optional
        Step of the loss grid (nats).

    Returns
    -------
    float

    Examples
    --------
    >>> round(blanket_delta(1.0, 100, 0.2), 4) < round(blanket_delta(1.0, 100, 0.1), 4)  # more fakes: less delta
    True
    """
    _check(n, p, compositions)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"`epsilon` must be a finite number >= 0, got {epsilon!r}.")
    off, pmf, infinite = _composed(int(n), float(p), int(compositions), float(grid))
    loss = (off + np.arange(len(pmf))) * grid
    mask = loss > epsilon
    hockey = float(np.dot(pmf[mask], -np.expm1(epsilon - loss[mask])))
    return min(1.0, infinite + hockey)  # the pmf holds only the finite losses' mass


def blanket_epsilon(n: int, p: float, delta: float, *, compositions: int = 1, grid: float = GRID) -> float:
    """Smallest ``epsilon`` (to ``1e-4``) with :func:`blanket_delta` ``<= delta``; ``inf`` if none below 50.

    Examples
    --------
    >>> e = blanket_epsilon(1000, 0.05, 1e-6, compositions=4)
    >>> blanket_delta(e, 1000, 0.05, compositions=4) <= 1e-6
    True
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.")
    hi = 50.0
    if blanket_delta(hi, n, p, compositions=compositions, grid=grid) > delta:
        return math.inf
    lo = 0.0
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        if blanket_delta(mid, n, p, compositions=compositions, grid=grid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_blanket(epsilon: float, delta: float, n: int, *, compositions: int = 1, grid: float = GRID) -> float:
    """Smallest fake probability ``p`` (within 0.5 %) whose ``compositions`` batches are ``(epsilon, delta)``-DP.

    Raises ``ValueError`` when even ``p = 1/2`` does not reach the target (too few users per batch).

    Examples
    --------
    >>> p = calibrate_blanket(1.0, 1e-6, 2000)
    >>> blanket_delta(1.0, 2000, p) <= 1e-6
    True
    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"`epsilon` must be a positive finite number, got {epsilon!r}.")

    def ok(p: float) -> bool:
        return blanket_delta(epsilon, n, p, compositions=compositions, grid=grid) <= delta

    hi = MAX_P
    if not blanket_reaches(epsilon, delta, n, compositions=compositions, grid=grid):
        raise ValueError(f"no blanket reaches ({epsilon:g}, {delta:g}) with n = {n} users per batch and "
                         f"{compositions} batch(es) per user: make the batch larger.")
    lo = hi / 2.0
    while ok(lo):
        hi, lo = lo, lo / 2.0
        if lo < 1e-12:
            return hi
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def blanket_reaches(epsilon: float, delta: float, n: int, *, compositions: int = 1, grid: float = GRID) -> bool:
    """Whether :func:`calibrate_blanket` finds a ``p`` for batches of ``n``: the largest it tries, :data:`MAX_P`, is
    ``(epsilon, delta)``-DP over ``compositions`` batches.

    Examples
    --------
    >>> blanket_reaches(2.0, 1e-5, 150, compositions=2), blanket_reaches(2.0, 1e-5, 20, compositions=2)
    (True, False)
    """
    return blanket_delta(epsilon, n, MAX_P, compositions=compositions, grid=grid) <= delta


@lru_cache(maxsize=64)
def smallest_batch(epsilon: float, delta: float, compositions: int = 1, *, limit: int = 1_000_000) -> int:
    """The fewest distinct users per batch for which the blanket can be calibrated (:func:`blanket_reaches`).

    More users, more fakes in the blanket: ``delta`` falls with ``n``, so a doubling then a bisection finds the
    threshold. ``ValueError`` if not even ``limit`` users reach it.

    Examples
    --------
    >>> n = smallest_batch(2.0, 1e-5, 2)
    >>> blanket_reaches(2.0, 1e-5, n, compositions=2) and not blanket_reaches(2.0, 1e-5, n - 1, compositions=2)
    True
    """
    lo, hi = 0, 1  # lo: does not reach (0 users never do); hi: the candidate
    while not blanket_reaches(epsilon, delta, hi, compositions=compositions):
        if hi >= limit:
            raise ValueError(f"no blanket reaches ({epsilon:g}, {delta:g}) over {compositions} batch(es) per user "
                             f"with up to {limit} users per batch.")
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if blanket_reaches(epsilon, delta, mid, compositions=compositions):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class BlanketGuarantee:
    """The central guarantee of a user's ``compositions`` batches (``bound`` names the analysis)."""

    epsilon: float
    delta: float
    n: int
    p: float
    compositions: int
    bound: str = "blanket-exact"


@dataclass(frozen=True)
class ItemBlanket:
    """Public calibration of the item reports: catalog size, batch size, target guarantee, cap.

    Parameters
    ----------
    n_items
        Catalog size ``K`` (items ``0 .. K-1``).
    batch
        Distinct users per shuffled batch (``n``).
    epsilon, delta
        The central guarantee of a user's ``cap`` batches together (user level).
    cap
        Reports (and so batches) per user per epoch.
    """

    n_items: int
    batch: int
    epsilon: float
    delta: float = 1e-5
    cap: int = 1

    def __post_init__(self) -> None:
        for name in ("n_items", "batch", "cap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {v!r}.")
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"`epsilon` must be a positive finite number, got {self.epsilon!r}.")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"`delta` must be in (0, 1), got {self.delta!r}.")

    @property
    def p(self) -> float:
        """Probability of a fake message per item per report (calibrated; cached)."""
        return _calibrated(self.epsilon, self.delta, self.batch, self.cap)

    def guarantee(self) -> BlanketGuarantee:
        """The guarantee the calibration certifies (recomputed from ``p``)."""
        eps = blanket_epsilon(self.batch, self.p, self.delta, compositions=self.cap)
        return BlanketGuarantee(eps, self.delta, self.batch, self.p, self.cap)

    @property
    def messages_per_report(self) -> float:
        """Expected messages a report carries: ``K p`` fakes plus at most one item."""
        return self.n_items * self.p

    def randomize(self, item: int | None, *, reward: float, rng: np.random.Generator,
                  dummy: bool = False) -> IntArray:
        """The messages of one report: ``item`` with probability ``reward``, and the blanket (sorted).

        ``dummy``: a report that does not send ``item`` sends the dummy value ``n_items`` in its place, so that every
        report carries ``Bin(n_items + 1, p) + 1`` messages whatever the data (the analyzer drops the dummies). The
        dummy is a value of the domain like any other, with its own blanket of fakes: a listen against no listen
        moves one message from ``item`` to ``n_items``, the pair the calibration covers. (Without fakes on the dummy
        the analyzer would count the reports without a listen exactly; found by the blanket audit,
        tests/privacy/test_blanket.py.)
        """
        if item is not None and not 0 <= int(item) < self.n_items:
            raise ValueError(f"`item` must be in [0, {self.n_items}), got {item!r}.")
        r = float(reward)
        if not (math.isfinite(r) and 0.0 <= r <= 1.0):
            raise ValueError(f"`reward` must be a number in [0, 1], got {reward!r}.")
        domain = self.n_items + 1 if dummy else self.n_items  # the dummy is blanketed like every value
        k = int(rng.binomial(domain, self.p))
        fakes = rng.choice(domain, size=k, replace=False)  # k distinct values: Bernoulli(p) per value
        real = [int(item)] if item is not None and rng.random() < r else [self.n_items] if dummy else []
        return np.sort(np.concatenate([fakes.astype(np.int64), np.asarray(real, dtype=np.int64)]))

    def histogram(self, messages: IntArray) -> FloatArray:
        """Counts per item of a batch's messages (what the analyzer sees)."""
        return np.bincount(np.asarray(messages, dtype=np.int64), minlength=self.n_items).astype(np.float64)

    def estimate(self, histogram: FloatArray, n: int) -> FloatArray:
        """Unbiased positives per item of a batch of ``n`` reports: ``h - n p``."""
        return np.asarray(histogram, dtype=np.float64) - n * self.p

    def variance(self, n: int) -> float:
        """Noise variance of each item's estimate from a batch of ``n`` reports: ``n p (1 - p)`` (public)."""
        return n * self.p * (1.0 - self.p)


@lru_cache(maxsize=64)
def _calibrated(epsilon: float, delta: float, n: int, cap: int) -> float:
    return calibrate_blanket(epsilon, delta, n, compositions=cap)


def codebook(features: FloatArray, size: int, *, iterations: int = 20, seed: int = 0) -> FloatArray:
    """``size`` codewords of the catalog's (public) item features: k-means (Lloyd) centroids, each of norm ``<= 1``.

    A device reports the codeword of the item it listened to (:func:`nearest_code`) through an
    :class:`ItemBlanket` over ``size`` codes; the analyzer's ``b = sum_c count_c * codeword_c`` then carries
    the blanket's noise on ``size`` values instead of the catalog's ``K`` (post-processing of public data: the
    codebook depends on the catalog only).

    >>> F = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> np.round(codebook(F, 2), 2).tolist()
    [[0.95, 0.05], [0.05, 0.95]]
    """
    X = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    X = X / np.maximum(norms, 1.0)
    rng = np.random.default_rng(seed)
    C = X[rng.choice(len(X), size=min(size, len(X)), replace=False)].copy()
    for _ in range(iterations):
        code = nearest_code(C, X)
        for c in range(len(C)):
            members = X[code == c]
            if len(members):
                C[c] = members.mean(axis=0)
    out: FloatArray = C[np.argsort(-C[:, 0], kind="stable")]  # a canonical order: by the first coordinate
    return out


def nearest_code(codewords: FloatArray, x: FloatArray) -> NDArray[np.int64]:
    """Index of the nearest codeword (Euclidean) of each row of ``x`` (or of ``x`` itself)."""
    X = np.atleast_2d(np.asarray(x, dtype=np.float64))
    d2 = (X**2).sum(1)[:, None] - 2.0 * X @ codewords.T + (codewords**2).sum(1)[None, :]
    out: NDArray[np.int64] = np.argmin(d2, axis=1).astype(np.int64)
    return out
