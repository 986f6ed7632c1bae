"""Conversions between privacy parameters: zCDP, Gaussian DP and ``(epsilon, delta)``.

* zCDP: ``rho``-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP.
* Gaussian DP: ``mu``-GDP is ``(epsilon, delta)``-DP exactly when
  ``Phi(-epsilon/mu + mu/2) - e**epsilon Phi(-epsilon/mu - mu/2) <= delta``
  (Dong, Roth & Su 2022, Cor. 2.13; ERRATA §1, §5).

Examples
--------
>>> round(rho_from_epsilon(2.0, 1e-5), 4)
0.08
>>> round(epsilon_from_rho(rho_from_epsilon(2.0, 1e-5), 1e-5), 9)
2.0
>>> round(gdp_epsilon(gdp_mu(2.0, 1e-5), 1e-5), 6)
2.0
"""

from __future__ import annotations

import math

__all__ = ["check_epsilon", "check_delta", "rho_from_epsilon", "epsilon_from_rho", "gdp_delta", "gdp_epsilon",
           "gdp_mu", "split_epsilon"]


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Validate a privacy parameter: ``epsilon > 0`` (``inf`` = no privacy)."""
    eps = float(epsilon)
    if math.isnan(eps) or eps <= 0:
        raise ValueError(f"`{name}` must be positive (use inf for no noise), got {epsilon}.")
    return eps


def check_delta(delta: float, name: str = "delta") -> float:
    """Validate ``0 < delta < 1``."""
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"`{name}` must be in (0, 1), got {delta}.")
    return d


def rho_from_epsilon(epsilon: float, delta: float) -> float:
    """Largest zCDP ``rho`` whose conversion gives ``(epsilon, delta)``-DP.

    ``rho = (sqrt(epsilon + ln(1/delta)) - sqrt(ln(1/delta)))**2``; the exact
    inverse of :func:`epsilon_from_rho`.
    """
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    if math.isinf(eps):
        return math.inf
    L = math.log(1.0 / dl)
    return (math.sqrt(eps + L) - math.sqrt(L)) ** 2


def epsilon_from_rho(rho: float, delta: float) -> float:
    """``epsilon = rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke 2016, Prop. 1.3)."""
    if rho < 0:
        raise ValueError(f"`rho` must be non-negative, got {rho}.")
    dl = check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / dl))


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """Exact ``delta`` of a ``mu``-GDP mechanism at ``epsilon`` (Dong, Roth, Su 2019, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    # e^eps * Phi(b) computed in log space to avoid overflow at large eps
    tail = 0.0 if _phi(b) == 0.0 else math.exp(epsilon + math.log(_phi(b)))
    return max(0.0, _phi(a) - tail)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` with ``gdp_delta(mu, epsilon) <= delta`` (bisection)."""
    check_delta(delta)
    if mu <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` whose ``mu``-GDP mechanism is ``(epsilon, delta)``-DP (bisection)."""
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    if math.isinf(eps):
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) <= dl:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gdp_delta(mid, eps) <= dl:
            lo = mid
        else:
            hi = mid
    return lo


def split_epsilon(epsilon: float, delta: float, share: float) -> tuple[float, float]:
    """Split an ``(epsilon, delta)`` budget between two Gaussian-DP releases of the same data.

    Two releases that are ``mu_1``- and ``mu_2``-GDP compose to ``sqrt(mu_1**2 + mu_2**2)``-GDP
    (Dong, Roth & Su 2022, Cor. 3.3). With ``mu = gdp_mu(epsilon, delta)``, the first gets
    ``mu_1 = mu sqrt(share)`` and the second ``mu_2 = mu sqrt(1 - share)``; returned as the
    epsilons (at the same ``delta``) that calibrate each with exact Gaussian-DP accounting, so
    that together they are exactly ``(epsilon, delta)``-DP. ``epsilon = inf`` stays ``inf``.

    >>> e1, e2 = split_epsilon(2.0, 1e-5, 0.5)
    >>> mu = gdp_mu(2.0, 1e-5)
    >>> round((gdp_mu(e1, 1e-5) ** 2 + gdp_mu(e2, 1e-5) ** 2) ** 0.5 / mu, 9)
    1.0
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"`share` must be in (0, 1), got {share}.")
    check_epsilon(epsilon)
    if math.isinf(epsilon):
        return math.inf, math.inf
    mu = gdp_mu(epsilon, delta)
    return gdp_epsilon(mu * math.sqrt(share), delta), gdp_epsilon(mu * math.sqrt(1.0 - share), delta)
