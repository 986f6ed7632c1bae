"""Collaboration structures: the user-mixing matrix ``V`` of every algorithm.

Every algorithm of the collaborative paper is ridge regression on
``x_tilde = kron(V[:, u], x)`` for an ``N x N`` matrix ``V``
(spec collaborative-dp-bandits §5 "Unified instance"):

========================  =====================  ==============================
algorithm                 ``V``                  sensitivity ``Delta_u``
========================  =====================  ==============================
LinUCB (one per user)     ``I_N``                ``Lx``
CoLin                     ``W`` (column-stoch.)  ``Lx * ||W[:, u]||_2``
GOB.Lin                   ``G^{-1/2}``           ``Lx * sqrt((G^{-1})_uu)``
========================  =====================  ==============================

with ``G = I_N + Laplacian(adjacency)``. Note the **column** ``W[:, u]``
(ERRATA §2): the paper's row version under-noises for non-symmetric ``W``.

Examples
--------
>>> import numpy as np
>>> W = uniform_w(10)
>>> round(float(sensitivities(W).max()), 4)
0.3162
>>> V = goblin_projection(complete_adjacency(10))
>>> round(float(sensitivities(V).max()), 4)
0.4264
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

__all__ = [
    "is_sparse",
    "column_norms",
    "validate_w",
    "column_normalize",
    "similarity_w",
    "uniform_w",
    "complete_adjacency",
    "adjacency_from_w",
    "goblin_projection",
    "sensitivities",
]

FloatArray = NDArray[np.float64]


def validate_w(W: FloatArray, name: str = "W") -> FloatArray:
    """Check a relational matrix: square, finite, non-negative, no zero column."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"`{name}` must be a square N x N matrix, got shape {W.shape}.")
    if not np.isfinite(W).all():
        raise ValueError(f"`{name}` must be finite; it has NaN or inf entries.")
    if (W < 0).any():
        raise ValueError(f"`{name}` must be non-negative, got min entry {W.min()}.")
    zero = np.flatnonzero(W.sum(axis=0) == 0)
    if zero.size:
        raise ValueError(f"`{name}` has zero column(s) {zero.tolist()}: every user needs a non-zero column.")
    return W


def column_normalize(W: FloatArray) -> FloatArray:
    """Scale each column to sum to 1 (the paper's stochastic ``W``)."""
    W = validate_w(W)
    out: FloatArray = W / W.sum(axis=0, keepdims=True)
    return out


def similarity_w(theta: FloatArray, quantile: float = 0.5) -> FloatArray:
    """The synthetic ``W`` of the paper: ``w_ij ∝ <theta_i, theta_j>``, thresholded.

    Off-diagonal similarities below the ``quantile`` of the off-diagonal
    similarities are zeroed (the paper's unstated threshold; spec G11:
    median), the diagonal is always kept, and columns are normalised.
    ``quantile=0`` keeps every edge (fully connected).
    """
    theta = np.asarray(theta, dtype=np.float64)
    if not 0.0 <= quantile < 1.0:
        raise ValueError(f"`quantile` must be in [0, 1), got {quantile}.")
    S = theta @ theta.T
    n = S.shape[0]
    off = ~np.eye(n, dtype=bool)
    if quantile > 0 and n > 1:
        cut = np.quantile(S[off], quantile)
        S = np.where(off & (S < cut), 0.0, S)
    S = np.clip(S, 0.0, None)
    return column_normalize(S)


def uniform_w(n_users: int) -> FloatArray:
    """``w_ij = 1/N``."""
    return np.full((n_users, n_users), 1.0 / n_users)


def complete_adjacency(n_users: int) -> FloatArray:
    """Binary adjacency of the complete graph."""
    return np.ones((n_users, n_users)) - np.eye(n_users)


def adjacency_from_w(W: FloatArray) -> FloatArray:
    """Binary adjacency ``Adj_ij = 1`` iff ``i != j`` and ``W_ij > 0`` or ``W_ji > 0`` (spec G12)."""
    W = validate_w(W)
    A = ((W > 0) | (W.T > 0)).astype(np.float64)
    np.fill_diagonal(A, 0.0)
    return A


def goblin_projection(adjacency: FloatArray, scale: float = 1.0) -> FloatArray:
    """``G^{-1/2}`` for ``G = I_N + scale * Laplacian(adjacency)`` (symmetric).

    Parameters
    ----------
    adjacency
        Symmetric non-negative ``N x N`` matrix (zero diagonal).
    scale
        ``g`` in ``G = I + g L`` (spec G12; the paper uses 1).
    """
    A = np.asarray(adjacency, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"`adjacency` must be a square matrix, got shape {A.shape}.")
    if not np.allclose(A, A.T):
        raise ValueError("`adjacency` must be symmetric.")
    if (A < 0).any():
        raise ValueError("`adjacency` must be non-negative.")
    if scale < 0:
        raise ValueError(f"`scale` must be non-negative, got {scale}.")
    A = A.copy()
    np.fill_diagonal(A, 0.0)
    L = np.diag(A.sum(axis=1)) - A
    G = np.eye(A.shape[0]) + scale * L
    mu, Q = np.linalg.eigh(G)
    out: FloatArray = (Q * mu**-0.5) @ Q.T
    return 0.5 * (out + out.T)


def is_sparse(V: Any) -> bool:
    """Whether ``V`` is a scipy sparse matrix (a plain ``bool``: scipy-stubs' type guard would narrow ``V``)."""
    return bool(sp.issparse(V))


def column_norms(V: Any) -> FloatArray:
    """``||V[:, u]||_2`` for every column of a dense or scipy sparse matrix (a sparse one is never densified)."""
    if is_sparse(V):
        C: Any = sp.csc_matrix(V)
        out: FloatArray = np.sqrt(np.asarray(C.multiply(C).sum(axis=0), dtype=np.float64).ravel())
        return out
    norms: FloatArray = np.linalg.norm(np.asarray(V, dtype=np.float64), axis=0)
    return norms


def sensitivities(V: Any, context_bound: float = 1.0) -> FloatArray:
    """Per-user L2 sensitivity ``Lx * ||V[:, u]||_2`` of ``b`` to one reward in ``[0, 1]`` (``V`` dense or sparse)."""
    if context_bound <= 0:
        raise ValueError(f"`context_bound` must be positive, got {context_bound}.")
    out: FloatArray = context_bound * column_norms(V)
    return out
