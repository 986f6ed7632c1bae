"""User-level sensitivity: one user's contributions to ``k`` release ticks of one epoch, at once.

A mechanism releases (a post-processing of) ``C X + Z``: ``X`` has one row per release tick (the
increment), ``C`` is lower-triangular, ``Z`` Gaussian with std ``sigma``. Event level, one tick's
increment moves ``C X`` by at most ``Delta ||c_t||`` (``c_t`` = column ``t``). A *user* who
contributes to ticks ``S = {t_1, ..., t_k}`` with increments ``v_i`` (each of norm ``<= Delta`` after
per-user per-tick clipping) moves it by ``sum_i c_{t_i} v_i^T``, whose squared Frobenius norm is
``sum_{i,j} (c_{t_i} . c_{t_j}) (v_i . v_j) <= Delta**2 1^T G_S 1`` when ``G = C^T C >= 0``
entrywise (spec ``user-level-shuffling-popularity.md`` §1). The user-level sensitivity is then
``Delta sqrt(B(k))`` with ``B(k) = max_{|S| <= k} 1^T G_S 1`` — or any **upper** bound of it.

:func:`participation_bound` gives such a bound, computed from the mechanism's structure:

* **Toeplitz factorizations** (BLT; ``C`` has first column ``c``, nonnegative and nonincreasing):
  ``G_ij <= g(|i - j|)`` with the autocorrelation ``g(a) = sum_m c_m c_{m+a}`` (nonincreasing), and
  for each ``i`` in ``S`` the other ``k - 1`` ticks are at distinct distances, at most two per distance,
  so ``B(k) <= k (g(0) + sum_{m=1}^{k-1} g(ceil(m / 2)))``;
* **binary trees** of ``h`` levels: leaves ``i != j`` share ``h - bitlength(i xor j)`` nodes; the
  ``m``-th closest leaf to ``i`` shares at most ``h - bitlength(m)``, so
  ``B(k) <= k (h + sum_{m=1}^{k-1} max(0, h - bitlength(m)))``.

Both are at most the group bound ``k**2 ||c||**2`` (``k`` times one participation). The factor a
mechanism's event-level sensitivity must be multiplied by to cover a user capped at ``k`` ticks is
:func:`participation_factor` ``= sqrt(B(k)) / max_t ||c_t||``. :func:`exact_participation_bound`
enumerates every pattern (small horizons; the tests check the bounds against it).

Examples
--------
>>> import numpy as np
>>> c = np.array([1.0, 0.5, 0.25])
>>> exact_participation_bound(np.tril(np.array([[c[i - j] if i >= j else 0 for j in range(3)]
...                                              for i in range(3)])), 2) <= toeplitz_bound(c, 2)
True
>>> tree_bound(levels=3, k=1), tree_bound(levels=3, k=2)
(3.0, 10.0)
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.typing import NDArray

from .base import Mechanism

__all__ = ["B_CLIP", "ITEM_CLIP", "clip_scale", "clip_scales", "replace_sensitivity", "toeplitz_autocorrelation", "toeplitz_bound", "tree_bound", "exact_participation_bound",
           "tree_matrix", "toeplitz_matrix", "participation_bound", "participation_factor",
           "UnsupportedMechanismError", "USER_LEVEL_MECHANISMS"]

FloatArray = NDArray[np.float64]


#: The default per-tick clip of one privacy unit's (a user's tick, or at event level one interaction's) reward
#: statistic ``b``: the context bound ``Lx = 1``. Two *replacing* contributions then differ by up to ``2``
#: (:func:`replace_sensitivity`), and the noise is calibrated to that. Clipping to ``1/2`` instead (the noise of
#: sensitivity 1) earned slightly less on held-out LastFM events at every user-level epsilon (docs/privacy.md, "Privacy
#: guarantees"), so the default calibrates to the true difference.
B_CLIP = 1.0
#: Registry names of the mechanisms whose multi-participation bound is known (:func:`participation_factor`):
#: the ones that can protect a user's whole epoch (a ``user-`` prefix mixes the same mechanism over users).
USER_LEVEL_MECHANISMS = ("blt-exact", "blt-zcdp", "gaussian-exact", "gaussian-zcdp")
#: The default clip of one unit's per-tick vector of item rewards (nonnegative: replace sensitivity ``sqrt(2)``).
ITEM_CLIP = 1.0


def replace_sensitivity(clip: float, *, signed: bool) -> float:
    """Per-tick L2 sensitivity under *replace* neighbours of a statistic whose contributions are clipped to ``clip``.

    Two neighbouring streams each give a contribution of norm ``<= clip``; their difference has norm ``<= 2 clip``
    for vectors of any sign (``v`` and ``-v``), and ``<= sqrt(2) clip`` for nonnegative vectors
    (``||u - v||^2 = ||u||^2 + ||v||^2 - 2 u.v`` and ``u.v >= 0``). Sensitivity is a difference, not a size
    (DESIGN §2; spec ``user-level-shuffling-popularity.md`` §1, erratum).

    Examples
    --------
    >>> replace_sensitivity(B_CLIP, signed=True), round(replace_sensitivity(ITEM_CLIP, signed=False), 6)
    (2.0, 1.414214)
    """
    if not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"`clip` must be a positive number, got {clip!r}.")
    return float(clip) * (2.0 if signed else math.sqrt(2.0))


def clip_scale(norm: float, clip: float) -> float:
    """The factor that scales a vector of norm ``norm`` to norm at most ``clip`` (1 when it is already shorter)."""
    return 1.0 if norm <= clip else clip / norm


def clip_scales(norms: NDArray[np.float64], clip: float) -> NDArray[np.float64]:
    """:func:`clip_scale` of each of ``norms`` (the same values: one division each).

    >>> clip_scales(np.array([0.5, 4.0]), 2.0).tolist(), [clip_scale(0.5, 2.0), clip_scale(4.0, 2.0)]
    ([1.0, 0.5], [1.0, 0.5])
    """
    norms = np.asarray(norms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero norm is within a nonnegative clip: quotient unused
        out: NDArray[np.float64] = np.where(norms <= clip, 1.0, clip / norms)
    return out


class UnsupportedMechanismError(ValueError):
    """No user-level sensitivity bound is implemented for this mechanism."""


def _check_k(k: int) -> int:
    if int(k) != k or int(k) < 1:
        raise ValueError(f"`k` must be a positive number of participations, got {k!r}.")
    return int(k)


def toeplitz_autocorrelation(c: FloatArray, upto: int | None = None) -> FloatArray:
    """``g(a) = sum_m c_m c_{m+a}`` for ``a = 0 .. upto - 1`` (``O(n log n)`` by FFT)."""
    c = np.asarray(c, dtype=np.float64)
    n = c.size
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(c, size)
    g = np.fft.irfft(f * np.conj(f), size)[:n]
    out: FloatArray = g[: (n if upto is None else min(n, upto))]
    return np.maximum(out, 0.0)


def toeplitz_bound(c: FloatArray, k: int) -> float:
    """Upper bound of ``max_{|S| <= k} 1^T G_S 1`` for a lower-triangular Toeplitz ``C`` (first column ``c``).

    Valid when ``c`` is nonnegative and nonincreasing (checked; a ``ValueError`` otherwise).
    """
    k = _check_k(k)
    c = np.asarray(c, dtype=np.float64)
    if (c < 0).any() or (np.diff(c) > 1e-12 * max(1.0, float(c[0]))).any():
        raise ValueError("`c` must be nonnegative and nonincreasing for the Toeplitz bound.")
    k = min(k, c.size)
    g = toeplitz_autocorrelation(c, upto=(k + 1) // 2 + 1)
    g = np.maximum.accumulate(g[::-1])[::-1]  # guard FFT round-off: keep g nonincreasing
    row = g[0] + sum(float(g[min(math.ceil(m / 2), g.size - 1)]) for m in range(1, k))
    return float(k * row)


def tree_bound(*, levels: int, k: int) -> float:
    """Upper bound of ``max_{|S| <= k} 1^T G_S 1`` for a binary tree of ``levels`` levels (node noise)."""
    k = _check_k(k)
    h = int(levels)
    if h < 1:
        raise ValueError(f"`levels` must be positive, got {levels}.")
    k = min(k, (1 << h))
    row = h + sum(max(0, h - m.bit_length()) for m in range(1, k))
    return float(k * row)


def exact_participation_bound(C: FloatArray, k: int) -> float:
    """``max_{|S| <= k} ||C 1_S||**2`` by enumeration (small horizons only: ``n choose k`` patterns)."""
    k = _check_k(k)
    C = np.asarray(C, dtype=np.float64)
    n = C.shape[1]
    if math.comb(n, min(k, n)) > 2_000_000:
        raise ValueError(f"too many patterns to enumerate ({n} choose {k}); use a bound.")
    best = 0.0
    for size in range(1, min(k, n) + 1):
        for S in itertools.combinations(range(n), size):
            v = C[:, list(S)].sum(axis=1)
            best = max(best, float(v @ v))
    return best


def toeplitz_matrix(c: FloatArray) -> FloatArray:
    """The lower-triangular Toeplitz ``C`` with first column ``c``."""
    c = np.asarray(c, dtype=np.float64)
    n = c.size
    i, j = np.indices((n, n))
    out: FloatArray = np.where(i >= j, c[np.clip(i - j, 0, n - 1)], 0.0)
    return out


def tree_matrix(levels: int) -> FloatArray:
    """Node-incidence matrix of a complete binary tree over ``2**levels`` leaves (rows: nodes of every level)."""
    n = 1 << levels
    rows = []
    for level in range(levels):
        width = 1 << level
        for a in range(n // width):
            r = np.zeros(n)
            r[a * width:(a + 1) * width] = 1.0
            rows.append(r)
    return np.array(rows)


def participation_bound(mechanism: Mechanism, k: int) -> float:
    """``B(k)``: an upper bound of ``max_{|S| <= k} 1^T G_S 1`` for ``mechanism`` (per unit of ``Delta**2``).

    Supports the BLT factorization and the Gaussian binary tree (and user-space noise around either:
    a user's contribution is one unit's block of the inner mechanism's statistic).
    """
    inner = getattr(mechanism, "inner", None)
    if inner is not None:
        return participation_bound(inner, k)
    from .factorization import BLTMechanism, blt_strategy_coefficients
    from .tree import BinaryTreeMechanism

    if isinstance(mechanism, BLTMechanism):
        c = blt_strategy_coefficients(mechanism.theta, mechanism.w, mechanism.capacity)
        try:
            return toeplitz_bound(c, k)
        except ValueError:  # not monotone: the group bound, still valid
            return float(_check_k(k) ** 2 * float(c @ c))
    if type(mechanism) is BinaryTreeMechanism and mechanism.noise_kind == "gaussian":
        return tree_bound(levels=mechanism.levels, k=k)
    raise UnsupportedMechanismError(
        f"no user-level sensitivity bound for {type(mechanism).__name__}: use a BLT factorization "
        f"('blt-exact', 'user-blt-exact', ...) or the Gaussian binary tree ('gaussian-exact', ...).")


def participation_factor(mechanism: Mechanism, k: int) -> float:
    """``sqrt(B(k)) / max_t ||c_t||``: how much larger a user's sensitivity is than one tick's (``<= k``)."""
    single = participation_bound(mechanism, 1)
    return math.sqrt(participation_bound(mechanism, k) / single)
