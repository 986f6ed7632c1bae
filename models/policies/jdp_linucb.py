"""Shariff & Sheffet (2018): jointly differentially private LinUCB with a perturbed Gram matrix.

Each round's augmented vector ``v = [x; y]`` (context and reward) enters the
statistic ``M = sum v v^T`` (``(d+1) x (d+1)``), released by a binary tree
whose node noise is a symmetrised Gaussian matrix or a Wishart matrix (spec
tree-dp A.2–A.4, D.2–D.4; ERRATA §6). The released top-left block
``G + H`` and last column ``u + h`` give the estimate
``theta = V^{-1} u_tilde`` with ``V = lambda I + G + H + shift I``; the
confidence width is Proposition 4's:

    beta = sigma_r sqrt(2 log(2/alpha) + log det V - d log rho_min) + S sqrt(rho_max) + gamma.

Unlike the other private bandits here, S&S protect the **context** too: the
neighbouring relation replaces one round's ``(x, y)``. The guarantee is joint
DP: the action shown to user ``t`` is computed from ``t``'s own context in the
clear, and only the actions shown on later rounds are protected (A.1).

Calibrations (``calibration``):

* ``"paper"`` (Gaussian): ``m = 1 + ceil(log2 n)`` levels,
  ``sigma_noise = 4 sqrt(m) L~**2 ln(4/delta) / epsilon`` (Prop. 11). It
  already covers replace-one neighbours (ERRATA §6: the D.5 ``sqrt 2`` is
  unnecessary for the Gaussian variant).
* ``"tight"`` (Gaussian): ``m = bitlength(n)``, ``sigma = sqrt(m) L~**2 / mu``
  with the exact Gaussian-DP ``mu`` (ERRATA §6: 6–14x smaller).
* ``"paper"`` (Wishart, the only one): ``k = d + 1 + ceil(224 m eps0**-2
  ln(8m/delta) ln(2/delta))`` degrees of freedom per node with
  ``eps0 = epsilon / 2`` (replace-one neighbours: Sheffet's theorem is for
  add/remove, spec D.5), every release padded to exactly ``m k`` degrees of
  freedom (D.3 — mandatory, ERRATA §6) and shifted by ``-c`` (Eq. 4), with the
  derived ``gamma' = gamma sqrt(rho_min / rho'_min)``.

Examples
--------
Without noise the decisions are LinUCB's:

>>> import numpy as np
>>> pol = SSLinUCB(d=2, n_users=1, noise="gaussian", epsilon=float("inf"), alpha=0.3)
>>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
>>> pol.update(0, X[1], 1.0)
>>> pol.select(0, X)
1
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from models.accounting import (DpEvent, GaussianTreeEvent, NoNoiseEvent, WishartTreeEvent, check_delta, check_epsilon,
                               gdp_mu)
from models.ground.noise import KeyedNoise
from models.mechanisms import TreeState, levels_for_horizon
from models.mechanisms.base import state_with_nodes

from .peruser import PerUserLinUCB, levels_ceil

__all__ = ["SSTreeMechanism", "SSLinUCB", "ss_gaussian_constants", "ss_wishart_constants", "wishart_bartlett"]

FloatArray = NDArray[np.float64]
SSNoise = Literal["gaussian", "wishart"]


def wishart_bartlett(g: np.random.Generator, p: int, dof: int, scale: float) -> FloatArray:
    """One ``W_p(scale * I, dof)`` draw by the Bartlett decomposition (``O(p**2)`` for any ``dof``).

    >>> W = wishart_bartlett(np.random.default_rng(0), 3, 10, 2.0)
    >>> W.shape, bool(np.allclose(W, W.T)), bool(np.linalg.eigvalsh(W).min() > 0)
    ((3, 3), True, True)
    """
    if dof < p:
        raise ValueError(f"`dof` must be at least p = {p}, got {dof}.")
    A = np.zeros((p, p))
    A[np.diag_indices(p)] = np.sqrt(g.chisquare(dof - np.arange(p)))
    il = np.tril_indices(p, -1)
    A[il] = g.standard_normal(il[0].size)
    out: FloatArray = scale * (A @ A.T)
    return out


class SSTreeMechanism:
    """Binary tree over the flattened ``(d+1) x (d+1)`` augmented Gram matrix with S&S node noise.

    Parameters
    ----------
    d
        Context dimension (the matrix is ``(d+1) x (d+1)``).
    levels
        ``m``; an epoch holds ``2**m - 1`` ticks.
    noise
        ``"gaussian"``: each node is ``(Z' + Z'^T) / sqrt 2`` with i.i.d.
        ``N(0, sigma**2)`` entries; ``"wishart"``: each node is a
        ``W_{d+1}(L~**2 I, k)`` draw, and every release is padded with a fresh
        ``W_{d+1}(L~**2 I, (m - popcount(t)) k)`` draw so that its noise is
        exactly ``W(L~**2 I, m k)`` (spec D.3).
    sigma
        Gaussian entry std (``0`` switches noise off).
    dof, scale
        Wishart degrees of freedom per node and scale ``L~**2``.
    seed, stream
        Secret key: node ``(epoch, level, index)`` and the padding of tick
        ``t`` at ``(epoch, m, t)``.
    event
        What the calibration spends.

    State: :class:`~models.mechanisms.TreeState` with ``nodes`` of shape
    ``(m + 1, (d+1)**2)``: rows ``0..m-1`` hold the live nodes (at the set
    bits of ``step``), row ``m`` the padding of the current release.

    Privacy
    -------
    Event-level, replace-one of one round's ``(x, y)`` with
    ``||x||**2 + y**2 <= L~**2``; each round lies in at most ``m`` nodes.
    Gaussian: per node the Mahalanobis sensitivity of ``v v^T - w w^T`` is
    ``||D||_F / (sqrt 2 sigma) <= L~**2 / sigma`` (ERRATA §6), so the tree is
    ``GaussianTreeEvent(sigma / L~**2, m)`` (exact with ``GDPAccountant``).
    Wishart: ``WishartTreeEvent`` — Sheffet (2015, Thm 4.1) per node plus
    advanced composition, as the paper states it (not re-derived here).
    """

    def __init__(
        self,
        *,
        d: int,
        levels: int,
        noise: SSNoise,
        sigma: float = 0.0,
        dof: int = 0,
        scale: float = 0.0,
        seed: int,
        stream: int = 0,
        event: DpEvent | None = None,
    ) -> None:
        if noise not in ("gaussian", "wishart"):
            raise ValueError(f"`noise` must be 'gaussian' or 'wishart', got {noise!r}.")
        if int(levels) < 1:
            raise ValueError(f"`levels` must be a positive integer, got {levels}.")
        if noise == "wishart" and (dof > 0) and dof < d + 1:
            raise ValueError(f"`dof` must be at least d + 1 = {d + 1}, got {dof}.")
        self.d, self.levels, self.noise_kind = int(d), int(levels), noise
        self.p = self.d + 1
        self.dim = self.p * self.p
        self.sigma, self.dof, self.scale = float(sigma), int(dof), float(scale)
        self.seed, self.stream = int(seed), int(stream)
        self._source = KeyedNoise(self.seed, self.stream)
        self.active = (self.sigma > 0) if noise == "gaussian" else (self.dof > 0 and self.scale > 0)
        self._event = event if event is not None else NoNoiseEvent()

    @property
    def event(self) -> DpEvent:
        return self._event

    @property
    def capacity(self) -> int:
        return (1 << self.levels) - 1

    def _node(self, epoch: int, level: int, index: int) -> FloatArray:
        if not self.active:
            return np.zeros(self.dim)
        g = self._source.generator(epoch=epoch, level=level, index=index)
        if self.noise_kind == "gaussian":
            Z = g.standard_normal((self.p, self.p)) * self.sigma
            return ((Z + Z.T) / math.sqrt(2.0)).reshape(-1)
        return wishart_bartlett(g, self.p, self.dof, self.scale).reshape(-1)

    def _pad(self, epoch: int, t: int) -> FloatArray:
        missing = self.levels - bin(t).count("1")
        if self.noise_kind != "wishart" or not self.active or missing <= 0:
            return np.zeros(self.dim)
        g = self._source.generator(epoch=epoch, level=self.levels, index=t)
        return wishart_bartlett(g, self.p, missing * self.dof, self.scale).reshape(-1)

    def init_state(self) -> TreeState:
        z = np.zeros(self.dim)
        nodes = np.zeros((self.levels + 1, self.dim))
        nodes[self.levels] = self._pad(0, 0)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(), nodes=nodes)

    def reset_state(self, state: TreeState) -> TreeState:
        """Close the epoch: its last noise is frozen into ``carry`` (spec D.1(b): a public prior)."""
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state),
                       nodes=np.zeros_like(state.nodes))

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        return state_with_nodes(mapping, (self.levels + 1, self.dim))

    def noise(self, state: TreeState) -> FloatArray:
        out: FloatArray = state.carry + state.nodes.sum(axis=0)
        return out

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        return self.step_to(state, state.prefix + np.asarray(increment, dtype=np.float64))

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        prefix = np.asarray(prefix, dtype=np.float64)
        if prefix.shape != (self.dim,):
            raise ValueError(f"`prefix` must have shape ({self.dim},), got {prefix.shape}.")
        if state.step >= self.capacity:
            state = self.reset_state(state)
        t = state.step + 1
        i = (t & -t).bit_length() - 1
        nodes = state.nodes.copy()
        nodes[:i] = 0.0
        nodes[i] = self._node(state.epoch, i, t >> i)
        nodes[self.levels] = self._pad(state.epoch, t)
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        return prefix + self.noise(new), new, self._event


def ss_gaussian_constants(*, d: int, n: int, epsilon: float, delta: float, fail_prob: float, lt2: float,
                          calibration: Literal["paper", "tight"], epochs: int = 1) -> dict[str, float]:
    """``m, sigma, Upsilon, shift, rho_min, rho_max, gamma`` of the Gaussian variant (Prop. 11; ERRATA §6).

    ``epochs``: the released noise is the sum of that many epochs' tree noise
    (a stream that rolled over carries each closed epoch's last noise): the
    bound ``Upsilon`` then covers ``epochs * m`` nodes and a union over
    ``epochs * n`` releases. ``sigma`` (the privacy) does not change: each
    interaction is in one epoch.

    >>> c = ss_gaussian_constants(d=10, n=2**20, epsilon=1.0, delta=0.01, fail_prob=0.05, lt2=2.0,
    ...                           calibration="paper")
    >>> c["m"], round(c["sigma"]), round(c["upsilon"], -3), round(c["gamma"])
    (21.0, 220, 68000.0, 35)
    """
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    if calibration == "paper":
        m = levels_ceil(n)
        sigma = 4.0 * math.sqrt(m) * lt2 * math.log(4.0 / dl) / eps
    elif calibration == "tight":
        m = levels_for_horizon(n)
        sigma = math.sqrt(m) * lt2 / gdp_mu(eps, dl)
    else:
        raise ValueError(f"`calibration` must be 'paper' or 'tight', got {calibration!r}.")
    nodes, releases = epochs * m, epochs * n
    ups = sigma * math.sqrt(2.0 * nodes) * (4.0 * math.sqrt(d) + 2.0 * math.log(2.0 * releases / fail_prob))
    gamma = sigma * math.sqrt(nodes / ups) * (math.sqrt(d) + math.sqrt(2.0 * math.log(2.0 * releases / fail_prob)))
    return {"m": float(m), "sigma": sigma, "upsilon": ups, "shift": 2.0 * ups, "rho_min": ups,
            "rho_max": 3.0 * ups, "gamma": gamma}


def ss_wishart_constants(*, d: int, n: int, epsilon: float, delta: float, fail_prob: float,
                         lt2: float, epochs: int = 1) -> dict[str, float]:
    """``m, k, shift (= -c), rho'_min, rho'_max, gamma'`` of the shifted Wishart variant (Prop. 9, Eq. 4, D.3).

    ``epochs``: the released noise sums that many epochs' trees, a Wishart
    with ``epochs * m * k`` degrees of freedom, over ``epochs * n`` releases;
    ``k`` (the privacy) does not change.

    ``epsilon`` is the target for replace-one neighbours; ``k`` is computed at
    ``epsilon / 2`` (spec D.5). With ``epsilon_node = 2 epsilon`` the spec's
    D.12 row is reproduced:

    >>> c = ss_wishart_constants(d=10, n=2**20, epsilon=2.0, delta=0.01, fail_prob=0.05, lt2=2.0)
    >>> int(c["m"]), round(c["k"], -3), round(c["rho_min"], -3), round(c["gamma"], 1)
    (21, 242000.0, 168000.0, 99.6)
    """
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    m = levels_ceil(n)
    eps0 = eps / 2.0
    k = d + 1 + math.ceil(224.0 * m * eps0**-2 * math.log(8.0 * m / dl) * math.log(2.0 / dl))
    s = math.sqrt(d) + math.sqrt(2.0 * math.log(8.0 * epochs * n / fail_prob))
    root = math.sqrt(epochs * m * k)
    rho_min_unshifted = lt2 * (root - s) ** 2
    rho_min = 4.0 * lt2 * root * s
    rho_max = 8.0 * lt2 * root * s
    c = rho_min_unshifted - rho_min
    gamma0 = math.sqrt(lt2) * (math.sqrt(d) + math.sqrt(2.0 * math.log(2.0 * epochs * n / fail_prob)))
    gamma = gamma0 * math.sqrt(rho_min_unshifted / rho_min)
    return {"m": float(m), "k": float(k), "shift": -c, "rho_min": rho_min, "rho_max": rho_max, "gamma": gamma,
            "rho_min_unshifted": rho_min_unshifted}


class SSLinUCB(PerUserLinUCB):
    """Shariff & Sheffet's JDP LinUCB, one model and one tree per user.

    Parameters
    ----------
    noise
        ``"gaussian"`` or ``"wishart"``.
    calibration
        ``"paper"`` or ``"tight"`` (Gaussian only; see the module docstring).
    alpha
        ``"theory"`` (default): Proposition 4's width from the released
        ``V``; or a constant width.
    fail_prob
        ``alpha`` of the paper: failure probability of the accuracy bounds.
    reward_subgaussian, theta_bound
        ``sigma_r`` (1/2 for rewards in ``[0, 1]``) and ``S`` in the width.
    **kwargs
        :class:`~models.policies.peruser.PerUserLinUCB`'s parameters
        (``d, n_users, lambda_, epsilon, delta, horizon, tick, seed, ...``).

    ``lambda_`` is added to ``V`` so that the noise-free policy is exactly
    LinUCB; with noise it is negligible next to the shift.

    Privacy
    -------
    Joint DP, event-level, replace-one of one round's context and reward
    (``||x|| <= L``, ``y in [0, B]``, ``L~**2 = L**2 + B**2``): each user's
    tree is :class:`SSTreeMechanism`'s guarantee; users' trees cover
    disjoint rounds (parallel composition). The decision for round ``t`` uses
    user ``t``'s own contexts in the clear (JDP, not DP).
    """

    SCHEMA = "privrec.SSLinUCB/1"

    def __init__(
        self,
        *,
        noise: SSNoise = "gaussian",
        calibration: Literal["paper", "tight"] = "paper",
        alpha: float | Literal["theory"] = "theory",
        fail_prob: float = 0.05,
        reward_subgaussian: float = 0.5,
        theta_bound: float = 1.0,
        **kwargs: object,
    ) -> None:
        if noise not in ("gaussian", "wishart"):
            raise ValueError(f"`noise` must be 'gaussian' or 'wishart', got {noise!r}.")
        if calibration not in ("paper", "tight"):
            raise ValueError(f"`calibration` must be 'paper' or 'tight', got {calibration!r}.")
        if noise == "wishart" and calibration != "paper":
            raise ValueError("`calibration` must be 'paper' for Wishart noise (no tight Wishart analysis), "
                             f"got {calibration!r}.")
        if not 0 < fail_prob < 1:
            raise ValueError(f"`fail_prob` must be in (0, 1), got {fail_prob}.")
        self.noise_kind: SSNoise = noise
        self.calibration = calibration
        self.fail_prob = float(fail_prob)
        self.reward_subgaussian = float(reward_subgaussian)
        self.theta_bound = float(theta_bound)
        super().__init__(alpha=alpha, **kwargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ set-up

    def _build(self) -> None:
        d, n = self.d, self.user_horizon
        self.lt2 = self.context_bound**2 + self.reward_bound**2
        self.constants: dict[str, float] = {"shift": 0.0, "rho_min": 0.0, "rho_max": 0.0, "gamma": 0.0,
                                            "m": float(levels_ceil(n))}
        if not self.private:
            self.mechanisms = [SSTreeMechanism(d=d, levels=levels_ceil(n), noise=self.noise_kind, seed=self.seed,
                                               stream=1 + u) for u in range(self.n_users)]
            return
        if self.noise_kind == "gaussian":
            c = ss_gaussian_constants(d=d, n=n, epsilon=self.epsilon, delta=self.delta, fail_prob=self.fail_prob,
                                      lt2=self.lt2, calibration=self.calibration)
            event: DpEvent = GaussianTreeEvent(c["sigma"] / self.lt2, int(c["m"]))
            self.mechanisms = [SSTreeMechanism(d=d, levels=int(c["m"]), noise="gaussian", sigma=c["sigma"],
                                               seed=self.seed, stream=1 + u, event=event)
                               for u in range(self.n_users)]
        else:
            c = ss_wishart_constants(d=d, n=n, epsilon=self.epsilon, delta=self.delta, fail_prob=self.fail_prob,
                                     lt2=self.lt2)
            event = WishartTreeEvent(int(c["k"]), int(c["m"]), self.epsilon, self.delta)
            self.mechanisms = [SSTreeMechanism(d=d, levels=int(c["m"]), noise="wishart", dof=int(c["k"]),
                                               scale=self.lt2, seed=self.seed, stream=1 + u, event=event)
                               for u in range(self.n_users)]
        self.constants = c
        self._epoch_constants: dict[int, dict[str, float]] = {1: c}

    def constants_for(self, user: int) -> dict[str, float]:
        """The constants for ``user``'s released noise: ``self.constants`` until its tree rolls over,
        then those of the sum of its ``epoch + 1`` epochs' noise (shift, floor and width grow)."""
        if not self.private:
            return self.constants
        epochs = self.states[user].epoch + 1
        c = self._epoch_constants.get(epochs)
        if c is None:
            common: dict[str, Any] = dict(d=self.d, n=self.user_horizon, epsilon=self.epsilon, delta=self.delta,
                                          fail_prob=self.fail_prob, lt2=self.lt2, epochs=epochs)
            c = (ss_gaussian_constants(calibration=self.calibration, **common) if self.noise_kind == "gaussian"
                 else ss_wishart_constants(**common))
            self._epoch_constants[epochs] = c
        return c

    @property
    def event(self) -> DpEvent:
        return self.mechanisms[0].event

    def _reset_extra(self) -> None:
        p = self.d + 1
        self.m_pending = np.zeros((self.n_users, p * p))  # trusted: this tick's sum of v v^T per user
        self.psd_fixes = 0  # releases whose V needed the D.4 floor (a metric)

    def _conf_is_ainv(self) -> bool:
        return not self.private

    def _extra_arrays(self) -> dict[str, FloatArray]:
        return {"m_pending": self.m_pending, "psd_fixes": np.array([self.psd_fixes])}

    def _load_extra(self, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.m_pending = arrays["m_pending"].astype(np.float64)
        self.psd_fixes = int(arrays["psd_fixes"][0])

    # ------------------------------------------------------------------ learning

    def _accumulate(self, user: int, x: FloatArray, r: float) -> None:
        if self.private:
            v = np.append(x, r)
            self.m_pending[user] += np.outer(v, v).reshape(-1)

    def _init_user(self, user: int) -> None:
        if self.private:
            self._refresh(user, self.states[user])
        else:
            super()._init_user(user)

    def _release_user(self, user: int) -> None:
        if not self.private:  # LinUCB, bit for bit
            self.theta_released[user] = self.ainv_released[user] @ self.b_exact[user]
            self.width_released[user] = self._width(user, logdet=None)
            return
        _, self.states[user], _ = self.mechanisms[user].step(self.states[user], self.m_pending[user])
        self.m_pending[user] = 0.0
        self._refresh(user, self.states[user])

    def _release_user_from_stats(self, user: int, gram: FloatArray, b: FloatArray) -> None:
        """Streamed release: the tree steps to the augmented prefix ``[[G, u], [u^T, 0]]``.

        The bottom-right entry ``sum y^2`` of ``M`` is never used (spec A.2):
        the serving model reads only the released ``[:d, :d]`` and ``[:d, d]``
        blocks, and entry ``(i, j)`` of ``M + N`` is ``M_ij + N_ij``, so what
        is published is the same function of the same noise whatever sits in
        ``M_dd``. The guarantee is therefore the paper mechanism's (with
        ``sum y^2``), and the exact statistics need no ``sum r^2``. Without
        noise: LinUCB with ``C = (lambda I + G)^{-1}``, the twin of
        :meth:`_release_user`.
        """
        d = self.d
        if not self.private:
            V = gram + self.lambda_ * np.eye(d)
            C = np.linalg.inv(V)
            C = 0.5 * (C + C.T)
            self.ainv_released[user] = C
            self.theta_released[user] = C @ b
            self.width_released[user] = self._width(user, logdet=float(np.linalg.slogdet(V)[1]))
            return
        prefix = np.zeros((d + 1, d + 1))
        prefix[:d, :d] = gram
        prefix[:d, d] = b
        prefix[d, :d] = b
        _, self.states[user], _ = self.mechanisms[user].step_to(self.states[user], prefix.reshape(-1))
        self._refresh(user, self.states[user])

    def _stream_scalars(self) -> dict[str, int | float | str | None]:
        return {"psd_fixes": self.psd_fixes}

    def _load_stream_scalars(self, scalars: Mapping[str, int | float | str | None]) -> None:
        self.psd_fixes = int(scalars.get("psd_fixes") or 0)

    def _refresh(self, user: int, state: TreeState) -> None:
        """Released ``V``, ``u_tilde`` → serving model (only released quantities are used)."""
        d, p = self.d, self.d + 1
        released = (state.prefix + self.mechanisms[user].noise(state)).reshape(p, p)
        c = self.constants_for(user)
        V = released[:d, :d] + (self.lambda_ + c["shift"]) * np.eye(d)
        V = 0.5 * (V + V.T)
        u_tilde = released[:d, d]
        floor = c["rho_min"] + self.lambda_
        lmin = float(np.linalg.eigvalsh(V)[0])
        if lmin < floor:  # D.4: post-processing of the released V only
            V = V + (floor - lmin) * np.eye(d)
            self.psd_fixes += 1
        L = np.linalg.cholesky(V)
        Linv = np.linalg.solve(L, np.eye(d))
        C = Linv.T @ Linv
        self.conf_released[user] = 0.5 * (C + C.T)
        self.theta_released[user] = C @ u_tilde
        self.width_released[user] = self._width(user, logdet=2.0 * float(np.log(np.diag(L)).sum()))

    def _width(self, user: int, logdet: float | None) -> float:
        if self.alpha != "theory":
            return float(self.alpha)
        d, lam, c = self.d, self.lambda_, self.constants_for(user)
        rho_min = c["rho_min"] + lam
        rho_max = c["rho_max"] + lam
        if logdet is None:  # noise-free: V = lambda I + G
            sign, logdet = np.linalg.slogdet(np.linalg.inv(self.ainv_released[user]))
        inner = 2.0 * math.log(2.0 / self.fail_prob) + logdet - d * math.log(rho_min)
        return (self.reward_subgaussian * math.sqrt(max(inner, 0.0)) + self.theta_bound * math.sqrt(rho_max)
                + c["gamma"])
