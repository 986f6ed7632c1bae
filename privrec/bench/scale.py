"""``privrec bench scale``: CoLin's statistic over every user — solve time and memory as N grows.

For N = 100 (LastFM's clusters), 1,892 (every LastFM user) and 100,000 synthetic users: a sparse relation
matrix (each user related to itself and its top-k neighbours, columns normalised), per-user Grams from a few
interactions each, and one release: the block-Jacobi preconditioner, then conjugate gradients on
``A theta = b_tilde`` (:mod:`models.streaming.sparse`), cold and warm-started from the previous release after
1 % more interactions, reusing the previous preconditioner (recomputed now and then: any SPD preconditioner
keeps CG exact). At N = 100 the dense solve (:func:`models.streaming.solve`) runs beside it and the two
solutions are compared. Peak memory is the process's maximum resident set size. Writes ``scale.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["bench_scale", "register"]


def _world(n: int, d: int, k: int, seed: int) -> tuple[Any, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), k + 1)
    cols = np.concatenate([np.concatenate(([u], rng.choice(n, size=k, replace=False))) for u in range(n)])
    vals = np.concatenate([np.concatenate(([1.0], np.full(k, 0.5 / k))) for _ in range(n)])
    V = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    V = V @ sp.diags(1.0 / np.sqrt(np.asarray(V.multiply(V).sum(axis=0)).ravel()))  # unit-norm columns
    X = rng.normal(size=(n, 5, d)) / np.sqrt(d)  # five interactions per user
    G = np.einsum("uta,utb->uab", X, X)
    b = np.einsum("uta,ut->ua", X, rng.random((n, 5)))
    bt = np.asarray(V @ b)                                    # b_tilde blocks: sum_u V[j,u] b_u
    return V.tocsr(), G, bt


def bench_scale(sizes: tuple[int, ...] = (100, 1892, 100_000), d: int = 25, k: int = 10) -> dict[str, Any]:
    from models.streaming.sparse import block_jacobi, sparse_solve
    from privrec.experiments.runner import machine_info

    out: dict[str, Any] = {"machine": machine_info(), "d": d, "neighbours": k, "rows": {}}
    for n in sizes:
        V, G, bt = _world(n, d, min(k, n - 1), seed=n)
        t0 = time.perf_counter()
        P = block_jacobi(V, G, 1.0)
        t_pre = time.perf_counter() - t0
        t0 = time.perf_counter()
        cold = sparse_solve(V, G, bt, lambda_=1.0, tol=1e-8, precond=P)
        t_cold = time.perf_counter() - t0
        G2, bt2 = G * 1.01, bt * 1.01  # the next release: a little more of everything
        t0 = time.perf_counter()  # the previous release's preconditioner (any SPD one keeps CG exact)
        warm = sparse_solve(V, G2, bt2, lambda_=1.0, tol=1e-8, x0=cold.theta_hat, precond=P)
        t_warm = time.perf_counter() - t0
        row: dict[str, Any] = {"users": n, "precondition_s": t_pre, "cold_solve_s": t_cold,
                               "cold_iterations": cold.iterations, "release_warm_s": t_warm,
                               "warm_iterations": warm.iterations, "residual": warm.residual,
                               "grams_mb": G.nbytes / 2**20,
                               "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if n <= 200:
            from models.streaming.solve import dense_kronecker

            t0 = time.perf_counter()
            dense = np.linalg.solve(dense_kronecker(V.toarray(), G, 1.0), bt.reshape(-1)).reshape(n, d)
            row["dense_solve_s"] = time.perf_counter() - t0
            row["max_abs_diff_vs_dense"] = float(np.abs(dense - cold.theta_hat).max())
        out["rows"][str(n)] = row
    return out


def register(bsub: Any) -> None:
    p = bsub.add_parser("scale", help="CoLin over every user: sparse matrix-free solve time and memory as N grows",
                        description="One release of the Kronecker statistic at N = 100, 1,892 and 100,000 users "
                                    "with a sparse top-k relation matrix: block-Jacobi CG, cold and warm; the "
                                    "dense solve beside it at N = 100. Writes scale.json to --out.")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--sizes", default="100,1892,100000", help="comma-separated user counts")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        sizes = tuple(int(v) for v in args.sizes.split(","))
    except ValueError:
        raise ValueError(f"`--sizes` must be comma-separated integers, got {args.sizes!r}.") from None
    if any(n < 2 for n in sizes):
        raise ValueError("`--sizes` must be at least 2 users each.")
    doc = bench_scale(sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(doc, indent=2) + "\n")
    for n, r in doc["rows"].items():
        extra = (f"; dense {r['dense_solve_s']:.3f} s, max |diff| {r['max_abs_diff_vs_dense']:.1e}"
                 if "dense_solve_s" in r else "")
        print(f"N = {int(n):>7,}: warm release {r['release_warm_s']:.3f} s ({r['warm_iterations']} CG iterations), "
              f"cold {r['cold_solve_s']:.3f} s ({r['cold_iterations']}), Grams {r['grams_mb']:.0f} MB, "
              f"max RSS {r['max_rss_mb']:.0f} MB{extra}")
    print(f"machine yardstick: sum(range(1000)) takes {doc['machine']['python_speed_us']:.1f} µs")
    print(f"wrote {args.out}/scale.json", file=sys.stderr)
    return 0
