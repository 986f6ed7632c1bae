"""Site graphs and consensus mixing for the federated mode (P002's DP-Decentralized UCB, ERRATA §7).

``M`` sites on an undirected connected graph mix their views with

    P = I_M - (kappa / d_max) L,

``L`` the graph Laplacian and ``d_max`` the largest degree. ``P`` is symmetric and
doubly stochastic (rows and columns sum to 1), so repeated mixing preserves the
average of the views; for ``0 < kappa <= 1`` it is entrywise non-negative. The
views converge to the average at the rate of the **second largest eigenvalue
modulus** ``lambda_star = max_{p >= 2} |lambda_p(P)|``: after ``tau`` mixing
steps the distance of any start from consensus has shrunk by at most
``lambda_star ** tau``. ``kappa = 0.5`` keeps the spectrum in ``[0, 1]`` on every
graph; ``kappa = 1`` gives eigenvalue ``-1`` exactly on connected *bipartite
regular* graphs (even rings, ``K_{n,n}``), where consensus never happens
(ERRATA §7 corrects the spec's "any bipartite graph").

Running consensus (spec D-4): each sync, every site adds its *new* private
increment to its view and mixes,

    y <- P (y + delta),

so the network average of the views is always ``(1/M) * sum of what was
injected``; ``M * y_i`` is site ``i``'s estimate of the network total.

Examples
--------
>>> import numpy as np
>>> A = topology_adjacency("ring", 4)
>>> P = mixing_matrix(A, kappa=0.5)
>>> P.round(3).tolist()
[[0.5, 0.25, 0.0, 0.25], [0.25, 0.5, 0.25, 0.0], [0.0, 0.25, 0.5, 0.25], [0.25, 0.0, 0.25, 0.5]]
>>> round(second_eigenvalue_modulus(P), 6)
0.5
>>> mixing_matrix(topology_adjacency("ring", 4), kappa=1.0)  # bipartite and regular: refused
Traceback (most recent call last):
ValueError: consensus would not converge with kappa = 1.0 on this graph ...
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "TOPOLOGIES",
    "topology_adjacency",
    "edges_adjacency",
    "parse_edge_list",
    "mixing_matrix",
    "second_eigenvalue_modulus",
    "consensus_steps",
    "graph_constants",
]

FloatArray = NDArray[np.float64]

#: Named topologies of :func:`topology_adjacency` (a file of edges is the fourth option, see :func:`parse_edge_list`).
TOPOLOGIES = ("star", "ring", "complete")


def _check_sites(m: int) -> int:
    if int(m) != m or int(m) < 1:
        raise ValueError(f"`sites` must be a positive integer, got {m!r}.")
    return int(m)


def topology_adjacency(topology: str, sites: int) -> FloatArray:
    """0/1 adjacency of a named topology over ``sites`` sites (site 0 is the star's hub).

    >>> topology_adjacency("star", 3).tolist()
    [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """
    m = _check_sites(sites)
    A = np.zeros((m, m))
    if topology == "complete":
        A[:] = 1.0
        np.fill_diagonal(A, 0.0)
    elif topology == "ring":
        if m == 2:
            A[0, 1] = A[1, 0] = 1.0
        elif m > 2:
            for i in range(m):
                A[i, (i + 1) % m] = A[(i + 1) % m, i] = 1.0
    elif topology == "star":
        A[0, 1:] = A[1:, 0] = 1.0
    else:
        raise ValueError(f"`topology` must be one of {list(TOPOLOGIES)} or an edge-list file, got {topology!r}.")
    return A


def edges_adjacency(edges: Iterable[tuple[int, int]], sites: int) -> FloatArray:
    """0/1 adjacency from undirected edges ``(i, j)`` between sites ``0..sites-1``; connected, no self-loops.

    >>> edges_adjacency([(0, 1), (1, 2)], 3).sum(axis=1).tolist()
    [1.0, 2.0, 1.0]
    """
    m = _check_sites(sites)
    A = np.zeros((m, m))
    for i, j in edges:
        if not (0 <= i < m and 0 <= j < m):
            raise ValueError(f"edge ({i}, {j}) names a site outside 0..{m - 1}.")
        if i == j:
            raise ValueError(f"edge ({i}, {j}) is a self-loop.")
        A[i, j] = A[j, i] = 1.0
    _check_connected(A)
    return A


def parse_edge_list(text: str) -> list[tuple[int, int]]:
    """Edges from text: one ``i j`` (or ``i,j``) pair per line; ``#`` starts a comment.

    >>> parse_edge_list("# a path\\n0 1\\n1,2\\n")
    [(0, 1), (1, 2)]
    """
    edges: list[tuple[int, int]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            raise ValueError(f"line {n}: expected two site numbers 'i j', got {raw.strip()!r}.")
        edges.append((int(parts[0]), int(parts[1])))
    if not edges:
        raise ValueError("the edge list has no edges.")
    return edges


def _check_connected(A: FloatArray) -> None:
    m = A.shape[0]
    seen, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(A[i]):
            if int(j) not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    if len(seen) != m:
        raise ValueError(f"the site graph is not connected: site(s) {sorted(set(range(m)) - seen)} cannot be "
                         f"reached from site 0.")


def mixing_matrix(adjacency: FloatArray, kappa: float = 0.5) -> FloatArray:
    """``P = I - (kappa / d_max) L`` for a connected undirected graph (ERRATA §7).

    Raises ``ValueError`` when ``kappa`` is outside ``(0, 1]``, the graph is not
    connected, or ``P`` would not converge (``lambda_star = 1``, e.g. ``kappa = 1``
    on an even ring) — the start-up check the spec asks for.
    """
    A = np.asarray(adjacency, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"`adjacency` must be square, got shape {A.shape}.")
    if not np.array_equal(A, A.T):
        raise ValueError("`adjacency` must be symmetric (links are bidirectional).")
    if not (0.0 < kappa <= 1.0):
        raise ValueError(f"`kappa` must be in (0, 1], got {kappa}.")
    m = A.shape[0]
    if m == 1:
        return np.ones((1, 1))
    _check_connected(A)
    degrees = A.sum(axis=1)
    L = np.diag(degrees) - A
    P: FloatArray = np.eye(m) - (kappa / float(degrees.max())) * L
    if second_eigenvalue_modulus(P) >= 1.0 - 1e-12:
        raise ValueError(f"consensus would not converge with kappa = {kappa} on this graph (P has an eigenvalue "
                         f"of modulus 1 besides the consensus direction; the graph is bipartite and regular): "
                         f"use kappa < 1, e.g. 0.5.")
    return P


def second_eigenvalue_modulus(P: FloatArray) -> float:
    """``lambda_star = max_{p >= 2} |lambda_p(P)|`` of a symmetric mixing matrix (the contraction per step)."""
    M = np.asarray(P, dtype=np.float64)
    if M.shape[0] == 1:
        return 0.0
    ev = np.linalg.eigvalsh(M)  # ascending; the largest is the consensus eigenvalue 1
    return float(min(1.0, max(abs(ev[0]), abs(ev[-2]))))


def consensus_steps(P: FloatArray, tolerance: float) -> int | float:
    """Mixing steps after which any start is within ``tolerance`` (relative) of consensus: ``log tol / log lambda_star``.

    >>> consensus_steps(mixing_matrix(topology_adjacency("complete", 4), kappa=0.75), 1e-6)
    1
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"`tolerance` must be in (0, 1), got {tolerance}.")
    lam = second_eigenvalue_modulus(P)
    if lam <= 1e-15:
        return 1
    if lam >= 1:
        return math.inf
    return max(1, math.ceil(math.log(tolerance) / math.log(lam)))


def graph_constants(P: FloatArray) -> tuple[float, FloatArray]:
    """P002's graph constants ``(c_0, c_i)`` (spec D-5, checked in ERRATA §7): consensus error and variance inflation.

    ``c_0 = sqrt(M) sum_{p>=2} |lambda_p| / (1 - |lambda_p|)``,
    ``c_i = M sum_{p>=2} lambda_p**2 / (1 - lambda_p**2) (u_p^i)**2``.

    >>> c0, ci = graph_constants(mixing_matrix(topology_adjacency("ring", 20), kappa=0.5))
    >>> round(c0, 1), round(float(ci[0]), 1)
    (509.8, 54.3)
    """
    M = np.asarray(P, dtype=np.float64)
    m = M.shape[0]
    ev, U = np.linalg.eigh(M)
    order = np.argsort(-ev)
    ev, U = ev[order][1:], U[:, order][:, 1:]
    if m == 1:
        return 0.0, np.zeros(1)
    if np.any(np.abs(ev) >= 1):
        return math.inf, np.full(m, math.inf)
    c0 = math.sqrt(m) * float(np.sum(np.abs(ev) / (1 - np.abs(ev))))
    ci: FloatArray = m * (U**2 @ (ev**2 / (1 - ev**2)))
    return c0, ci

