"""In-process speed of one decide+update (``privrec bench core``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from models.ground.environment import SyntheticEnvironment
from models.policies import make_policy
from privrec.experiments.runner import machine_info

#: What the authors' reference code (HCDM/BanditLib) needs here, per decide+update.
REFERENCE_US = {"linucb_us": 40.0, "colin_us": 4400.0}


def mabwiser_linucb_us(*, d: int, arms: int, steps: int, seed: int = 0) -> float | None:
    """MABWiser's LinUCB (disjoint ridge models per arm, one ``d``-dim context per decision): µs per
    predict + partial_fit; ``None`` when MABWiser is not installed (``pip install -e '.[bench]'``)."""
    try:
        from mabwiser.mab import MAB, LearningPolicy
    except ImportError:
        return None
    rng = np.random.default_rng(seed)
    mab = MAB(arms=list(range(arms)), learning_policy=LearningPolicy.LinUCB(alpha=0.3, l2_lambda=1.0), seed=seed)
    mab.fit(decisions=rng.integers(0, arms, 50), rewards=rng.random(50), contexts=rng.normal(size=(50, d)))
    X = rng.normal(size=(steps, 1, d)) / np.sqrt(d)
    t0 = time.perf_counter()
    for t in range(steps):
        a = mab.predict(X[t])
        mab.partial_fit(decisions=[a], rewards=[float(rng.random())], contexts=X[t])
    return (time.perf_counter() - t0) / steps * 1e6


def bench_core(*, steps: int = 5000, d: int = 25, n_users: int = 10, repeats: int = 3) -> dict[str, Any]:
    """Median over ``repeats`` of the mean µs per select+update, for each algorithm."""
    env = SyntheticEnvironment(n_users=n_users, d=d, horizon=steps, seed=0)
    out: dict[str, Any] = {}
    for name, key in (("LinUCB", "linucb_us"), ("CoLin", "colin_us"), ("GOBLin", "goblin_us"),
                      ("DP-LinUCB", "dp_linucb_us"), ("DP-CoLin", "dp_colin_us"), ("LDP-CoLin", "ldp_colin_us")):
        times = []
        for rep in range(repeats):
            pol = make_policy(name, d=d, W=env.W, epsilon=2.0, horizon=steps, seed=rep)
            t0 = time.perf_counter()
            for t in range(steps):
                u = int(env.users[t])
                X = env.arms[env.shown[t]]
                k = pol.select(u, X)
                pol.update(u, X[k], float(env.rewards[t, k]))
            times.append((time.perf_counter() - t0) / steps * 1e6)
        out[key] = float(np.median(times))
    out["reference_us"] = REFERENCE_US
    out["speedup_vs_reference"] = {k: REFERENCE_US[k] / out[k] for k in REFERENCE_US}
    peer = mabwiser_linucb_us(d=d, arms=env.n_shown, steps=max(200, steps // 10))
    if peer is not None:  # the peer, in the same run (the `bench` extra installs it)
        out["mabwiser_linucb_us"] = peer
        out["speedup_vs_mabwiser_linucb"] = peer / out["linucb_us"]
    out["settings"] = {"d": d, "n_users": n_users, "steps": steps, "repeats": repeats, "n_shown": env.n_shown,
                       "what": "mean wall time of select() + update() in-process, median over repeats"}
    out["machine"] = machine_info()
    return out
