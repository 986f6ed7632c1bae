"""The pipeline's math: exact statistics, private release, serving models.

The streaming pipeline splits one bandit into four stages (DESIGN §1); this
module is the pure part of each:

1. **ingest** — :class:`UnitStats` holds the exact sufficient statistics per
   model unit (``gram_u = sum x x^T``, ``b_u = sum r x``, ``count_u``);
   :meth:`UnitStats.add` folds in a batch of events with the same bits as
   adding them one by one, in order, so a batched stream and an offline
   replay agree exactly.
2. **release** — :class:`Releaser` turns exact statistics into released ones.
   The Gram matrices depend only on public contexts and are released as they
   are; the reward-dependent vector ``b_tilde = vec(B V^T)`` (``(V ⊗ I_d) b``)
   goes through a continual-release mechanism, one tick at a time.
3. **solve** — :func:`solve` turns released statistics into per-unit serving
   models ``(theta_u, M_u)`` (``d`` and ``d x d``).
4. **serve** — :func:`ucb_scores` scores candidates from a serving model in
   ``O(K d^2)``.

Examples
--------
>>> import numpy as np
>>> stats = UnitStats.zeros(n_units=2, d=2)
>>> stats.add(np.array([0, 0, 1]), np.eye(2)[[0, 1, 0]], np.array([1.0, 0.0, 1.0]))
>>> stats.count.tolist()
[2, 1]
>>> rel = Releaser(structure="linucb", V=np.eye(2), d=2, mechanism=None)
>>> released = rel.release(stats, rel.init_state())[0]
>>> theta, M = solve(released, lambda_=1.0)
>>> theta[0].round(3).tolist()
[0.5, 0.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import cho_factor
from scipy.linalg.lapack import dpotri

from ._codec import decode_arrays, encode_arrays
from .accounting import DpEvent, NoNoiseEvent
from .mechanisms import Mechanism, TreeState, noise_std

__all__ = ["UnitStats", "ReleasedStats", "Releaser", "solve", "ucb_scores", "check_interaction"]

FloatArray = NDArray[np.float64]


@dataclass(slots=True)
class UnitStats:
    """Exact sufficient statistics per model unit (trusted data).

    Attributes
    ----------
    gram
        ``(N, d, d)``: ``sum x x^T`` over each unit's interactions.
    b
        ``(N, d)``: ``sum r x``.
    count
        ``(N,)``: interactions per unit.
    """

    gram: FloatArray
    b: FloatArray
    count: NDArray[np.int64]

    SCHEMA = "privrec.UnitStats/1"

    @classmethod
    def zeros(cls, *, n_units: int, d: int) -> UnitStats:
        if n_units < 1 or d < 1:
            raise ValueError(f"`n_units` and `d` must be positive, got {n_units} and {d}.")
        return cls(np.zeros((n_units, d, d)), np.zeros((n_units, d)), np.zeros(n_units, dtype=np.int64))

    @property
    def n_units(self) -> int:
        return int(self.b.shape[0])

    @property
    def d(self) -> int:
        return int(self.b.shape[1])

    def add(self, units: NDArray[np.int64], contexts: FloatArray, rewards: FloatArray) -> None:
        """Fold in a batch of interactions (in order), bit-identically to one at a time.

        ``np.add.at`` applies unbuffered additions in index order, so repeated
        units accumulate exactly as a sequential loop would.
        """
        units = np.asarray(units, dtype=np.int64)
        X = np.asarray(contexts, dtype=np.float64)
        r = np.asarray(rewards, dtype=np.float64)
        n = units.shape[0]
        if X.shape != (n, self.d):
            raise ValueError(f"`contexts` must have shape ({n}, {self.d}), got {X.shape}.")
        if r.shape != (n,):
            raise ValueError(f"`rewards` must have shape ({n},), got {r.shape}.")
        if n and (units.min() < 0 or units.max() >= self.n_units):
            raise ValueError(f"`units` must lie in [0, {self.n_units}), got {units.min()}..{units.max()}.")
        if not n:
            return
        # Per unit, a left-to-right running sum (np.add.accumulate is strictly sequential), so the
        # result is bit-identical to adding the events one at a time, in order.
        order = np.argsort(units, kind="stable")
        us, Xs, rs = units[order], X[order], r[order]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]])
        ends = np.r_[starts[1:], n]
        d = self.d
        for s, e in zip(starts.tolist(), ends.tolist()):
            k = int(us[s])
            G = np.empty((e - s + 1, d, d))
            G[0] = self.gram[k]
            np.multiply(Xs[s:e, :, None], Xs[s:e, None, :], out=G[1:])
            np.add.accumulate(G, axis=0, out=G)
            self.gram[k] = G[-1]
            B = np.empty((e - s + 1, d))
            B[0] = self.b[k]
            np.multiply(rs[s:e, None], Xs[s:e], out=B[1:])
            np.add.accumulate(B, axis=0, out=B)
            self.b[k] = B[-1]
            self.count[k] += e - s

    @classmethod
    def merged(cls, shards: list[UnitStats]) -> UnitStats:
        """Sum of per-partition shards, added in the given order (``0 + s_0 + s_1 + ...``)."""
        if not shards:
            raise ValueError("`shards` must not be empty.")
        total = cls.zeros(n_units=shards[0].n_units, d=shards[0].d)
        for s in shards:
            total.gram += s.gram
            total.b += s.b
            total.count += s.count
        return total

    def copy(self) -> UnitStats:
        return UnitStats(self.gram.copy(), self.b.copy(), self.count.copy())

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays({"gram": self.gram, "b": self.b, "count": self.count}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> UnitStats:
        a, _ = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(a["gram"].astype(np.float64), a["b"].astype(np.float64), a["count"].astype(np.int64))


@dataclass(frozen=True, slots=True)
class ReleasedStats:
    """What may leave the trusted boundary: exact Grams, the noisy ``b_tilde``, and ``V``.

    Attributes
    ----------
    structure
        ``"linucb"`` (block-diagonal) or ``"kron"`` (dense ``dN x dN`` Gram).
    V
        ``N x N`` mixing matrix (public).
    gram
        ``(N, d, d)`` per-unit Gram matrices of chosen contexts (public data).
    b_tilde
        ``(N*d,)`` released ``(V ⊗ I_d) b`` (noisy unless the mechanism is off).
    count
        ``(N,)`` interactions per unit (public).
    version
        Release tick that produced it.
    noise_std
        Largest per-coordinate std of the noise in ``b_tilde``
        (:func:`models.mechanisms.noise_std`; public: it depends on the
        calibration and the tick count only). ``0`` without noise.
    """

    structure: str
    V: FloatArray
    gram: FloatArray
    b_tilde: FloatArray
    count: NDArray[np.int64]
    version: int = 0
    event: DpEvent = field(default_factory=NoNoiseEvent)
    noise_std: float = 0.0

    SCHEMA = "privrec.ReleasedStats/1"

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays({"V": self.V, "gram": self.gram, "b_tilde": self.b_tilde, "count": self.count},
                             scalars={"structure": self.structure, "version": self.version,
                                      "noise_std": self.noise_std}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: dict[str, bytes] | dict[bytes, bytes]) -> ReleasedStats:
        a, s = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(str(s["structure"]), a["V"].astype(np.float64), a["gram"].astype(np.float64),
                   a["b_tilde"].astype(np.float64), a["count"].astype(np.int64), int(s["version"]),  # type: ignore[arg-type]
                   noise_std=float(s.get("noise_std") or 0.0))


class Releaser:
    """Release stage: exact :class:`UnitStats` → :class:`ReleasedStats`, one tick per call.

    Parameters
    ----------
    structure
        ``"linucb"`` (``V = I``: the private vector is ``B`` itself) or
        ``"kron"`` (CoLin / GOB.Lin: ``b_tilde = vec(V B)`` row-blocks).
    V
        ``N x N`` mixing matrix.
    d
        Context dimension.
    mechanism
        Continual-release mechanism over the ``N*d`` vector (calibrated to
        ``max_u Lx ||V[:, u]||``), or ``None`` for no noise.

    Privacy
    -------
    Event-level: one interaction of unit ``u`` changes ``b_tilde`` by
    ``kron(V[:, u], x) * (r - r')``, of L2 norm at most ``Lx ||V[:, u]||_2``
    for rewards in ``[0, 1]`` (the pipeline rejects rewards outside it).
    Grams and counts depend on public data only.
    """

    def __init__(self, *, structure: str, V: FloatArray, d: int, mechanism: Mechanism | None) -> None:
        if structure not in ("linucb", "kron"):
            raise ValueError(f"`structure` must be 'linucb' or 'kron', got {structure!r}.")
        V = np.asarray(V, dtype=np.float64)
        if structure == "linucb" and not np.array_equal(V, np.eye(V.shape[0])):
            raise ValueError("`V` must be the identity for structure 'linucb'.")
        if mechanism is not None and mechanism.dim != V.shape[0] * d:
            raise ValueError(f"`mechanism` must release {V.shape[0] * d} values, got dim {mechanism.dim}.")
        self.structure, self.V, self.d, self.mechanism = structure, V, int(d), mechanism

    def init_state(self) -> TreeState | None:
        return None if self.mechanism is None else self.mechanism.init_state()

    def exact_b_tilde(self, stats: UnitStats) -> FloatArray:
        """``(V ⊗ I_d) vec(B)``: block ``j`` is ``sum_u V[j, u] b_u`` (exact, trusted)."""
        if self.structure == "linucb":
            return stats.b.reshape(-1).copy()
        out: FloatArray = (self.V @ stats.b).reshape(-1)
        return out

    def release(self, stats: UnitStats, state: TreeState | None, version: int = 0
                ) -> tuple[ReleasedStats, TreeState | None]:
        """One tick: noisy prefix of ``b_tilde`` plus the public Grams. Persist the new state *first*."""
        exact = self.exact_b_tilde(stats)
        event: DpEvent = NoNoiseEvent()
        std = 0.0
        if self.mechanism is not None:
            if state is None:
                raise ValueError("`state` is required when a mechanism is set.")
            exact, state, event = self.mechanism.step_to(state, exact)
            std = noise_std(self.mechanism, state)
        rel = ReleasedStats(self.structure, self.V, stats.gram.copy(), exact, stats.count.copy(), version, event,
                            std)
        return rel, state


def solve(released: ReleasedStats, *, lambda_: float, noise_ridge: float = 0.0) -> tuple[FloatArray, FloatArray]:
    """Serving models from released statistics: ``theta (N, d)`` and ``M (N, d, d)``.

    With ``noise_ridge = kappa > 0`` the ridge is ``lambda_ + kappa * released.noise_std``
    (as :class:`models.policies.KroneckerUCB`'s ``noise_ridge``; post-processing of public values).

    ``theta_u = (V[:,u]^T ⊗ I) A^{-1} b_tilde`` and
    ``M_u = (V[:,u]^T ⊗ I) A^{-1} (V[:,u] ⊗ I)`` with
    ``A = lambda I + sum_u (V[:,u] V[:,u]^T) ⊗ gram_u`` (ERRATA §3);
    for ``"linucb"``, ``A`` is block-diagonal and ``M_u = (lambda I + gram_u)^{-1}``.
    Cost: ``O(N d^3)`` for LinUCB, ``O((dN)^3)`` for the dense case.
    """
    if not (lambda_ > 0 and math.isfinite(lambda_)):
        raise ValueError(f"`lambda_` must be positive, got {lambda_}.")
    if not (noise_ridge >= 0 and math.isfinite(noise_ridge)):
        raise ValueError(f"`noise_ridge` must be a non-negative number, got {noise_ridge}.")
    lambda_ = lambda_ + noise_ridge * released.noise_std
    G, V = released.gram, released.V
    n, d = G.shape[0], G.shape[1]
    if released.structure == "linucb":
        M = np.linalg.inv(G + lambda_ * np.eye(d))
        M = 0.5 * (M + M.transpose(0, 2, 1))
        theta = np.einsum("uab,ub->ua", M, released.b_tilde.reshape(n, d))
        return theta, M
    # A[j,a,k,b] = lambda delta + sum_u V[j,u] V[k,u] G_u[a,b]
    P = (V[:, None, :] * V[None, :, :]).reshape(n * n, n)
    A = (P @ G.reshape(n, d * d)).reshape(n, n, d, d).transpose(0, 2, 1, 3).reshape(n * d, n * d)
    A[np.diag_indices_from(A)] += lambda_
    # A is symmetric positive definite (lambda > 0): Cholesky, then the inverse from the factor
    # (dpotri) — about 2x faster than a general inverse at dN = 2500.
    factor, _ = cho_factor(A, lower=True, overwrite_a=True, check_finite=False)
    lower = dpotri(factor, lower=1)[0]
    Ainv = np.tril(lower) + np.tril(lower, -1).T
    # Qt[u] = (V[:,u]^T ⊗ I) A^{-1}: (N, d, dN)
    Qt = (V.T @ Ainv.reshape(n, d * n * d)).reshape(n, d, n * d)
    theta = Qt @ released.b_tilde
    M = np.einsum("uakb,ku->uab", Qt.reshape(n, d, n, d), V)
    M = 0.5 * (M + M.transpose(0, 2, 1))
    return theta, M


def check_interaction(context: object, reward: float, d: int) -> tuple[NDArray[np.float64], float]:
    """``(x, r)``: ``context`` as a float vector of shape ``(d,)`` and a finite ``reward``, or a ``ValueError``."""
    x = np.asarray(context, dtype=np.float64)
    if x.shape != (d,):
        raise ValueError(f"`context` must have shape ({d},), got {x.shape}.")
    r = float(reward)
    if not math.isfinite(r):
        raise ValueError(f"`reward` must be finite, got {reward}.")
    return x, r


def ucb_scores(theta: FloatArray, M: FloatArray, contexts: FloatArray, alpha: float
               ) -> tuple[FloatArray, FloatArray]:
    """``(mean, bonus)`` per candidate row: ``x^T theta`` and ``alpha sqrt(x^T M x)``."""
    X = np.asarray(contexts, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != theta.shape[0]:
        raise ValueError(f"`contexts` must have shape (K, {theta.shape[0]}), got {X.shape}.")
    mean = X @ theta
    bonus = alpha * np.sqrt(np.maximum(((X @ M) * X).sum(axis=1), 0.0))
    return mean, bonus
