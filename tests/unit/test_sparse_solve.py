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


def _friends(n: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = np.triu((rng.random((n, n)) < 0.25).astype(np.float64), 1)
    return sp.csr_matrix(upper + upper.T)


def test_goblin_over_users_equals_the_dense_projection() -> None:
    """GOB.Lin's dense projected solve (V = (I + L)^(-1/2)) and the sparse Laplacian system give one model."""
    from models.ground.graphs import goblin_projection
    from models.streaming.solve import solve_sparse
    from models.streaming.sparse import laplacian_regulariser

    n, d = 10, 3
    _, G, b = _world(n, d, seed=4)
    A = _friends(n, seed=5)
    V = goblin_projection(A.toarray())
    count = np.arange(n, dtype=np.int64)
    dense = ReleasedStats("kron", V, G, (V @ b).reshape(-1), count, noise_std=0.01)
    sparse = ReleasedStats("laplacian", sp.identity(n, format="csr"), G, b.reshape(-1), count, noise_std=0.01,
                           Q=laplacian_regulariser(A))
    theta, M = solve(dense, lambda_=0.8, noise_ridge=3.0)
    out = solve_sparse(sparse, lambda_=0.8, noise_ridge=3.0, tol=1e-13)
    np.testing.assert_allclose(out.theta, theta, atol=1e-9)
    assert out.lambda_ == 0.8 + 3.0 * 0.01
    # the block-Jacobi width never exceeds the exact one: (A^-1)_uu - (A_uu)^-1 is positive semi-definite
    gap = M[out.users] - out.M
    assert (np.linalg.eigvalsh(gap) > -1e-12).all() and np.abs(gap).max() > 1e-6


def test_colin_over_users_releases_round_trip_sparse_and_solve_as_dense() -> None:
    from models.streaming.solve import solve_sparse
    from models.streaming.sparse import colin_relation

    n, d = 9, 3
    _, G, b = _world(n, d, seed=6)
    C = colin_relation(_friends(n, seed=7))
    np.testing.assert_allclose(np.asarray(C.sum(axis=0)).ravel(), 1.0)
    count = np.array([0, 2, 0, 1, 1, 1, 0, 3, 1], dtype=np.int64)
    rel = ReleasedStats("sparse-kron", C, G, np.asarray(C @ b).reshape(-1), count, version=4, noise_std=0.2)
    back = ReleasedStats.from_mapping(rel.to_mapping())
    assert sp.issparse(back.V) and (back.V != C).nnz == 0 and back.version == 4 and back.Q is None
    theta, _ = solve(ReleasedStats("kron", C.toarray(), G, rel.b_tilde, count, noise_std=0.2), lambda_=1.0,
                     noise_ridge=2.0)
    out = solve_sparse(back, lambda_=1.0, noise_ridge=2.0, users=np.flatnonzero(count), tol=1e-13)
    np.testing.assert_allclose(out.theta, theta, atol=1e-9)
    assert out.M.shape == (6, d, d) and out.users.tolist() == [1, 3, 4, 5, 7, 8]
    np.testing.assert_allclose(out.prior, np.eye(d) / 1.4)


def test_user_space_noise_with_a_sparse_mixing_matrix_equals_the_dense_one() -> None:
    from models.mechanisms import make_mechanism, noise_std
    from models.streaming.sparse import colin_relation

    C = colin_relation(_friends(8, seed=8))
    kw = dict(dim=8 * 3, epsilon=2.0, delta=1e-5, horizon=15, seed=11, block_dim=3)
    dense = make_mechanism("user-blt-exact", sensitivity=float(np.linalg.norm(C.toarray(), axis=0).max()),
                           mixing=C.toarray(), **kw)  # type: ignore[arg-type]
    sparse = make_mechanism("user-blt-exact", sensitivity=float(np.linalg.norm(C.toarray(), axis=0).max()),
                            mixing=C, **kw)  # type: ignore[arg-type]
    s1, s2 = dense.init_state(), sparse.init_state()
    for t in range(3):
        prefix = np.full(24, float(t))
        r1, s1, _ = dense.step_to(s1, prefix)
        r2, s2, _ = sparse.step_to(s2, prefix)
        np.testing.assert_allclose(r2, r1, atol=1e-12)
        assert abs(noise_std(sparse, s2) - noise_std(dense, s1)) < 1e-12
    assert not np.allclose(r1, prefix)  # there is noise to compare
