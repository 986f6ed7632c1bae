"""The matrix-free Kronecker solve equals the dense one; the block-Jacobi widths are exact for a diagonal V."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from models.streaming import ReleasedStats, solve
from models.streaming.sparse import approximate_widths, block_jacobi, kronecker_matvec, sparse_solve
from models.streaming.solve import dense_kronecker


def _world(n: int, d: int, seed: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random((n, n)) < 0.2, rng.random((n, n)), 0.0) + np.eye(n)
    V = sp.csr_matrix(dense / np.linalg.norm(dense, axis=0))
    X = rng.normal(size=(n, 4, d)) / np.sqrt(d)
    return V, np.einsum("uta,utb->uab", X, X), rng.normal(size=(n, d))


def test_matvec_and_solve_equal_the_dense_kronecker_system() -> None:
    V, G, bt = _world(12, 4, seed=1)
    A = dense_kronecker(V.toarray(), G, 0.7)
    X = np.random.default_rng(2).normal(size=(12, 4))
    np.testing.assert_allclose(kronecker_matvec(V, G, X, 0.7).reshape(-1), A @ X.reshape(-1), atol=1e-12)
    sol = sparse_solve(V, G, bt, lambda_=0.7, tol=1e-12)
    np.testing.assert_allclose(sol.theta_hat.reshape(-1), np.linalg.solve(A, bt.reshape(-1)), atol=1e-9)
    # the users' models are the pipeline's dense solve's (V is the released statistics' mixing matrix)
    rel = ReleasedStats("kron", V.toarray(), G, bt.reshape(-1), np.ones(12, dtype=np.int64))
    theta, _ = solve(rel, lambda_=0.7)
    np.testing.assert_allclose(sol.theta, theta, atol=1e-9)
    warm = sparse_solve(V, G * 1.01, bt * 1.01, lambda_=0.7, tol=1e-12, x0=sol.theta_hat)
    assert warm.residual <= 1e-12 and warm.iterations <= sol.iterations


def test_block_jacobi_widths_are_exact_when_v_is_diagonal() -> None:
    _, G, bt = _world(5, 3, seed=3)
    V = sp.identity(5, format="csr")
    P = block_jacobi(V, G, 1.0)
    M = approximate_widths(V, P, np.arange(5))
    _, exact = solve(ReleasedStats("kron", np.eye(5), G, bt.reshape(-1), np.ones(5, dtype=np.int64)), lambda_=1.0)
    np.testing.assert_allclose(M, exact, atol=1e-12)


def test_the_full_graph_policy_learns_a_shared_signal() -> None:
    """SparseCoLinUCB on a ring of users sharing one theta: non-private, it earns more than random choice."""
    from models.streaming.sparse import SparseCoLinUCB

    n, d = 20, 4
    ring = np.eye(n) + np.roll(np.eye(n), 1, axis=0)
    V = sp.csr_matrix(ring / ring.sum(axis=0))
    pol = SparseCoLinUCB(V=V, d=d, rows={str(u): u for u in range(n)}, epsilon=float("inf"), tick=20, seed=0)
    rng = np.random.default_rng(1)
    theta = np.array([1.0, -1.0, 0.5, 0.0])
    got, rand = 0.0, 0.0
    for t in range(2000):
        X = rng.normal(size=(5, d)) / 2
        u = str(t % n)
        k = pol.select(0, X, user=u)
        mean = X @ theta
        got += mean[k]
        rand += mean.mean()
        pol.update(0, X[k], float(rng.random() < 1 / (1 + np.exp(-mean[k]))), user=u)
    assert got > rand + 200 and max(pol.iterations) < 100
