"""``privrec experiment fullgraph``: CoLin over every LastFM user against CoLin over 100 clusters.

The replay's protocol offline (the first LastFM events; reward 1 iff the pool's top item is the logged
artist), the same seeds for both: ``clusters`` — the pipeline's CoLin over the 100 friend-graph clusters
(the dense solve); ``users`` — CoLin over all users with the friend graph as a sparse relation matrix
(each user related to itself and their friends, columns normalised; :class:`SparseCoLinUCB`, the
matrix-free CG solve). Non-private and at the given epsilons (user-space ``blt-exact`` noise on each
unit's own ``b``). Writes ``fullgraph.json`` and ``fullgraph.md``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .modes import lastfm_reward
from .runner import derive_seed, machine_info, summarize

__all__ = ["run_fullgraph"]


def _user_graph(data_dir: str | None) -> tuple[sp.csr_matrix, dict[str, int]]:
    from models.streaming.sparse import colin_relation
    from producers.lastfm.catalog import load_catalog
    from producers.lastfm.clusters import friend_adjacency
    from producers.lastfm.raw import read_raw

    cat = load_catalog(data_dir, progress=False)
    users = np.array(sorted(int(u) for u in cat.users))
    C = colin_relation(friend_adjacency(read_raw(data_dir).friends, users))  # columns sum to 1 (colin_w, per user)
    return C, {str(u): i for i, u in enumerate(users)}


def run_fullgraph(out: Path, *, events: int = 5000, runs: int = 3, epsilons: tuple[float, ...] = (2.0,),
                  tick: int = 100, data_dir: str | None = None) -> dict[str, Any]:
    from models.policies import make_policy
    from models.streaming.sparse import SparseCoLinUCB
    from producers.lastfm import load_catalog

    t0 = time.perf_counter()
    cat = load_catalog(data_dir, progress=False)
    ev = cat.event_arrays()
    n = min(events, len(ev.users))
    units = np.array([cat.cluster_of(str(u)) for u in ev.users[:n]], dtype=np.int64)
    users = np.array([str(u) for u in ev.users[:n]])
    pools = np.array([[cat.artist_index[str(a)] for a in row] for row in ev.pools[:n]], dtype=np.int64)
    correct = np.array([int(np.flatnonzero(ev.pools[i] == ev.arms[i])[0]) for i in range(n)], dtype=np.int64)
    features = np.asarray(cat.feature_matrix)
    V, rows = _user_graph(data_dir)
    random_reward = n / pools.shape[1]
    doc: dict[str, Any] = {"events": n, "runs": runs, "tick": tick, "users": len(rows), "clusters": cat.n_clusters,
                           "relation": {"nonzeros": int(V.nnz)}, "rows": {}}
    for eps in (math.inf, *epsilons):
        key = "non-private" if math.isinf(eps) else f"epsilon={eps:g}"
        for name in ("clusters", "users"):
            ratios, secs = [], []
            for run in range(runs):
                seed = derive_seed("fullgraph", name, eps, run)
                t1 = time.perf_counter()
                if name == "clusters":
                    policy: Any = make_policy("CoLin" if math.isinf(eps) else "DP-CoLin", d=cat.d, W=cat.W,
                                              epsilon=eps, delta=1e-5, mechanism="user-blt-exact",
                                              horizon=16383 * tick, tick=tick, seed=seed, lambda_=1.0, alpha=0.3,
                                              noise_ridge=100.0)
                else:
                    policy = SparseCoLinUCB(V=V, d=cat.d, rows=rows, epsilon=eps, tick=tick, seed=seed)
                ratios.append(lastfm_reward(policy, units, pools, features, correct, users) / random_reward)
                secs.append(time.perf_counter() - t1)
            m, sd = summarize(ratios)
            doc["rows"].setdefault(name, {})[key] = {"ratio": m, "sd": sd, "runs": ratios,
                                                     "seconds_per_run": float(np.mean(secs))}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    doc["machine"] = machine_info()
    out.mkdir(parents=True, exist_ok=True)
    (out / "fullgraph.json").write_text(json.dumps(doc, indent=2) + "\n")
    keys = list(doc["rows"]["clusters"])
    lines = ["# CoLin over every LastFM user against 100 clusters", "",
             f"First {n:,} replay events, {runs} runs, a release every {tick} events; {len(rows):,} users, "
             f"{V.nnz:,} nonzeros in the user relation matrix. Wall time {doc['seconds']:.0f} s.", "",
             "| model | " + " | ".join(keys) + " | seconds per run |", "|---|" + "---|" * (len(keys) + 1)]
    for name, label in (("clusters", "CoLin, 100 clusters (dense solve)"), ("users", "CoLin, every user (sparse CG)")):
        r = doc["rows"][name]
        lines.append(f"| {label} | " + " | ".join(f"{r[k]['ratio']:.2f} ± {r[k]['sd']:.2f}" for k in keys)
                     + f" | {np.mean([r[k]['seconds_per_run'] for k in keys]):.1f} |")
    lines += ["", f"Machine yardstick: sum(range(1000)) = {doc['machine']['python_speed_us']} µs.", ""]
    (out / "fullgraph.md").write_text("\n".join(lines))
    return doc
