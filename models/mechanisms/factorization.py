"""Matrix-factorization continual counting in streaming form: buffered linear Toeplitz (BLT) noise.

Releasing all prefix sums of a stream is releasing ``A x`` with ``A`` the
lower-triangular all-ones matrix. Any factorization ``A = B C`` gives a
mechanism: release ``B (C x + z) = A x + B z`` with Gaussian ``z``. Privacy is
that of the Gaussian mechanism ``C x + z`` (sensitivity: the largest column
norm of ``C``), and the error at tick ``t`` is ``sigma**2 ||B[t, :]||**2``.
The binary tree is one such factorization; the square-root factorization
``B = C = A**(1/2)`` (Toeplitz, coefficients ``binom(2k, k) / 4**k``) has
error growing like ``log t`` instead of ``log**2 t`` and is within a few
percent of optimal (Fichtenberger, Henzinger, Upadhyay 2023; Henzinger,
Upadhyay, Upadhyay 2023).

The square root needs every past ``z`` at every tick. A BLT (Dvijotham,
McMahan, Pillutla, Steinke, Thakurta 2024) replaces its coefficients by a sum
of ``m`` geometric sequences, which needs only ``m`` running buffers per
released vector:

    b_0 = 1,  b_k = sum_j w_j theta_j**(k-1)   (k >= 1),
    eta_t = z_t + sum_j w_j S_j,    S_j <- theta_j S_j + z_t.

``C = B^{-1} A`` is then computed exactly (its first column ``c`` solves
``B c = 1``; for a lower-triangular Toeplitz ``C`` that column has the largest
norm), so **any** buffer parameters give a valid guarantee; the fitted ones
(:data:`BLT_TABLE`, minimising ``||b||**2 ||c||**2`` over one epoch, i.e.
the largest error variance per unit of privacy) only make it efficient:
4 buffers are within 0.1 % of the square root up to ``2**10`` ticks, 1.3 % at
``2**17`` and 3.3 % at ``2**20`` (beyond ``2**20`` ticks per epoch the last entry is used).

Examples
--------
Noise off, the release is the exact prefix sum:

>>> import numpy as np
>>> mech = BLTMechanism.gaussian(dim=1, sensitivity=1.0, epsilon=float("inf"), delta=1e-5, horizon=8, seed=0)
>>> state = mech.init_state()
>>> for x in [1.0, 2.0, 3.0]:
...     release, state, event = mech.step(state, np.array([x]))
>>> release
array([6.])

The largest column norm, recomputed from the dense ``C = B^{-1} A``:

>>> theta, w = blt_parameters(100)
>>> B = toeplitz_lower(blt_coefficients(theta, w, 100))
>>> C = np.linalg.solve(B, np.tril(np.ones((100, 100))))
>>> bool(abs(np.linalg.norm(C, axis=0).max() - blt_column_norm(theta, w, 100)) < 1e-9)
True

References
----------
Dvijotham, McMahan, Pillutla, Steinke, Thakurta (2024), "Efficient and
near-optimal noise generation for streaming differential privacy";
Denisov, McMahan, Rush, Smith, Thakurta (2022), "Improved differential
privacy for SGD via optimal private linear operators on adaptive streams";
Fichtenberger, Henzinger, Upadhyay (2023), "Constant matters: fine-grained
error bound on differentially private continual observation".
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from models.accounting import (DiscreteGaussianTreeEvent, DpEvent, FactorizationEvent, NoNoiseEvent, check_delta,
                               check_epsilon, gdp_mu, rho_from_epsilon)
from models.ground.noise import KeyedNoise, check_grid, default_grid, grid_units

from .base import IncrementSteps, TreeState, check_sensitivity

__all__ = [
    "BLTMechanism",
    "DiscreteBLTMechanism",
    "BLT_TABLE",
    "blt_parameters",
    "blt_coefficients",
    "blt_strategy_coefficients",
    "blt_column_norm",
    "blt_error_coefficient",
    "blt_loss",
    "fit_blt",
    "sqrt_coefficients",
    "toeplitz_lower",
]

FloatArray = NDArray[np.float64]

#: Fitted BLT buffers, ``p -> (theta, w)``, for epochs of ``2**p - 1`` ticks and 4 buffers:
#: the minimiser of ``||b||**2 ||c||**2`` (:func:`fit_blt`, warm-started from ``p - 1``).
#: Regenerate with ``python -m models.mechanisms.factorization``; the tests check every entry's loss.
BLT_TABLE: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    1: ((0.8378950576396442, 0.7273730649177839, 0.5414979747789541, 0.2288945823615599),
        (0.05332426315352866, 0.07430428661145932, 0.084045803541398, 0.10057816953925944)),
    2: ((0.9238769887534813, 0.8589866998135195, 0.6727449764666638, 0.30859791095905736),
        (0.13783490181929514, 0.16970062973354905, 0.11669125492933329, 0.07577320755351968)),
    3: ((0.9895806044184494, 0.937521781020941, 0.6895366316102305, 0.24048262216322633),
        (0.11274534955019368, 0.1232142626869796, 0.187980647245075, 0.07606433948718043)),
    4: ((0.9798089913309532, 0.8211095763700571, 0.5233327553298521, 0.1729339481275717),
        (0.17874664908275742, 0.15962683777829817, 0.1165596806638311, 0.045067224660468315)),
    5: ((0.9867327630346009, 0.8745526507023182, 0.6187043139011947, 0.22984246494792068),
        (0.14654149999690297, 0.1485340641572459, 0.13736139303819336, 0.06755897300471082)),
    6: ((0.9923106573140108, 0.9218200388731322, 0.7194072873234959, 0.3037471043334191),
        (0.11278281796643905, 0.13049376601146673, 0.15637302354545682, 0.10032808877522202)),
    7: ((0.9955668448764469, 0.9514963206541761, 0.7953111326592681, 0.3753649188653847),
        (0.0864732976379859, 0.11244700760566419, 0.16612840654599734, 0.13481386323921668)),
    8: ((0.9974683227783248, 0.9698244781951079, 0.8498500665181554, 0.4407148865258888),
        (0.0660230075494279, 0.09669247632218284, 0.16894494634983048, 0.1678273730249692)),
    9: ((0.9985893874176539, 0.9815406013402628, 0.8909205008479273, 0.5030603103575711),
        (0.04978619874057694, 0.08223927331535616, 0.16659604166453124, 0.19995462766723415)),
    10: ((0.9992287384216137, 0.9888953297781282, 0.9218089090852508, 0.5627033427478023),
        (0.03716981065936404, 0.06898008338985447, 0.16006925594475266, 0.2305302271183723)),
    11: ((0.9995823668961759, 0.9933702398713902, 0.9443511563647253, 0.6180583576963049),
        (0.027609854987360433, 0.057323254462707154, 0.15068877832010757, 0.2580002737397324)),
    12: ((0.9997747386783538, 0.9960483433231727, 0.9605130710238401, 0.6683201617638221),
        (0.020470570840080055, 0.047357304152216326, 0.13962659752382442, 0.28142712570522266)),
    13: ((0.9998785263551326, 0.997638349190533, 0.9719587105651143, 0.71297184501546),
        (0.015180928438146642, 0.0389987677232476, 0.12794387520361966, 0.3002378690046522)),
    14: ((0.9999345914460049, 0.9985842212793932, 0.9800482039714677, 0.7524625936697488),
        (0.01125613485713931, 0.032049933697936184, 0.11626477302089167, 0.31447494285146155)),
    15: ((0.99996466603853, 0.9991420513367137, 0.985696909413953, 0.7862119152398396),
        (0.008377521784653449, 0.026392927281139702, 0.10535242516270125, 0.3244364961714454)),
    16: ((0.9999807751460166, 0.9994765170161931, 0.9896675794142084, 0.8164431389057057),
        (0.006244465951006549, 0.021725374353186687, 0.09479359486177566, 0.32944798270830006)),
    17: ((0.999989638273459, 0.9996830260307539, 0.9926087954151531, 0.8433348942997836),
        (0.004638137977735617, 0.017811919920324836, 0.08477068093112614, 0.3315263139934344)),
    18: ((0.9999939796120074, 0.9997794892906547, 0.9942906574799472, 0.862053442600711),
        (0.0036350374954934755, 0.01565652592687895, 0.0758169417864223, 0.33547600207797457)),
    19: ((0.9999966941736592, 0.9998628815021079, 0.9953960861591126, 0.8688467221468332),
        (0.0027701353558866274, 0.0131352714971647, 0.07453013142680631, 0.336281956100702)),
    20: ((0.9999979539513529, 0.9998984581694114, 0.9960403043401775, 0.8746123077084372),
        (0.00227995114057555, 0.011827801328870381, 0.07287609868045772, 0.34528656028887644)),
}


def sqrt_coefficients(n: int) -> FloatArray:
    """``r_k = binom(2k, k) / 4**k`` for ``k < n``: the Toeplitz square root of ``A``.

    >>> sqrt_coefficients(4)
    array([1.    , 0.5   , 0.375 , 0.3125])
    """
    n = _check_n(n)
    r = np.empty(n)
    r[0] = 1.0
    k = np.arange(1, n, dtype=np.float64)
    r[1:] = np.cumprod((2.0 * k - 1.0) / (2.0 * k))
    return r


def toeplitz_lower(first_column: FloatArray) -> FloatArray:
    """The dense lower-triangular Toeplitz matrix with the given first column (for tests)."""
    c = np.asarray(first_column, dtype=np.float64)
    n = c.shape[0]
    i, j = np.indices((n, n))
    return np.where(i >= j, c[np.clip(i - j, 0, n - 1)], 0.0)


def _check_params(theta: FloatArray, w: FloatArray) -> tuple[FloatArray, FloatArray]:
    th = np.asarray(theta, dtype=np.float64)
    ww = np.asarray(w, dtype=np.float64)
    if th.ndim != 1 or th.shape != ww.shape or th.size < 1:
        raise ValueError(f"`theta` and `w` must be 1-d of equal positive length, got {th.shape} and {ww.shape}.")
    if not ((th > 0) & (th < 1)).all():
        raise ValueError(f"every buffer decay `theta` must be in (0, 1), got {th.tolist()}.")
    if not np.isfinite(ww).all():
        raise ValueError(f"buffer weights `w` must be finite, got {ww.tolist()}.")
    return th, ww


def _check_n(n: int) -> int:
    if int(n) < 1:
        raise ValueError(f"`n` must be a positive number of ticks, got {n}.")
    return int(n)


def blt_coefficients(theta: FloatArray, w: FloatArray, n: int) -> FloatArray:
    """First column of ``B``: ``b_0 = 1``, ``b_k = sum_j w_j theta_j**(k-1)``."""
    th, ww = _check_params(theta, w)
    n = _check_n(n)
    b = np.empty(n)
    b[0] = 1.0
    k = np.arange(n - 1, dtype=np.float64)
    b[1:] = (ww[None, :] * th[None, :] ** k[:, None]).sum(axis=1)
    return b


def blt_strategy_coefficients(theta: FloatArray, w: FloatArray, n: int, block: int = 512) -> FloatArray:
    """First column ``c`` of ``C = B^{-1} A`` (the solution of ``B c = 1``), for ``k < n``.

    The recursion ``c_t = 1 - w . U_t``, ``U_{t+1} = diag(theta) U_t + c_t 1``
    is the linear system ``U_{t+1} = F U_t + 1`` with ``F = diag(theta) - 1 w^T``;
    it is evaluated ``block`` ticks at a time with precomputed powers of ``F``.
    """
    th, ww = _check_params(theta, w)
    n = _check_n(n)
    m = th.size
    F = np.diag(th) - np.outer(np.ones(m), ww)
    L = min(block, n)
    powers = np.empty((L + 1, m, m))  # F^k
    offsets = np.empty((L + 1, m))  # sum_{i<k} F^i 1
    powers[0] = np.eye(m)
    offsets[0] = 0.0
    for k in range(1, L + 1):
        powers[k] = F @ powers[k - 1]
        offsets[k] = offsets[k - 1] + powers[k - 1].sum(axis=1)
    c = np.empty(n)
    U = np.zeros(m)
    for start in range(0, n, L):
        size = min(L, n - start)
        Ub = np.einsum("kij,j->ki", powers[:size], U) + offsets[:size]  # U_{start+k}, k < size
        c[start:start + size] = 1.0 - Ub @ ww
        U = powers[size] @ U + offsets[size]
    return c


@lru_cache(maxsize=256)
def _column_norm_cached(theta: tuple[float, ...], w: tuple[float, ...], n: int) -> float:
    c = blt_strategy_coefficients(np.array(theta), np.array(w), n)
    return float(math.sqrt(float(c @ c)))


def blt_column_norm(theta: FloatArray, w: FloatArray, n: int) -> float:
    """``max_j ||C[:, j]||_2 = ||c_{0:n}||_2`` over an epoch of ``n`` ticks (the sensitivity factor)."""
    th, ww = _check_params(theta, w)
    return _column_norm_cached(tuple(th.tolist()), tuple(ww.tolist()), _check_n(n))


def blt_error_coefficient(theta: FloatArray, w: FloatArray, t: int) -> float:
    """``||B[t-1, :]||**2 = sum_{k<t} b_k**2`` (closed form): the error variance at tick ``t`` per ``sigma**2``."""
    th, ww = _check_params(theta, w)
    t = _check_n(t)
    tt = np.outer(th, th)
    return 1.0 + float((np.outer(ww, ww) * (-np.expm1((t - 1) * np.log(tt))) / (1.0 - tt)).sum())


def blt_loss(theta: FloatArray, w: FloatArray, n: int) -> float:
    """``||b||**2 ||c||**2``: the largest error variance over ``n`` ticks per ``(Delta / mu)**2``."""
    return blt_error_coefficient(theta, w, n) * blt_column_norm(theta, w, n) ** 2


def blt_parameters(n: int, buffers: int = 4) -> tuple[FloatArray, FloatArray]:
    """Buffer parameters ``(theta, w)`` for an epoch of ``n`` ticks (from :data:`BLT_TABLE`).

    The entry for ``p = bitlength(n)`` (fitted for ``2**p - 1 >= n`` ticks) is
    used; beyond the table, its last entry. Other buffer counts are fitted on
    the spot with :func:`fit_blt` (slow; cached).
    """
    n = _check_n(n)
    if buffers == 4 and BLT_TABLE:
        p = min(n.bit_length(), max(BLT_TABLE))
        th, ww = BLT_TABLE[p]
        return np.array(th), np.array(ww)
    return _fit_cached(n, int(buffers))


@lru_cache(maxsize=32)
def _fit_cached(n: int, buffers: int) -> tuple[FloatArray, FloatArray]:
    return fit_blt((1 << n.bit_length()) - 1, buffers)


# --------------------------------------------------------------------------- fitting


def _loss_closed_form(theta: FloatArray, w: FloatArray, n: int) -> float:
    """``||b||**2 ||c||**2`` by partial fractions, ``O(m**2)`` (for fitting; ~1e-7 relative accuracy)."""
    m = theta.size
    Q = np.poly(theta)  # prod_j (1 - theta_j x), ascending powers of x
    P = Q.copy()
    for j in range(m):
        P[1:] += w[j] * np.poly(np.delete(theta, j))
    roots = np.roots(P[::-1])
    if np.any(np.abs(roots) <= 1.0):  # 1/b(x) unstable: c grows without bound
        return math.inf
    rho = 1.0 / roots  # P(x) = prod_i (1 - rho_i x)
    kappa = Q[-1] / P[-1]
    r = np.array([np.polyval(Q[::-1], roots[i]) / np.prod([1 - rho[j] / rho[i] for j in range(m) if j != i])
                  for i in range(m)])
    alpha = kappa + np.sum(r / (1 - rho))
    beta = -r * rho / (1 - rho)

    def geo(z: Any) -> Any:  # sum_{k<n} z**k, elementwise (complex)
        return -np.expm1(n * np.log(z)) / (1 - z)

    c2 = n * alpha**2 + 2 * alpha * np.sum(beta * geo(rho)) + np.sum(np.outer(beta, beta) * geo(np.outer(rho, rho)))
    v = blt_error_coefficient(theta, w, n) * float(np.real(c2))
    return v if math.isfinite(v) and v > 0 else math.inf


def fit_blt(n: int, buffers: int = 4, start: tuple[FloatArray, FloatArray] | None = None,
            max_evaluations: int = 20_000) -> tuple[FloatArray, FloatArray]:
    """Fit ``buffers`` BLT buffers minimising ``||b||**2 ||c||**2`` over ``n`` ticks (needs scipy).

    Starts from a discretisation of the square root's integral representation
    ``r_k = (1/pi) int_0^1 s**(k - 1/2) (1 - s)**(-1/2) ds`` (geometric cells in
    ``1 - s``), and from ``start`` if given; Nelder–Mead then BFGS on
    ``(log w, log(1 - theta))``.
    """
    from scipy.optimize import minimize

    n, m = _check_n(n), int(buffers)
    if m < 1:
        raise ValueError(f"`buffers` must be a positive integer, got {buffers}.")
    edges = np.exp(np.linspace(math.log(1.0 / (4 * n + 4)), 0.0, m + 1))
    arcsine = (2 / math.pi) * (np.arcsin(np.sqrt(1 - edges[:-1])) - np.arcsin(np.sqrt(1 - edges[1:])))
    u = np.sqrt(edges[:-1] * edges[1:])
    starts = [np.concatenate([np.log(arcsine * (1 - u)), np.log(u)])]
    if start is not None:
        th0, w0 = _check_params(*start)
        starts.append(np.concatenate([np.log(w0), np.log1p(-th0)]))

    def objective(x: FloatArray) -> float:
        if np.any(x[m:] >= 0):
            return 50.0
        with np.errstate(all="ignore"):
            v = _loss_closed_form(-np.expm1(x[m:]), np.exp(x[:m]), n)
        return math.log(v) if math.isfinite(v) else 50.0

    best = None
    for x0 in starts:
        r1 = minimize(objective, x0, method="Nelder-Mead",
                      options={"maxiter": max_evaluations, "maxfev": max_evaluations, "xatol": 1e-9, "fatol": 1e-13,
                               "adaptive": True})
        r2 = minimize(objective, r1.x, method="BFGS")
        for r in (r1, r2):
            if best is None or r.fun < best.fun:
                best = r
    assert best is not None
    order = np.argsort(np.expm1(best.x[m:]))  # slowest buffer (largest theta) first
    return -np.expm1(best.x[m:])[order], np.exp(best.x[:m])[order]


# --------------------------------------------------------------------------- mechanism


class BLTMechanism:
    """Continual release by a buffered-linear-Toeplitz factorization with keyed Gaussian noise.

    Parameters
    ----------
    dim
        Length of the released vector.
    capacity
        Ticks per epoch ``n``; the factorization (and its column norm) is
        that of an ``n x n`` ``A``. A full epoch is closed at once: its last
        noise is frozen into ``carry`` and the buffers restart.
    theta, w
        Buffer decays (in ``(0, 1)``) and weights (see the module docstring).
    scale
        Per-coordinate std ``sigma`` of ``z``; ``0`` switches noise off.
    seed, stream
        Secret key of the noise: ``z_t`` is drawn at address
        ``(epoch, level=0, index=t)`` (:class:`~models.ground.noise.KeyedNoise`).
    event
        The privacy event this calibration spends (built by :meth:`gaussian`).

    State: :class:`~models.mechanisms.TreeState` with ``nodes`` of shape
    ``(1 + m, dim)``: row 0 is ``eta`` of the last release in this epoch,
    rows ``1..m`` are the buffers ``S_j``. Memory is ``(m + 3) dim`` floats
    per model whatever the horizon.

    Privacy
    -------
    Event-level, replace-one, L2 sensitivity ``Delta`` of one tick's
    increment (``Delta = Lx max_u ||V[:, u]||`` for the bandits' ``b`` with
    rewards in ``[0, 1]``). The releases are ``B (C x + z)``: a
    post-processing of the Gaussian mechanism ``C x + z``, in which one
    increment moves ``C x`` by at most ``Delta ||c||_2`` (the largest column
    norm of ``C``, computed exactly for the epoch; each increment belongs to
    one epoch). With adaptively chosen increments this still holds because
    ``C`` is lower-triangular (Denisov et al. 2022, Thm 2.1). Event:
    ``FactorizationEvent(sigma / Delta, ||c||_2)``, i.e. ``mu``-GDP with
    ``mu = Delta ||c||_2 / sigma`` (``GDPAccountant``) or
    ``rho = mu**2 / 2`` (``ZCDPAccountant``).

    Examples
    --------
    A restored state continues with bit-identical releases:

    >>> import numpy as np
    >>> mech = BLTMechanism.gaussian(dim=2, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=100, seed=3)
    >>> s = mech.init_state()
    >>> for _ in range(5):
    ...     _, s, _ = mech.step(s, np.ones(2))
    >>> s2 = TreeState.from_mapping(s.to_mapping())
    >>> bool((mech.step(s, np.ones(2))[0] == mech.step(s2, np.ones(2))[0]).all())
    True
    >>> round(mech.event.column_norm, 4), round(mech.noise_multiplier, 3)
    (1.591, 3.172)
    """

    name = "blt"

    def __init__(
        self,
        *,
        dim: int,
        capacity: int,
        theta: FloatArray,
        w: FloatArray,
        scale: float,
        seed: int | None,
        stream: int = 0,
        event: DpEvent | None = None,
    ) -> None:
        if int(dim) < 1:
            raise ValueError(f"`dim` must be a positive integer, got {dim}.")
        if int(capacity) < 1:
            raise ValueError(f"`capacity` must be a positive number of ticks, got {capacity}.")
        if not (scale >= 0 and math.isfinite(scale)):
            raise ValueError(f"`scale` must be finite and non-negative, got {scale}.")
        if seed is None:
            raise ValueError("`seed` must be an integer: keyed noise needs a secret seed for exact restore.")
        self.theta, self.w = _check_params(theta, w)
        self.dim = int(dim)
        self.capacity = int(capacity)
        self.scale = float(scale)
        self.seed = int(seed)
        self.stream = int(stream)
        self.noise_kind = "gaussian"
        self._source = KeyedNoise(self.seed, self.stream)
        self.column_norm = blt_column_norm(self.theta, self.w, self.capacity)
        if event is None:
            event = NoNoiseEvent() if self.scale == 0 else FactorizationEvent(self.scale, self.column_norm)
        self._event = event

    @classmethod
    def gaussian(
        cls,
        *,
        dim: int,
        sensitivity: float,
        epsilon: float,
        delta: float,
        horizon: int,
        seed: int | None,
        stream: int = 0,
        accounting: Literal["zcdp", "exact"] = "exact",
        buffers: int = 4,
    ) -> BLTMechanism:
        """BLT over epochs of ``horizon`` ticks, calibrated to ``(epsilon, delta)`` over the L2 sensitivity.

        ``accounting="exact"``: ``sigma = Delta ||c|| / mu`` with the exact
        Gaussian-DP ``mu`` (analytic Gaussian mechanism); ``"zcdp"``:
        ``sigma = Delta ||c|| / sqrt(2 rho)``.
        """
        eps, d2 = check_epsilon(epsilon), check_sensitivity(sensitivity)
        check_delta(delta)
        n = _check_n(horizon)
        theta, w = blt_parameters(n, buffers)
        if math.isinf(eps):
            return cls(dim=dim, capacity=n, theta=theta, w=w, scale=0.0, seed=seed, stream=stream)
        col = blt_column_norm(theta, w, n)
        if accounting == "zcdp":
            nm = col / math.sqrt(2.0 * rho_from_epsilon(eps, delta))
        elif accounting == "exact":
            nm = col / gdp_mu(eps, delta)
        else:
            raise ValueError(f"`accounting` must be 'zcdp' or 'exact', got {accounting!r}.")
        return cls(dim=dim, capacity=n, theta=theta, w=w, scale=d2 * nm, seed=seed, stream=stream,
                   event=FactorizationEvent(nm, col))

    # ------------------------------------------------------------------ protocol

    @property
    def event(self) -> DpEvent:
        """What the whole stream spends per contributing interaction."""
        return self._event

    @property
    def buffers(self) -> int:
        return int(self.theta.size)

    @property
    def noise_multiplier(self) -> float:
        """``sigma / Delta`` of the calibration (``0`` without noise)."""
        return float(getattr(self._event, "noise_multiplier", 0.0))

    def prefix_variance(self, t: int) -> float:
        """Per-coordinate variance of the noise released after ``t`` ticks of an epoch."""
        return self.scale**2 * blt_error_coefficient(self.theta, self.w, t)

    def init_state(self) -> TreeState:
        z = np.zeros(self.dim)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(), nodes=np.zeros((1 + self.buffers, self.dim)))

    def reset_state(self, state: TreeState) -> TreeState:
        """Close the current epoch: freeze its last noise into ``carry``; restart the buffers."""
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state),
                       nodes=np.zeros_like(state.nodes))

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        """Decode a state written by ``state.to_mapping()``, checking it fits this mechanism."""
        state = TreeState.from_mapping(mapping)
        if state.nodes.shape != (1 + self.buffers, self.dim):
            raise ValueError(f"state has nodes of shape {state.nodes.shape}, expected {(1 + self.buffers, self.dim)}.")
        return state

    def noise(self, state: TreeState) -> FloatArray:
        """``eta`` of the last release: ``carry`` plus this epoch's correlated noise."""
        out: FloatArray = state.carry + state.nodes[0]
        return out

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Add one tick's increment; return ``(prefix + eta, new_state, event)``."""
        inc = self._check_vector(increment, "increment")
        return self.step_to(state, state.prefix + inc)

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        """Advance one tick whose exact running sum is ``prefix`` (held by the caller)."""
        prefix = self._check_vector(prefix, "prefix")
        if state.step >= self.capacity:  # a state written before the eager reset below
            state = self.reset_state(state)
        t = state.step + 1
        z = self._source.normal(self.scale, (self.dim,), epoch=state.epoch, level=0, index=t)
        nodes = np.empty_like(state.nodes)
        eta = z.copy()
        for j in range(self.buffers):  # an explicit loop: the same float operations on every machine
            eta += self.w[j] * state.nodes[1 + j]
            nodes[1 + j] = self.theta[j] * state.nodes[1 + j] + z
        nodes[0] = eta
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        release = prefix + self.noise(new)
        if t >= self.capacity:
            new = self.reset_state(new)
        return release, new, self._event

    def _check_vector(self, v: FloatArray, name: str) -> FloatArray:
        a = np.asarray(v, dtype=np.float64)
        if a.shape != (self.dim,):
            raise ValueError(f"`{name}` must have shape ({self.dim},), got {a.shape}.")
        return a

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(dim={self.dim}, capacity={self.capacity}, buffers={self.buffers}, "
                f"scale={self.scale:.6g}, event={self._event})")


class DiscreteBLTMechanism(IncrementSteps, BLTMechanism):
    """BLT with exact discrete Gaussian noise on a grid: the released vector is a function of grid values only.

    The float BLT releases ``prefix + B z``, which equals ``B (C x + z)`` only up to floating-point rounding
    that mixes the data with the noise. Here the Gaussian mechanism ``C x + z`` is run on the grid and ``B`` is
    applied to its output, so every release is a (deterministic, floating-point) post-processing of

        y_t = Q(u_t) + gamma Z_t,   u = C x = B^{-1} (epoch prefix),   Q(v) = gamma round(v / gamma),

    with ``Z_t ~ N_Z(0, s^2)`` i.i.d. per coordinate, ``s = ceil(sigma / gamma)``, drawn from the keyed Philox of
    address ``(epoch, 0, t)`` with integers only (:meth:`~models.ground.noise.KeyedNoise.discrete_gaussian_integers`).
    ``u`` is computed by the same buffer recursion as ``B`` (``u_t = q_t - sum_j w_j S^u_j``), the release by
    ``release_t = base + y_t + sum_j w_j S^y_j`` (``base``: the last release of the closed epochs).

    Privacy (event-level, replace-one, L2 sensitivity ``Delta``, adaptive increments): one increment at tick
    ``j`` moves ``u_t`` by ``c_{t-j} (x_j - x'_j)`` for ``t >= j`` in its epoch and nothing else; rounding moves
    each changed coordinate by at most ``gamma`` more, so ``||Q(u) - Q(u')||_2 <= ||c||_2 Delta + gamma sqrt(d n)``
    (Minkowski over the ``<= d n`` changed coordinates; ``n`` = ticks per epoch). In grid units ``Q(u) / gamma`` is
    an integer vector; the discrete Gaussian of parameter ``s >= sigma / gamma`` on it is
    ``rho = (||c|| Delta + gamma sqrt(d n))^2 / (2 sigma^2)``-zCDP (Canonne, Kamath & Steinke 2020, Thm 14;
    per-tick bounds compose adaptively). Event: ``DiscreteGaussianTreeEvent(sigma / Delta', 1, gamma)`` with
    ``Delta' = ||c|| Delta + gamma sqrt(d n)`` (one "node" carrying the whole inflated sensitivity: the
    accountants' ``rho = 1 / (2 nm^2)`` is exactly the bound above).

    State: ``nodes`` has ``3 + 2 m`` rows: ``B y`` of the last release in this epoch, ``base``, the epoch's
    prefix ``q``, the ``m`` buffers of ``u``, the ``m`` buffers of ``y``. ``noise(state)`` is
    ``release - prefix`` (floating point; for the variance bookkeeping only).

    >>> m = DiscreteBLTMechanism.calibrate(dim=3, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=100, seed=1)
    >>> s = m.init_state()
    >>> r, s, _ = m.step(s, np.array([0.3, -0.7, 0.5]))
    >>> bool(np.abs(r - [0.3, -0.7, 0.5]).max() < 10 * m.scale)
    True
    """

    name = "discrete-blt"

    def __init__(self, *, dim: int, capacity: int, theta: FloatArray, w: FloatArray, scale: float, seed: int | None,
                 grid: float, stream: int = 0, event: DpEvent | None = None) -> None:
        g = check_grid(grid)
        units = grid_units(scale, g)
        if event is None:  # uncalibrated: relative to a unit sensitivity, as BLTMechanism's default event
            inflated = blt_column_norm(theta, w, int(capacity)) + g * math.sqrt(int(dim) * int(capacity))
            event = NoNoiseEvent() if scale == 0 else DiscreteGaussianTreeEvent(float(scale) / inflated, 1, g)
        super().__init__(dim=dim, capacity=capacity, theta=theta, w=w, scale=g * units, seed=seed, stream=stream,
                         event=event)
        self.grid = g
        self.units = units
        self.sigma = float(scale)  # the calibrated sigma; the noise's parameter is grid * units >= sigma

    @classmethod
    def calibrate(cls, *, dim: int, sensitivity: float, epsilon: float, delta: float, horizon: int,
                  seed: int | None, stream: int = 0, grid: float | None = None,
                  buffers: int = 4) -> DiscreteBLTMechanism:
        """``(epsilon, delta)``-DP through zCDP for the rounded ``C x`` (see the class docstring).

        ``sigma = Delta' / sqrt(2 rho)``, ``Delta' = ||c|| Delta + grid sqrt(dim horizon)``, ``rho`` from
        :func:`~models.accounting.rho_from_epsilon`; ``grid`` defaults to
        :func:`~models.ground.noise.default_grid` of ``Delta``.
        """
        eps, d2 = check_epsilon(epsilon), check_sensitivity(sensitivity)
        check_delta(delta)
        n = _check_n(horizon)
        g = default_grid(d2) if grid is None else check_grid(grid)
        theta, w = blt_parameters(n, buffers)
        if math.isinf(eps):
            return cls(dim=dim, capacity=n, theta=theta, w=w, scale=0.0, seed=seed, grid=g, stream=stream)
        inflated = blt_column_norm(theta, w, n) * d2 + g * math.sqrt(int(dim) * n)
        sigma = inflated / math.sqrt(2.0 * rho_from_epsilon(eps, delta))
        return cls(dim=dim, capacity=n, theta=theta, w=w, scale=sigma, seed=seed, grid=g, stream=stream,
                   event=DiscreteGaussianTreeEvent(sigma / inflated, 1, g))

    @property
    def noise_multiplier(self) -> float:
        """``sigma / Delta'`` of the calibration, ``Delta'`` the rounded query's sensitivity (``0`` without noise)."""
        return float(getattr(self._event, "noise_multiplier", 0.0))

    def init_state(self) -> TreeState:
        z = np.zeros(self.dim)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(),
                         nodes=np.zeros((3 + 2 * self.buffers, self.dim)))

    def reset_state(self, state: TreeState) -> TreeState:
        """Close the epoch: its last release becomes ``base``; the buffers and the epoch prefix restart."""
        nodes = np.zeros_like(state.nodes)
        nodes[1] = state.nodes[1] + state.nodes[0]
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state), nodes=nodes)

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        state = TreeState.from_mapping(mapping)
        shape = (3 + 2 * self.buffers, self.dim)
        if state.nodes.shape != shape:
            raise ValueError(f"state has nodes of shape {state.nodes.shape}, expected {shape}.")
        return state

    def noise(self, state: TreeState) -> FloatArray:
        """``release - prefix`` of the last release (zeros without noise)."""
        if self.scale == 0:
            return np.zeros(self.dim)
        out: FloatArray = state.nodes[1] + state.nodes[0] - state.prefix
        return out


    def _advance(self, state: TreeState, prefix: FloatArray, inc: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        if state.step >= self.capacity:
            state = self.reset_state(state)
        t = state.step + 1
        if self.scale == 0:  # noise off: nothing to harden, the exact prefix
            new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=state.nodes)
            if t >= self.capacity:
                new = self.reset_state(new)
            return prefix, new, self._event
        m, g = self.buffers, self.grid
        old = state.nodes
        nodes = np.empty_like(old)
        q = old[2] + inc
        u = q.copy()
        for j in range(m):  # u = B^{-1} q, an explicit loop: the same float operations everywhere
            u -= self.w[j] * old[3 + j]
        z = self._source.discrete_gaussian_integers(self.scale, (self.dim,), epoch=state.epoch, level=0, index=t,
                                                    gamma=g)
        y = (np.round(u / g) + z.astype(np.float64)) * g  # integers below 2**53 times a power of two: exact
        by = y.copy()
        for j in range(m):
            by += self.w[j] * old[3 + m + j]
            nodes[3 + j] = self.theta[j] * old[3 + j] + u
            nodes[3 + m + j] = self.theta[j] * old[3 + m + j] + y
        nodes[0], nodes[1], nodes[2] = by, old[1], q
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        release: FloatArray = old[1] + by
        if t >= self.capacity:
            new = self.reset_state(new)
        return release, new, self._event


def _fit_table(max_p: int = 24, buffers: int = 4) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Refit :data:`BLT_TABLE` (warm start from ``p - 1``); a few minutes."""
    table: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    prev: tuple[FloatArray, FloatArray] | None = None
    for p in range(1, max_p + 1):
        if prev is not None:  # halve the slowest decay rates: the epoch doubles
            prev = (1 - (1 - prev[0]) * np.linspace(0.5, 1.0, buffers), prev[1])
        th, ww = fit_blt((1 << p) - 1, buffers, prev)
        table[p] = (tuple(float(x) for x in th), tuple(float(x) for x in ww))
        prev = (th, ww)
    return table


if __name__ == "__main__":  # pragma: no cover - regenerates the table literal
    for p, (th, ww) in _fit_table().items():
        print(f"    {p}: ({th!r},\n        {ww!r}),")
