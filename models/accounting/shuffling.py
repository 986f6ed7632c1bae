"""Privacy amplification by shuffling (Feldman, McMillan & Talwar, FOCS 2021).

Setting: each of ``n`` distinct users sends **one** report from a pure
``eps0``-LDP local randomizer; a shuffler removes identities, arrival times and
order. The shuffled batch is then ``(epsilon, delta)``-DP centrally.

The "clone" reduction (Feldman, McMillan & Talwar, "Hiding Among the Clones",
FOCS 2021, arXiv:2012.12803). Any other user's report can be written as a
mixture: with probability ``e**-eps0`` it is a *clone* (a fresh draw of the
first user's randomizer on one of the two neighbouring inputs, each with
probability 1/2), otherwise something that does not depend on the first user.
The shuffled output is then a post-processing of the pair

* ``C ~ Bin(n - 1, e**-eps0)`` clones, ``A ~ Bin(C, 1/2)`` of them of type 0,
* ``P``: ``A + Delta`` reports of type 0, ``Q``: ``A + 1 - Delta``, with
  ``Delta ~ Bernoulli(alpha)``, ``alpha = e**eps0 / (1 + e**eps0)``,

so ``delta(epsilon) <= D_{e^epsilon}(P || Q) = E_C[ D_{e^epsilon}(p_C || q_C) ]`` where, given ``C = c``,
``p_c = alpha Bin(c, 1/2) + (1 - alpha) (Bin(c, 1/2) + 1)`` and ``q_c`` swaps ``alpha`` and ``1 - alpha``.

Two bounds on that divergence:

* :func:`fmt_closed_form`, the closed form of the authors' reference code
  (``apple/ml-shuffling-amplification``, ``computeamplification.py``,
  ``closedformanalysis``), valid when ``eps0 <= log(n / (16 log(4/delta)))``::

      a = 8 sqrt(e^eps0 log(4/delta) / n),  c = 8 e^eps0 / n,
      epsilon = log(1 + (1 - e^-eps0) / (1 + e^-eps0 / (1 + a + c)) * (a + c)).

  The factor ``(1 - e^-eps0) / (1 + e^-eps0 / (1 + a + c))`` is never smaller than the
  ``(e^eps0 - 1) / (e^eps0 + 1) = (1 - e^-eps0) / (1 + e^-eps0)`` of the simplified statement of
  the theorem, so this form is the more conservative of the two.
* :func:`fmt_numerical`, the same divergence computed numerically (the
  reference's ``numericalanalysis``, re-derived here; no code copied), with a
  bisection on ``epsilon``. It holds for every ``n`` and ``eps0``, and is
  tighter. Two details of this implementation differ from the reference on
  purpose: every value of ``C`` in ``0 .. n-1`` is covered (the reference's loop
  covers nothing when ``n <= step`` and then reports ``epsilon ~ 0``), and the
  probability mass it leaves out is added to ``delta`` (an upper bound needs it).

Facts used (each checked by the unit tests):

* ``D_{e^eps}(p_c || q_c) = D_{e^eps}(q_c || p_c)``: reflecting ``x -> c + 1 - x``
  maps ``p_c`` to ``q_c`` (``Bin(c, 1/2)`` is symmetric), so one direction suffices.
* ``p_c(x) / q_c(x)`` decreases in ``x``, so the optimal set is ``{x <= t}``:
  ``t = floor(beta (c + 1))``, ``beta = (e^eps0 - e^eps) / ((e^eps0 - 1)(e^eps + 1))``.
* The divergence does not increase with ``c`` (``p_{c+1}``, ``q_{c+1}`` are ``p_c``, ``q_c`` plus the
  same independent ``Bernoulli(1/2)``), so a block of ``c`` values is bounded by its smallest ``c``.

Conditions the product must enforce for these numbers to mean anything: one report per user per
batch, ``n`` = the number of *distinct* users in the batch, identities/timing/order removed, and a
*pure* ``eps0``-LDP randomizer. Across batches, compose the central guarantees.

Examples
--------
>>> round(fmt_closed_form(2.0, 10_000, 1e-6), 6)
0.523551
>>> fmt_closed_form(2.0, 100, 1e-6) is None  # log(100 / (16 log(4e6))) < 0: no closed form
True
>>> g = shuffled_epsilon(2.0, 10_000, 1e-6)
>>> (g.bound, g.amplified, g.epsilon < 0.16)
('fmt-numerical', True, True)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

__all__ = ["ShuffleGuarantee", "amplification_condition", "fmt_closed_form", "fmt_numerical", "fmt_numerical_delta",
           "local_epsilon_for_central", "shuffled_epsilon"]

#: Step used by :func:`shuffled_epsilon`: 1 = every number of clones on its own (no block coarsening).
EXACT_STEP = 1
#: Probability of the number of clones left out of the sum, as a fraction of the target ``delta``
#: (it is added to ``delta``, so leaving it out only costs this fraction).
_TAIL_FRACTION = 1e-9
#: Beyond this ``eps0`` (``e**eps0`` near overflow) the clone probability is 0: no amplification.
_MAX_EPS0 = 700.0


# ----------------------------------------------------------------------------------------------- validation

def _check_eps0(eps0: float, name: str = "eps0") -> float:
    try:
        e = float(eps0)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a positive finite number, got {eps0!r}.") from None
    if not math.isfinite(e) or e <= 0.0:
        raise ValueError(f"`{name}` must be a positive finite number, got {eps0!r}.")
    return e


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"`n` (the number of distinct users in the batch) must be an integer, got {n!r}.")
    if int(n) < 1:
        raise ValueError(f"`n` (the number of distinct users in the batch) must be >= 1, got {n!r}.")
    return int(n)


def _check_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.") from None
    if not 0.0 < d < 1.0:
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.")
    return d


def _check_positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return int(value)


# ----------------------------------------------------------------------------------------------- closed form

def amplification_condition(eps0: float, n: int, delta: float) -> bool:
    """Whether the closed form applies: ``eps0 <= log(n / (16 log(4/delta)))``.

    Parameters
    ----------
    eps0 : float
        Pure LDP level of each report, ``> 0``.
    n : int
        Number of distinct users in the shuffled batch, ``>= 1``.
    delta : float
        Target ``delta`` of the central guarantee, in ``(0, 1)``.

    Returns
    -------
    bool

    Examples
    --------
    >>> amplification_condition(1.0, 1000, 1e-6), amplification_condition(2.0, 1000, 1e-6)
    (True, False)
    """
    e, m, d = _check_eps0(eps0), _check_n(n), _check_delta(delta)
    return e <= math.log(m / (16.0 * math.log(4.0 / d)))


def fmt_closed_form(eps0: float, n: int, delta: float) -> float | None:
    """Closed-form central ``epsilon`` of ``n`` shuffled ``eps0``-LDP reports (FMT21; reference code's form).

    Parameters
    ----------
    eps0 : float
        Pure LDP level of each report, ``> 0`` and finite.
    n : int
        Number of distinct users in the shuffled batch, ``>= 1``.
    delta : float
        Target ``delta``, in ``(0, 1)``.

    Returns
    -------
    float or None
        ``epsilon`` such that the shuffled batch is ``(epsilon, delta)``-DP; ``None`` when
        ``eps0 > log(n / (16 log(4/delta)))`` (the theorem does not apply: claim nothing from it).
        Near that boundary with a small ``eps0`` the value can exceed ``eps0`` (a valid but useless
        bound); :func:`shuffled_epsilon` never reports more than ``eps0``.

    Examples
    --------
    >>> round(fmt_closed_form(1.0, 1000, 1e-6), 6)
    0.649538
    >>> fmt_closed_form(2.0, 1000, 1e-6) is None
    True
    """
    if not amplification_condition(eps0, n, delta):
        return None
    e, m, d = float(eps0), int(n), float(delta)
    a = 8.0 * math.sqrt(math.exp(e) * math.log(4.0 / d) / m)
    c = 8.0 * math.exp(e) / m
    factor = (1.0 - math.exp(-e)) / (1.0 + math.exp(-e) / (1.0 + a + c))
    return math.log1p(factor * (a + c))


# ----------------------------------------------------------------------------------------------- numerical

def _divergence_given_clones(eps: float, eps0: float, c: np.ndarray) -> np.ndarray:
    """``D_{e^eps}(p_c || q_c)`` for each number of clones in ``c`` (an integer array), ``0 <= eps <= eps0``."""
    if eps >= eps0:
        return np.zeros(c.shape)  # the likelihood ratio never exceeds e^eps0
    ee, e0 = math.exp(eps), math.exp(eps0)
    gap = ee * math.expm1(eps0 - eps)  # e^eps0 - e^eps, without cancellation for close values
    beta = gap / (math.expm1(eps0) * (ee + 1.0))  # {x : p_c(x) > e^eps q_c(x)} = {x < beta (c + 1)}
    t = np.floor(beta * (c + 1.0))
    f_t = stats.binom.cdf(t, c, 0.5)
    f_t1 = stats.binom.cdf(t - 1.0, c, 0.5)
    # P_p(X <= t) - e^eps P_q(X <= t), with P_p = alpha F(t) + (1-alpha) F(t-1), P_q the other way round
    d = (gap * f_t - math.expm1(eps + eps0) * f_t1) / (1.0 + e0)
    return np.asarray(np.clip(d, 0.0, 1.0), dtype=float)


@lru_cache(maxsize=256)
def _clone_blocks(eps0: float, n: int, step: int, tail: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Blocks of ``C ~ Bin(n-1, e^-eps0)``: (smallest c of each kept block, its mass, the mass left out).

    Blocks of ``step`` consecutive values tile ``0 .. n-1``, anchored at ``ceil(E[C])`` as in the
    reference. Blocks whose mass is below ``tail / number of blocks`` are left out; their total
    mass (``<= tail``) is returned so the caller can add it to ``delta`` (the divergence is ``<= 1``).
    """
    p = math.exp(-eps0)
    pmf = stats.binom.pmf(np.arange(n), n - 1, p)
    anchor = min(math.ceil((n - 1) * p), n - 1)
    first = anchor - step * math.ceil(anchor / step)  # <= 0: the block starts below 0 are clipped
    starts = np.arange(first, n, step)
    lows = np.maximum(starts, 0)
    mass = np.add.reduceat(pmf, lows)
    keep = mass >= tail / len(lows)
    # plus whatever rounding lost from the total (the pmf should sum to 1): never under-count
    left_out = float(mass[~keep].sum()) + max(0.0, 1.0 - float(pmf.sum()))
    kept_lows, kept_mass = lows[keep].astype(float), mass[keep]
    kept_lows.setflags(write=False)  # cached: shared by every caller
    kept_mass.setflags(write=False)
    return kept_lows, kept_mass, left_out


def fmt_numerical_delta(eps: float, eps0: float, n: int, *, step: int = EXACT_STEP,
                        tail: float = 0.0) -> float:
    """``delta`` the clone analysis certifies for ``n`` shuffled ``eps0``-LDP reports at a given ``eps``.

    ``sum over blocks of P(C in block) * D_{e^eps}(p_lo || q_lo)`` (``lo`` = the block's smallest ``c``),
    plus the mass of the blocks left out (those below ``tail`` in total). With ``step = 1`` and
    ``tail = 0`` it is the divergence of the clone pair itself (up to rounding).

    Parameters
    ----------
    eps : float
        Central ``epsilon`` at which to evaluate, ``>= 0``.
    eps0 : float
        Pure LDP level of each report.
    n : int
        Number of distinct users in the batch.
    step : int, optional
        Width of the blocks of clone counts (``1``: exact; larger: faster and looser).
    tail : float, optional
        Total mass of ``C`` that may be left out of the sum (and is then added to ``delta``).

    Returns
    -------
    float
        An upper bound on the hockey-stick divergence at ``e**eps`` of the shuffled output.

    Examples
    --------
    >>> fmt_numerical_delta(1.0, 1.0, 1)  # at eps = eps0 a pure eps0-DP report has delta 0
    0.0
    >>> round(fmt_numerical_delta(0.5, 1.0, 1), 6)  # one report: (e - e^0.5) / (1 + e) = randomized response
    0.287649
    """
    e0, m = _check_eps0(eps0), _check_n(n)
    if e0 > _MAX_EPS0:
        raise ValueError(f"`eps0` must be <= {_MAX_EPS0:g} for the numerical analysis, got {eps0!r}.")
    st = _check_positive_int(step, "step")
    e = float(eps)
    if not math.isfinite(e) or e < 0.0:
        raise ValueError(f"`eps` must be a finite number >= 0, got {eps!r}.")
    if not 0.0 <= tail < 1.0:
        raise ValueError(f"`tail` must be in [0, 1), got {tail!r}.")
    return _delta_at(e, e0, m, st, float(tail))


def _delta_at(eps: float, eps0: float, n: int, step: int, tail: float) -> float:
    lows, mass, left_out = _clone_blocks(eps0, n, step, tail)
    d = _divergence_given_clones(eps, eps0, lows)
    return min(1.0, float(np.dot(mass, d)) + left_out)


@lru_cache(maxsize=4096)
def _numerical_cached(eps0: float, n: int, delta: float, iterations: int, step: int) -> float | None:
    if n == 1:  # a batch of one report: nothing to hide among (the result would be the unshuffled trade-off)
        return None
    if eps0 > _MAX_EPS0:  # e^-eps0 underflows: no clones at all
        return None
    tail = _TAIL_FRACTION * delta

    def ok(eps: float) -> bool:
        return _delta_at(eps, eps0, n, step, tail) <= delta

    hi = eps0  # certified without computation: the reports alone are (eps0, 0)-DP
    closed = fmt_closed_form(eps0, n, delta)
    if closed is not None and closed < hi and ok(closed):
        hi = closed  # a tighter starting point, certified by our own computation
    lo = 0.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi if hi < eps0 else None


def fmt_numerical(eps0: float, n: int, delta: float, *, iterations: int = 50, step: int = 100) -> float | None:
    """Numerical central ``epsilon`` of ``n`` shuffled ``eps0``-LDP reports (FMT21 clone analysis).

    Bisects ``epsilon`` in ``[0, eps0]`` (started at the closed form when that holds and our own
    computation certifies it) for the smallest value with :func:`fmt_numerical_delta` ``<= delta``.
    Only certified values are returned. Results are cached.

    Parameters
    ----------
    eps0 : float
        Pure LDP level of each report, ``> 0`` and finite.
    n : int
        Number of distinct users in the batch, ``>= 1``.
    delta : float
        Target ``delta``, in ``(0, 1)``.
    iterations : int, optional
        Bisection steps; the result is within ``2**-iterations * eps0`` above the analysis' optimum.
    step : int, optional
        Width of the blocks of clone counts, as in the reference (default 100, its default);
        ``1`` is exact and still fast for ``n`` up to about ``10**6``.

    Returns
    -------
    float or None
        ``epsilon`` with the batch ``(epsilon, delta)``-DP; ``None`` when no value below ``eps0``
        could be certified, and always for ``n = 1`` (one report has no one to hide among).

    Examples
    --------
    >>> round(fmt_numerical(1.0, 10_000, 1e-6), 4)
    0.0534
    >>> round(fmt_numerical(1.0, 10_000, 1e-6, step=1), 4)  # tighter without blocks
    0.053
    >>> fmt_numerical(1.0, 1, 1e-6) is None
    True
    """
    return _numerical_cached(_check_eps0(eps0), _check_n(n), _check_delta(delta),
                             _check_positive_int(iterations, "iterations"), _check_positive_int(step, "step"))


# ----------------------------------------------------------------------------------------------- guarantee

@dataclass(frozen=True, slots=True)
class ShuffleGuarantee:
    """Central guarantee of one shuffled batch of ``n`` one-per-user ``eps0``-LDP reports.

    ``bound`` is ``"fmt-numerical"``, ``"fmt-closed-form"`` or ``"none"`` (then
    ``epsilon = eps0``, ``delta = 0``: the local guarantee, nothing claimed from shuffling).
    """

    epsilon: float
    delta: float
    eps0: float
    n: int
    bound: str
    amplified: bool
    note: str


def shuffled_epsilon(eps0: float, n: int, delta: float) -> ShuffleGuarantee:
    """Best valid central guarantee of ``n`` shuffled ``eps0``-LDP reports at ``delta``.

    The smaller of :func:`fmt_numerical` (with ``step = 1``, the exact clone divergence) and
    :func:`fmt_closed_form` where each holds; never above ``eps0``.

    Parameters
    ----------
    eps0 : float
        Pure LDP level of each report, ``> 0`` and finite.
    n : int
        Number of distinct users in the batch, ``>= 1``.
    delta : float
        Target ``delta``, in ``(0, 1)``.

    Returns
    -------
    ShuffleGuarantee
        ``amplified`` is ``False`` (and ``epsilon = eps0``, ``delta = 0``) when neither bound is below
        ``eps0``; the note says why.

    Examples
    --------
    >>> g = shuffled_epsilon(1.0, 1000, 1e-6)
    >>> (g.bound, g.amplified, round(g.epsilon, 3), g.delta)
    ('fmt-numerical', True, 0.182, 1e-06)
    >>> shuffled_epsilon(1.0, 1, 1e-6).amplified
    False
    """
    e, m, d = _check_eps0(eps0), _check_n(n), _check_delta(delta)
    numerical = _numerical_cached(e, m, d, 50, EXACT_STEP)
    closed = fmt_closed_form(e, m, d)
    candidates = [(v, name) for v, name in ((numerical, "fmt-numerical"), (closed, "fmt-closed-form"))
                  if v is not None and v < e]
    condition = (f"closed-form condition eps0 <= log(n / (16 log(4/delta))) "
                 f"{'holds' if closed is not None else 'fails'}")
    if not candidates:
        why = ("a batch of one report has no one to hide among" if m == 1
               else "the numerical analysis certified nothing below eps0")
        return ShuffleGuarantee(epsilon=e, delta=0.0, eps0=e, n=m, bound="none", amplified=False,
                                note=f"no amplification claimed: {why}; {condition}; "
                                     f"the local guarantee ({e:g}, 0) stands")
    eps, name = min(candidates)
    return ShuffleGuarantee(epsilon=eps, delta=d, eps0=e, n=m, bound=name, amplified=True,
                            note=f"{m} shuffled one-per-user {e:g}-LDP reports are ({eps:.8g}, {d:g})-DP "
                                 f"({name}, Feldman-McMillan-Talwar 2021); {condition}")


@lru_cache(maxsize=1024)  # pure, and asked once per report by every device's calibration (LocalConfig.epsilon0)
def local_epsilon_for_central(target_eps: float, n: int, delta: float) -> float:
    """Largest ``eps0`` whose shuffled guarantee is at most ``target_eps`` (bisection to ``1e-6``).

    ``eps0 = target_eps`` always qualifies (shuffling never makes a guarantee worse), so the
    result is ``>= target_eps``; without amplification (``n = 1``) it is ``target_eps`` itself.
    Every returned value has been checked: ``shuffled_epsilon(result, n, delta).epsilon <= target_eps``.

    Parameters
    ----------
    target_eps : float
        Desired central ``epsilon`` of the shuffled batch, ``> 0`` and finite.
    n : int
        Number of distinct users in the batch, ``>= 1``.
    delta : float
        Central ``delta``, in ``(0, 1)``.

    Returns
    -------
    float
        The local ``eps0`` to give each report.

    Examples
    --------
    >>> e0 = local_epsilon_for_central(0.5, 1000, 1e-6)
    >>> round(e0, 2), shuffled_epsilon(e0, 1000, 1e-6).epsilon <= 0.5
    (1.9, True)
    """
    target, m, d = _check_eps0(target_eps, "target_eps"), _check_n(n), _check_delta(delta)

    def ok(eps0: float) -> bool:
        return shuffled_epsilon(eps0, m, d).epsilon <= target

    lo, hi = target, 2.0 * target
    while ok(hi):  # terminates: for large eps0 there are almost no clones and the bound tends to eps0
        lo, hi = hi, 2.0 * hi
        if hi > _MAX_EPS0:  # no clones beyond this: no amplification, nothing more to gain
            return lo
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
