"""User clusters from the friend graph, and the CoLin / GOB.Lin cluster graph.

The papers cut the friend graph into 100 clusters with Graclus (Dhillon, Guan,
Kulis 2007), which minimises the normalised cut. Graclus is not on PyPI; we
use scikit-learn's spectral clustering (the normalised-cut relaxation,
``SpectralClustering(affinity="precomputed")``, k-means label assignment),
which is also what BanditLib's ``initializeW_clustering`` used. Spectral
clustering is run per connected component, because a cut between components
is free and the spectral embedding of a disconnected graph is degenerate:

- with at most ``n_clusters`` components, every component gets one cluster
  and the rest are shared out in proportion to component size (largest
  remainder, never more clusters than members); a component given ``k > 1``
  clusters is cut by spectral clustering;
- with more components than clusters, the ``n_clusters - 1`` largest
  components are one cluster each and all others share the last cluster.

Users without any friend are singleton components. Cluster labels are then
renumbered by decreasing size (ties: smallest user index first).

The CoLin matrix (spec G17): ``c(i, j)`` = number of friendships between
clusters ``i`` and ``j``, ``c(i, i)`` = friendships inside ``i`` plus 1, each
column divided by its sum. The GOB.Lin adjacency is the binary support of ``W``
off the diagonal.

Examples
--------
>>> labels = np.array([0, 0, 1, 1, 2])
>>> edges = np.array([[0, 1], [1, 2], [2, 3]])
>>> colin_w(labels, edges, n_clusters=3)
array([[0.66666667, 0.33333333, 0.        ],
       [0.33333333, 0.66666667, 0.        ],
       [0.        , 0.        , 1.        ]])
>>> gob_adjacency(colin_w(labels, edges, n_clusters=3))
array([[0., 1., 0.],
       [1., 0., 0.],
       [0., 0., 0.]])
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.sparse.csgraph import connected_components
from sklearn.cluster import SpectralClustering

__all__ = ["friend_edges", "friend_adjacency", "cluster_users", "cluster_counts", "colin_w", "gob_adjacency"]

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


def friend_edges(friends: IntArray, users: IntArray) -> IntArray:
    """Undirected friendships as sorted index pairs ``(i < j)``, each once.

    Parameters
    ----------
    friends
        ``(n, 2)`` directed ``(userID, friendID)`` rows; the relation is
        symmetrised and self-loops are dropped.
    users
        Sorted user ids; rows naming other users are ignored.

    Returns
    -------
    ndarray of int64, shape (n_edges, 2)
        Indices into ``users``.
    """
    known = np.isin(friends[:, 0], users) & np.isin(friends[:, 1], users)
    a = np.searchsorted(users, friends[known, 0])
    b = np.searchsorted(users, friends[known, 1])
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keep = lo != hi
    pairs = np.unique(np.stack([lo[keep], hi[keep]], axis=1), axis=0)
    return pairs.astype(np.int64).reshape(-1, 2)


def friend_adjacency(friends: IntArray, users: IntArray) -> sp.csr_matrix:
    """The friend graph over ``users`` (sorted ids) as a symmetric 0/1 sparse matrix, zero diagonal.

    >>> A = friend_adjacency(np.array([[1, 2], [2, 1], [3, 1], [9, 1]]), np.array([1, 2, 3]))
    >>> A.toarray().astype(int).tolist()
    [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    """
    edges = friend_edges(friends, users)
    n = len(users)
    A = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return sp.csr_matrix(A + A.T)


def _allocate(sizes: IntArray, n_clusters: int) -> IntArray:
    """Clusters per component: >= 1 each, the rest by largest remainder, <= size."""
    alloc = np.ones(len(sizes), dtype=np.int64)
    quota = sizes / sizes.sum() * n_clusters
    for _ in range(n_clusters - len(sizes)):
        gain = np.where(alloc < sizes, quota - alloc, -np.inf)
        alloc[int(np.argmax(gain))] += 1
    return alloc


def _spectral(adj: sp.csr_matrix, k: int, seed: int) -> IntArray:
    n = adj.shape[0]
    if k >= n:
        return np.arange(n, dtype=np.int64)
    with warnings.catch_warnings():
        # k-means may warn about duplicate points; empty clusters are fixed below.
        warnings.simplefilter("ignore")
        labels = SpectralClustering(
            n_clusters=k, affinity="precomputed", assign_labels="kmeans", random_state=seed
        ).fit_predict(adj)
    labels = np.unique(labels, return_inverse=True)[1].astype(np.int64)
    # Guarantee exactly k non-empty clusters: split the largest one if k-means merged some.
    while labels.max() + 1 < k:
        big = int(np.argmax(np.bincount(labels)))
        members = np.flatnonzero(labels == big)
        labels[members[len(members) // 2 :]] = labels.max() + 1
    return labels


def cluster_users(n_users: int, edges: IntArray, n_clusters: int, seed: int) -> IntArray:
    """Cut the friend graph into exactly ``n_clusters`` non-empty clusters.

    Parameters
    ----------
    n_users
        Number of users (graph nodes ``0..n_users-1``).
    edges
        ``(n_edges, 2)`` undirected friendships (see :func:`friend_edges`).
    n_clusters
        Number of clusters (the papers use 100).
    seed
        ``random_state`` of the spectral embedding and of k-means.

    Returns
    -------
    ndarray of int64, shape (n_users,)
        Cluster of each user, ``0..n_clusters-1``, numbered by decreasing size.

    Raises
    ------
    ValueError
        If ``n_clusters`` is not in ``[1, n_users]``.

    Examples
    --------
    >>> edges = np.array([[0, 1], [1, 2], [0, 2], [3, 4]])
    >>> cluster_users(6, edges, n_clusters=3, seed=0)
    array([0, 0, 0, 1, 1, 2])
    """
    if not 1 <= n_clusters <= n_users:
        raise ValueError(f"`n_clusters` must be in [1, {n_users}] (the number of users), got {n_clusters}.")
    adj = sp.coo_matrix(
        (np.ones(2 * len(edges)), (np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]])),
        shape=(n_users, n_users),
    ).tocsr()
    n_comp, comp = connected_components(adj, directed=False)
    sizes = np.bincount(comp).astype(np.int64)
    labels = np.empty(n_users, dtype=np.int64)
    next_label = 0
    if n_comp > n_clusters:
        order = np.argsort(-sizes, kind="stable")
        for c in order[: n_clusters - 1]:
            labels[comp == c] = next_label
            next_label += 1
        labels[np.isin(comp, order[n_clusters - 1 :])] = next_label
    else:
        for c, k in enumerate(_allocate(sizes, n_clusters)):
            members = np.flatnonzero(comp == c)
            sub = _spectral(adj[members][:, members], int(k), seed) if k > 1 else np.zeros(len(members), np.int64)
            labels[members] = next_label + sub
            next_label += int(k)
    # Renumber: decreasing size, ties by smallest member index.
    cl_sizes = np.bincount(labels, minlength=n_clusters)
    first = np.full(n_clusters, n_users)
    np.minimum.at(first, labels, np.arange(n_users))
    rank = np.lexsort((first, -cl_sizes))
    new = np.empty(n_clusters, dtype=np.int64)
    new[rank] = np.arange(n_clusters)
    return new[labels]


def cluster_counts(labels: IntArray, edges: IntArray, n_clusters: int) -> IntArray:
    """``c(i, j)``: friendships between clusters ``i`` and ``j`` (symmetric; ``c(i, i)`` inside ``i``)."""
    a, b = labels[edges[:, 0]], labels[edges[:, 1]]
    counts = np.zeros((n_clusters, n_clusters), dtype=np.int64)
    np.add.at(counts, (a, b), 1)
    off = a != b
    np.add.at(counts, (b[off], a[off]), 1)
    return counts


def colin_w(labels: IntArray, edges: IntArray, n_clusters: int) -> FloatArray:
    """CoLin's column-stochastic ``W`` from inter-cluster friendship counts (spec G17).

    ``c(i, j)`` counts friendships between clusters, ``c(i, i)`` counts those
    inside cluster ``i`` plus one; each column is then divided by its sum, so
    every column sums to 1 and has a positive diagonal.
    """
    counts = cluster_counts(labels, edges, n_clusters).astype(np.float64)
    counts[np.diag_indices(n_clusters)] += 1.0
    out: FloatArray = counts / counts.sum(axis=0, keepdims=True)
    return out


def gob_adjacency(W: FloatArray) -> FloatArray:
    """GOB.Lin's binary cluster graph: ``1`` where ``W`` (or ``W.T``) is positive off the diagonal."""
    A = ((W > 0) | (W.T > 0)).astype(np.float64)
    np.fill_diagonal(A, 0.0)
    return A
