"""Dynamic global sensitivity (Wang, Zhao, Wang, RecSys 2022): tree noise on ``theta`` itself.

Private LinUCB-DGS releases ``theta_p = A^{-1} b + eta`` where ``eta`` is a
binary-tree prefix noise whose node scales shrink with time: one reward moves
``theta_hat`` by at most ``L |r - r'| / lambda_min(A)``, and under the
paper's i.i.d.-context assumption (``lambda_min(E[x x^T]) = lambda_0``)
``lambda_min(A_t) >= lambda + max(0, lambda'_t)`` with (Lemma 1, spec B.1)

    lambda'_t = lambda_0 t / 4 - 8 ln((t + 3) / delta') - 2 sqrt(t ln((t + 3) / delta')).

Implementation choices (spec tree-dp D.6–D.13): ``m = ceil(log2 T) + 1``
levels, ``epsilon' = epsilon / m``, ``delta' = delta / m`` (D.11); a node
covering leaves ``[s, e]`` uses the sensitivity at its *start*,
``Delta = L R / (lambda + max(0, lambda'_{s-1}))`` (D.7, conservative;
``R = 1`` for rewards in ``[0, 1]``, the paper's ``2L`` is for ``|r| <= 1``);
``lambda_0 = None`` keeps the constant ``L R / lambda`` (D.9 option 1).
Laplace: ``"paper"`` scale ``Delta / epsilon'`` (the paper, L2 sensitivity)
or ``"l1"`` scale ``sqrt(d) Delta / epsilon'`` (D.6); Gaussian:
``sigma = Delta sqrt(m / (2 rho))`` (zCDP, D.6). ``A`` is used exactly.

Privacy: **claimed, not proven** — recorded as :class:`~models.accounting.DGSEvent`,
which ``describe`` reports with ``valid=False``: a reward changes every later
leaf ``theta_{t+1} - theta_t`` (through ``b``), not ``m`` of them (spec B.5-1),
and the sensitivity bound holds only with probability ``1 - delta'`` under the
i.i.d.-context assumption (B.5-2). Rewards only (contexts public).

Examples
--------
>>> import numpy as np
>>> round(dgs_lambda_prime(10**6, 0.1, 1e-5 / 21), 1)
14119.8
>>> pol = DGSLinUCB(d=2, n_users=1, noise="laplace", epsilon=float("inf"))
>>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
>>> pol.update(0, X[1], 1.0)
>>> pol.select(0, X)
1
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from models.accounting import DGSEvent, DpEvent, NoNoiseEvent, rho_from_epsilon
from models.ground.noise import KeyedNoise
from models.mechanisms import TreeState

from .peruser import PerUserLinUCB, levels_ceil

__all__ = ["DGSTreeMechanism", "DGSLinUCB", "dgs_lambda_prime", "first_positive_lambda_prime", "pool_lambda_0"]

FloatArray = NDArray[np.float64]
DGSNoise = Literal["laplace", "gaussian"]


def dgs_lambda_prime(t: int, lambda_0: float, delta_node: float) -> float:
    """Lemma 1's lower bound on ``lambda_min`` of a ``t``-term Gram matrix (may be negative)."""
    if t <= 0:
        return -math.inf
    L = math.log((t + 3) / delta_node)
    return lambda_0 * t / 4.0 - 8.0 * L - 2.0 * math.sqrt(t * L)


def pool_lambda_0(arms: FloatArray) -> float | None:
    """``lambda_min(E[x x^T])`` over a public pool of arm features (spec D.9 option 2); ``None`` if not positive.

    >>> pool_lambda_0(np.array([[1.0, 0.0], [0.0, 1.0]]))
    0.5
    >>> pool_lambda_0(np.array([[1.0, 0.0]])) is None
    True
    """
    X = np.asarray(arms, dtype=np.float64)
    if X.ndim != 2 or not len(X):
        raise ValueError(f"`arms` must be a non-empty (K, d) array, got shape {X.shape}.")
    lam = float(np.linalg.eigvalsh(X.T @ X / len(X))[0])
    return lam if lam > 1e-12 else None


def first_positive_lambda_prime(lambda_0: float, delta_node: float, limit: int = 10**15) -> int | None:
    """The first leaf count ``t`` with ``lambda'_t > 0`` (the sensitivity starts to shrink), or ``None`` beyond ``limit``.

    >>> first_positive_lambda_prime(1.0, 0.1)  # spec D.8: ~1.1e3
    1114
    """
    if dgs_lambda_prime(limit, lambda_0, delta_node) <= 0:
        return None
    hi = 1
    while dgs_lambda_prime(hi, lambda_0, delta_node) <= 0:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:  # lambda'_t is increasing where it crosses 0
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if dgs_lambda_prime(mid, lambda_0, delta_node) > 0 else (mid, hi)
    return hi


class DGSTreeMechanism:
    """Binary tree noise whose node scale follows the dynamic global sensitivity.

    ``step_to(state, theta_hat)`` releases ``theta_hat + eta`` (the exact
    estimate is the "prefix"); a node completing at leaf ``t`` at level ``i``
    starts at ``s = t - 2**i + 1`` and has scale ``multiplier * Delta(s - 1)``.

    Parameters
    ----------
    d, levels
        Dimension and ``m`` (an epoch holds ``2**m - 1`` leaves).
    noise
        ``"laplace"`` or ``"gaussian"``.
    multiplier
        Scale per unit of sensitivity (``m / epsilon`` etc.; ``0`` = no noise).
    lambda_, lambda_0, delta_node, bound
        ``Delta(j) = bound / (lambda_ + max(0, lambda'_j))`` after ``j`` leaves
        (``bound = L R``; constant ``bound / lambda_`` when ``lambda_0`` is ``None``).
    seed, stream, event
        Noise key and the event recorded.

    Privacy
    -------
    Not a valid DP proof (module docstring); event :class:`~models.accounting.DGSEvent`.
    """

    def __init__(self, *, d: int, levels: int, noise: DGSNoise, multiplier: float, lambda_: float,
                 lambda_0: float | None, delta_node: float, bound: float, seed: int, stream: int = 0,
                 event: DpEvent | None = None) -> None:
        if noise not in ("laplace", "gaussian"):
            raise ValueError(f"`noise` must be 'laplace' or 'gaussian', got {noise!r}.")
        self.dim = self.d = int(d)
        self.levels, self.noise_kind = int(levels), noise
        self.multiplier = float(multiplier)
        self.lambda_, self.lambda_0, self.delta_node, self.bound = float(lambda_), lambda_0, float(delta_node), bound
        self._source = KeyedNoise(int(seed), int(stream))
        self._event = event if event is not None else NoNoiseEvent()

    @property
    def event(self) -> DpEvent:
        return self._event

    @property
    def capacity(self) -> int:
        return (1 << self.levels) - 1

    def sensitivity(self, leaves: int) -> float:
        """``L R / (lambda + max(0, lambda'_j))`` after ``j = leaves`` leaves (``L R / lambda`` without ``lambda_0``)."""
        if self.lambda_0 is None:
            return self.bound / self.lambda_
        return self.bound / (self.lambda_ + max(0.0, dgs_lambda_prime(leaves, self.lambda_0, self.delta_node)))

    def node_scale(self, epoch: int, level: int, t: int) -> float:
        start = t - (1 << level) + 1
        return self.multiplier * self.sensitivity(epoch * self.capacity + start - 1)

    def init_state(self) -> TreeState:
        z = np.zeros(self.d)
        return TreeState(step=0, epoch=0, prefix=z, carry=z.copy(), nodes=np.zeros((self.levels, self.d)))

    def reset_state(self, state: TreeState) -> TreeState:
        return replace(state, step=0, epoch=state.epoch + 1, carry=self.noise(state), nodes=np.zeros_like(state.nodes))

    def state_from_mapping(self, mapping: dict[str, bytes] | dict[bytes, bytes]) -> TreeState:
        state = TreeState.from_mapping(mapping)
        if state.nodes.shape != (self.levels, self.d):
            raise ValueError(f"state has nodes of shape {state.nodes.shape}, expected {(self.levels, self.d)}.")
        return state

    def noise(self, state: TreeState) -> FloatArray:
        out: FloatArray = state.carry + state.nodes.sum(axis=0)
        return out

    def live_scales(self, state: TreeState) -> list[float]:
        """Scales of the nodes in the last release (for the width)."""
        t = state.step
        return [self.node_scale(state.epoch, i, (t >> i) << i) for i in range(self.levels) if (t >> i) & 1]

    def step(self, state: TreeState, increment: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        return self.step_to(state, state.prefix + np.asarray(increment, dtype=np.float64))

    def step_to(self, state: TreeState, prefix: FloatArray) -> tuple[FloatArray, TreeState, DpEvent]:
        prefix = np.asarray(prefix, dtype=np.float64)
        if state.step >= self.capacity:
            state = self.reset_state(state)
        t = state.step + 1
        i = (t & -t).bit_length() - 1
        nodes = state.nodes.copy()
        nodes[:i] = 0.0
        scale = self.node_scale(state.epoch, i, t)
        if scale > 0:
            g = self._source.generator(epoch=state.epoch, level=i, index=t >> i)
            nodes[i] = (g.laplace(0.0, 1.0, self.d) if self.noise_kind == "laplace"
                        else g.standard_normal(self.d)) * scale
        else:
            nodes[i] = 0.0
        new = TreeState(step=t, epoch=state.epoch, prefix=prefix, carry=state.carry, nodes=nodes)
        return prefix + self.noise(new), new, self._event


class DGSLinUCB(PerUserLinUCB):
    """Private LinUCB-DGS, one model and one ``theta`` tree per user.

    Parameters
    ----------
    noise
        ``"laplace"`` or ``"gaussian"``.
    calibration
        Laplace only: ``"paper"`` (scale ``Delta / epsilon'``) or ``"l1"``
        (``sqrt(d) Delta / epsilon'``).
    lambda_0
        The assumed ``lambda_min(E[x x^T])`` (e.g. from the public arm pool);
        ``None``: constant sensitivity ``L R / lambda``.
    alpha
        Constant width (default 0.3) or ``"theory"`` (spec D.13).
    fail_prob, reward_subgaussian, theta_bound
        ``zeta``, ``R`` and ``S`` of the theory width.
    **kwargs
        :class:`~models.policies.peruser.PerUserLinUCB`'s parameters.

    Privacy
    -------
    Claimed ``(epsilon, delta)``-DP of the arm sequence w.r.t. one reward
    (contexts public); **not a valid proof** (see the module docstring).
    Users' trees cover disjoint rewards.
    """

    SCHEMA = "privrec.DGSLinUCB/1"

    def __init__(
        self,
        *,
        noise: DGSNoise = "laplace",
        calibration: Literal["paper", "l1"] = "paper",
        lambda_0: float | None = None,
        fail_prob: float = 0.05,
        reward_subgaussian: float = 0.5,
        theta_bound: float = 1.0,
        **kwargs: object,
    ) -> None:
        if noise not in ("laplace", "gaussian"):
            raise ValueError(f"`noise` must be 'laplace' or 'gaussian', got {noise!r}.")
        if calibration not in ("paper", "l1"):
            raise ValueError(f"`calibration` must be 'paper' or 'l1', got {calibration!r}.")
        if lambda_0 is not None and not lambda_0 > 0:
            raise ValueError(f"`lambda_0` must be positive or None, got {lambda_0}.")
        self.noise_kind: DGSNoise = noise
        self.calibration = calibration
        self.lambda_0 = lambda_0
        self.fail_prob = float(fail_prob)
        self.reward_subgaussian = float(reward_subgaussian)
        self.theta_bound = float(theta_bound)
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def _build(self) -> None:
        m = levels_ceil(self.user_horizon)
        self.levels = m
        eps_node, delta_node = self.epsilon / m, self.delta / m
        if not self.private:
            mult = 0.0
        elif self.noise_kind == "laplace":
            mult = (math.sqrt(self.d) if self.calibration == "l1" else 1.0) / eps_node
        else:
            mult = math.sqrt(m / (2.0 * rho_from_epsilon(self.epsilon, self.delta)))
        event: DpEvent = (DGSEvent(self.noise_kind, self.epsilon, self.delta, m) if self.private else NoNoiseEvent())
        self.mechanisms = [DGSTreeMechanism(d=self.d, levels=m, noise=self.noise_kind, multiplier=mult,
                                            lambda_=self.lambda_, lambda_0=self.lambda_0, delta_node=delta_node,
                                            bound=self.context_bound * self.reward_bound, seed=self.seed,
                                            stream=1 + u, event=event) for u in range(self.n_users)]

    @property
    def event(self) -> DpEvent:
        return self.mechanisms[0].event

    def _release_user(self, user: int) -> None:
        theta_hat = self.ainv_released[user] @ self.b_exact[user]
        released, self.states[user], _ = self.mechanisms[user].step_to(self.states[user], theta_hat)
        self.theta_released[user] = released
        self.width_released[user] = self._width(user)

    def _release_user_from_stats(self, user: int, gram: FloatArray, b: FloatArray) -> None:
        """Streamed release: ``theta_hat = (lambda I + G)^{-1} b`` through the tree (the twin of :meth:`_release_user`).

        ``A = lambda I + G`` is public (contexts are not protected here) and
        used exactly, as in the paper; the leaf index that sets a node's
        sensitivity is the unit's own release count (at most its interaction
        count, so the sensitivity is never understated).
        """
        C = np.linalg.inv(gram + self.lambda_ * np.eye(self.d))
        C = 0.5 * (C + C.T)
        released, self.states[user], _ = self.mechanisms[user].step_to(self.states[user], C @ b)
        self.ainv_released[user] = C
        self.theta_released[user] = released
        self.width_released[user] = self._width(user)

    def _width(self, user: int) -> float:
        if self.alpha != "theory":
            return float(self.alpha)
        d, lam, zeta = self.d, self.lambda_, self.fail_prob
        t = int(self.counts[user])
        base = (self.reward_subgaussian * math.sqrt(d * math.log((1 + t * self.context_bound**2 / lam) / zeta))
                + math.sqrt(lam) * self.theta_bound)
        mech = self.mechanisms[user]
        assert isinstance(mech, DGSTreeMechanism)
        scales = mech.live_scales(self.states[user])
        if not scales or max(scales) == 0:
            return base
        if self.noise_kind == "laplace":
            b_eta = math.sqrt(d) * math.log(len(scales) * d / zeta) * sum(scales)
        else:
            b_eta = math.sqrt(sum(s * s for s in scales)) * (math.sqrt(d) + math.sqrt(2 * math.log(1 / zeta)))
        return base + math.sqrt(lam + t * self.context_bound**2) * b_eta
