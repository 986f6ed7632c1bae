"""The UCB scoring kernel scores each row independently: a row's result does not depend on the other rows.

Serving keeps every catalog item's scores per unit and model version and answers by indexing them
(:mod:`pipeline.serve.serving`, docs/serving-cache.md); that equals scoring the request's own candidates only
because :func:`models.ground.linalg.ucb_scores` gives each row the same bits whichever rows it is computed with.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from models.ground.linalg import ucb_scores, ucb_scores_blas


def _world(seed: int, n: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None]
    A = rng.normal(size=(d, d))
    return X, rng.normal(size=d), np.linalg.inv(np.eye(d) + A @ A.T)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 1200), d=st.sampled_from([1, 2, 5, 8, 17, 25, 32]),
       data=st.data())
def test_rows_score_the_same_alone_as_in_the_whole_catalog(seed: int, n: int, d: int, data: st.DataObject) -> None:
    X, theta, M = _world(seed, n, d)
    alpha = data.draw(st.floats(0.0, 5.0), label="alpha")
    mean, bonus = ucb_scores(theta, M, X, alpha)
    # a pool: any rows, any order, any number (as a request names candidates), copied out as serving does
    rows = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 60), unique=True), label="rows")
    pm, pb = ucb_scores(theta, M, X.take(rows, axis=0), alpha)
    assert pm.tobytes() == mean[rows].tobytes()
    assert pb.tobytes() == bonus[rows].tobytes()
    # a row alone, and the catalog in two uneven blocks (as items added later are scored)
    r = rows[0]
    one_m, one_b = ucb_scores(theta, M, X[r:r + 1], alpha)
    assert (one_m[0], one_b[0]) == (mean[r], bonus[r])
    cut = data.draw(st.integers(0, n), label="cut")
    parts = [ucb_scores(theta, M, part, alpha) for part in (X[:cut], X[cut:])]
    assert np.concatenate([p[0] for p in parts]).tobytes() == mean.tobytes()
    assert np.concatenate([p[1] for p in parts]).tobytes() == bonus.tobytes()


def test_the_kernel_is_ucb_and_differs_from_the_one_product_kernel_only_in_rounding() -> None:
    # what the row-independent kernel computes is x theta and alpha sqrt(x M x), up to float rounding
    X, theta, M = _world(7, 500, 25)
    mean, bonus = ucb_scores(theta, M, X, 0.3)
    np.testing.assert_allclose(mean, X @ theta, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(bonus, 0.3 * np.sqrt(np.einsum("ij,jk,ik->i", X, M, X)), rtol=1e-12, atol=1e-14)
    # the policies' one-product kernel computes the same, up to rounding
    bm, bb = ucb_scores_blas(theta, M, X, 0.3)
    np.testing.assert_allclose(bm, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(bb, bonus, rtol=1e-12, atol=1e-14)
    # a non-contiguous view is scored as its contiguous copy (the catalog's rows are taken into a copy)
    view = np.asfortranarray(X)[::3]
    vm, vb = ucb_scores(theta, M, view, 0.3)
    assert vm.tobytes() == mean[::3].tobytes() and vb.tobytes() == bonus[::3].tobytes()
