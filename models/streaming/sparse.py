"""CoLin / GOB.Lin over every user: the Kronecker statistic solved matrix-free with a sparse relation matrix.

The dense solve (:func:`models.streaming.solve`) builds ``A = lambda I + sum_u (V[:,u] V[:,u]^T) ⊗ G_u`` as a
``dN x dN`` matrix: 17.9 GB at LastFM's 1,892 users. Here ``A`` is never formed. With ``V`` sparse (each user
related to its top-k neighbours) a product is

    A vec(Theta) = lambda Theta + V (G ⊙ (V^T Theta))        (G ⊙ Y: row u is G_u y_u)

— ``O(nnz(V) d + N d^2)`` time and ``O(N d^2)`` memory for the per-user Grams — and ``A theta = b_tilde`` is
solved by conjugate gradients, preconditioned by ``A``'s diagonal ``d x d`` blocks
(``lambda I + sum_u V[j,u]^2 G_u``) and warm-started from the previous release's solution. The user models
are ``theta_u = sum_j V[j,u] theta_j``; confidence widths use the block-Jacobi approximation
``M_u ≈ sum_j V[j,u]^2 P_j^{-1}`` (exact when ``V`` is diagonal; an approximation otherwise, computed only for
the users asked for).

>>> import numpy as np, scipy.sparse as sp
>>> rng = np.random.default_rng(0)
>>> n, d = 6, 3
>>> V = sp.csr_matrix(np.eye(n) * 0.6 + np.roll(np.eye(n), 1, axis=1) * 0.4)
>>> G = np.stack([np.eye(d) * (u + 1) for u in range(n)])
>>> b = rng.normal(size=(n, d))
>>> sol = sparse_solve(V, G, b, lambda_=1.0, tol=1e-12)
>>> from models.streaming.solve import dense_kronecker
>>> bool(np.allclose(sol.theta_hat, np.linalg.solve(dense_kronecker(V.toarray(), G, 1.0), b.reshape(-1)).reshape(n, d)))
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

__all__ = ["SparseSolution", "sparse_solve", "kronecker_matvec", "block_jacobi", "approximate_widths", "colin_relation",
           "laplacian_regulariser", "SparseCoLinUCB"]

FloatArray = NDArray[np.float64]
#: A scipy sparse matrix (CSR or anything ``csr_matrix`` accepts); ``Any``: scipy-stubs' overloads are too narrow.
Sparse = Any


@dataclass(frozen=True)
class SparseSolution:
    theta_hat: FloatArray   # (N, d): A^{-1} b_tilde, blocks
    theta: FloatArray       # (N, d): the users' models sum_j V[j,u] theta_hat_j
    iterations: int
    residual: float         # ||A x - b|| / ||b||


def kronecker_matvec(V: Sparse, G: FloatArray, X: FloatArray, lambda_: float, Q: Sparse | None = None) -> FloatArray:
    """``A vec(X)`` for ``A = lambda (Q ⊗ I) + sum_u (V[:,u] V[:,u]^T) ⊗ G_u`` (``X``: ``(N, d)``; ``Q``: ``I`` if
    ``None``)."""
    Y = np.asarray(V.T @ X)                      # y_u = sum_j V[j,u] x_j
    Z = np.einsum("uab,ub->ua", G, Y)            # z_u = G_u y_u
    reg = X if Q is None else np.asarray(Q @ X)
    out: FloatArray = lambda_ * reg + np.asarray(V @ Z)  # out_j = lambda (Q X)_j + sum_u V[j,u] z_u
    return out


def block_jacobi(V: Sparse, G: FloatArray, lambda_: float, Q: Sparse | None = None) -> FloatArray:
    """The inverses of ``A``'s diagonal blocks ``P_j = lambda Q_jj I + sum_u V[j,u]^2 G_u``: ``(N, d, d)``."""
    n, d = G.shape[0], G.shape[1]
    V2 = sp.csr_matrix(V).multiply(V).tocsr()    # V[j,u]^2
    P = np.asarray(V2 @ G.reshape(n, d * d)).reshape(n, d, d)
    q = np.ones(n) if Q is None else np.asarray(sp.csr_matrix(Q).diagonal(), dtype=np.float64)
    P[:, np.arange(d), np.arange(d)] += lambda_ * q[:, None]
    inv: FloatArray = np.linalg.inv(P)
    return inv


def sparse_solve(V: Sparse, G: FloatArray, b_tilde: FloatArray, *, lambda_: float,
                 x0: FloatArray | None = None, tol: float = 1e-8, max_iter: int = 500,
                 precond: FloatArray | None = None, Q: Sparse | None = None) -> SparseSolution:
    """Preconditioned conjugate gradients for ``A theta_hat = b_tilde`` (``b_tilde``: ``(N, d)`` blocks).

    ``Q`` (sparse, symmetric positive definite; ``None``: ``I``) replaces the ridge's identity: GOB.Lin over
    every user is ``V = I``, ``Q = I + L`` (the graph Laplacian's regulariser, :func:`laplacian_regulariser`).
    """
    if not lambda_ > 0:
        raise ValueError(f"`lambda_` must be positive, got {lambda_}.")
    V = sp.csr_matrix(V)
    n, d = G.shape[0], G.shape[1]
    if V.shape != (n, n) or b_tilde.shape != (n, d) or (Q is not None and Q.shape != (n, n)):
        raise ValueError(f"shapes: V {V.shape}, G {G.shape}, b_tilde {b_tilde.shape}"
                         f"{'' if Q is None else f', Q {Q.shape}'} do not fit N = {n}, d = {d}.")
    Q = None if Q is None else sp.csr_matrix(Q)
    Pinv = block_jacobi(V, G, lambda_, Q) if precond is None else precond

    def apply_p(R: FloatArray) -> FloatArray:
        out: FloatArray = np.einsum("jab,jb->ja", Pinv, R)
        return out

    x = np.zeros((n, d)) if x0 is None else np.array(x0, dtype=np.float64)
    r = b_tilde - kronecker_matvec(V, G, x, lambda_, Q)
    bnorm = float(np.linalg.norm(b_tilde)) or 1.0
    z = apply_p(r)
    p = z.copy()
    rz = float((r * z).sum())
    it = 0
    while it < max_iter and float(np.linalg.norm(r)) / bnorm > tol:
        Ap = kronecker_matvec(V, G, p, lambda_, Q)
        alpha = rz / float((p * Ap).sum())
        x += alpha * p
        r -= alpha * Ap
        z = apply_p(r)
        rz_new = float((r * z).sum())
        p = z + (rz_new / rz) * p
        rz = rz_new
        it += 1
    theta = np.asarray(V.T @ x)
    return SparseSolution(x, theta, it, float(np.linalg.norm(r)) / bnorm)


def approximate_widths(V: Sparse, Pinv: FloatArray, users: NDArray[np.int64]) -> FloatArray:
    """Block-Jacobi ``M_u ≈ sum_j V[j,u]^2 P_j^{-1}`` for the given users only: ``(len(users), d, d)``."""
    n, d = Pinv.shape[0], Pinv.shape[1]
    cols = sp.csc_matrix(V)[:, np.asarray(users, dtype=np.int64)]
    W2 = cols.multiply(cols).T.tocsr()           # (len(users), N): V[j,u]^2
    out: FloatArray = np.asarray(W2 @ Pinv.reshape(n, d * d)).reshape(len(users), d, d)
    return out


def colin_relation(adjacency: Sparse) -> Sparse:
    """CoLin's relation over users from a symmetric 0/1 adjacency: ``A + I`` with columns summing to 1 (CSR).

    Column ``u`` spreads user ``u``'s statistic evenly over ``u`` and their neighbours (``colin_w`` per user).
    """
    A = sp.csr_matrix(adjacency, dtype=np.float64)
    C = (A + sp.identity(A.shape[0], format="csr")).tocsc()
    out = (C @ sp.diags(1.0 / np.asarray(C.sum(axis=0)).ravel())).tocsr()
    return out


def laplacian_regulariser(adjacency: Sparse) -> Sparse:
    """``I + L`` (``L = D - A`` the graph Laplacian): GOB.Lin's regulariser over users, sparse (CSR).

    GOB.Lin's projected form (``V = (I + L)^{-1/2}``, dense) gives the users' models
    ``(V ⊗ I) A^{-1} (V ⊗ I) b = (lambda (I + L) ⊗ I + blockdiag(G_u))^{-1} b``: the same models from a sparse
    system with ``V = I`` and ``Q = I + L`` (checked against the dense projection in the tests).
    """
    A = sp.csr_matrix(adjacency, dtype=np.float64)
    A = A - sp.diags(A.diagonal())
    deg = np.asarray(A.sum(axis=1)).ravel()
    out = (sp.diags(1.0 + deg) - A).tocsr()
    return out


class SparseCoLinUCB:
    """CoLin over every user with a sparse relation matrix ``V`` (the offline twin of a full-graph release).

    Each user is a unit. Statistics per user (``G_u``, ``b_u``); every ``tick`` interactions a release:
    ``b`` through ``mechanism`` (user-space noise on each user's own ``b_u``, sensitivity 1, as the
    pipeline's ``user-blt-exact``; ``epsilon = inf``: none), ``b_tilde = V b``, and the warm-started CG
    solve with the ridge ``lambda + kappa * std`` (``std`` the released noise's largest per-coordinate std
    times ``V``'s largest row norm). Selection by UCB with the user's model ``theta_u`` and the block-Jacobi
    width (:func:`approximate_widths`).
    """

    select_by_user = True
    per_user = True

    def __init__(self, *, V: Sparse, d: int, rows: dict[str, int], epsilon: float, delta: float = 1e-5,
                 tick: int = 100, lambda_: float = 1.0, alpha: float = 0.3, noise_ridge: float = 100.0,
                 horizon: int = 16383, seed: int = 0, mechanism: str = "blt-exact") -> None:
        import math

        from models.mechanisms import make_mechanism

        self.V = sp.csr_matrix(V)
        self.n, self.d, self.rows = self.V.shape[0], d, rows
        self.G = np.zeros((self.n, d, d))
        self.b = np.zeros((self.n, d))
        self.tick, self.lambda_, self.alpha, self.kappa = tick, lambda_, alpha, noise_ridge
        self.mech = None if math.isinf(epsilon) else make_mechanism(
            mechanism, dim=self.n * d, sensitivity=1.0, epsilon=epsilon, delta=delta, horizon=horizon, seed=seed)
        self.state = None if self.mech is None else self.mech.init_state()
        self.row_norm = float(np.sqrt(np.asarray(self.V.multiply(self.V).sum(axis=1)).max()))
        self.theta_hat = np.zeros((self.n, d))
        self.theta = np.zeros((self.n, d))
        self.Pinv = np.broadcast_to(np.eye(d) / lambda_, (self.n, d, d)).copy()
        self.count = 0
        self.iterations: list[int] = []
        self._rng = np.random.default_rng(seed)

    def select(self, unit: int, X: FloatArray, user: str | None = None) -> int:
        u = self.rows[str(user)] if user is not None else int(unit)
        M = approximate_widths(self.V, self.Pinv, np.array([u]))[0]
        score = X @ self.theta[u] + self.alpha * np.sqrt(np.maximum(((X @ M) * X).sum(axis=1), 0.0))
        best = np.flatnonzero(score >= score.max() - 1e-12)
        return int(best[0] if len(best) == 1 else self._rng.choice(best))

    def update(self, unit: int, x: FloatArray, reward: float, user: str | None = None) -> None:
        u = self.rows[str(user)] if user is not None else int(unit)
        x = np.asarray(x, dtype=np.float64)
        self.G[u] += np.outer(x, x)
        self.b[u] += reward * x
        self.count += 1
        if self.count % self.tick == 0:
            self._release()

    def _release(self) -> None:
        from models.mechanisms import noise_std

        std = 0.0
        b = self.b
        if self.mech is not None and self.state is not None:
            released, self.state, _ = self.mech.step_to(self.state, self.b.reshape(-1))
            b = released.reshape(self.n, self.d)
            std = noise_std(self.mech, self.state) * self.row_norm
        lam = self.lambda_ + self.kappa * std
        self.Pinv = block_jacobi(self.V, self.G, lam)
        sol = sparse_solve(self.V, self.G, np.asarray(self.V @ b), lambda_=lam, x0=self.theta_hat, precond=self.Pinv)
        self.theta_hat, self.theta = sol.theta_hat, sol.theta
        self.iterations.append(sol.iterations)
