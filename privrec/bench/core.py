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
    # every step's inputs made before the clock starts, as the MABWiser loop's contexts are: the loop then
    # times select + update and a basic index per step, not numpy's fancy indexing into the arm table
    users = env.users.tolist()
    shown = env.arms[env.shown]
    rewards = env.rewards.tolist()
    out: dict[str, Any] = {}

    def timed(name: str, rep: int) -> float:
        pol = make_policy(name, d=d, W=env.W, epsilon=2.0, horizon=steps, seed=rep)
        t0 = time.perf_counter()
        for t in range(steps):
            u = users[t]
            X = shown[t]
            k = pol.select(u, X)
            pol.update(u, X[k], rewards[t][k])
        return (time.perf_counter() - t0) / steps * 1e6

    # LinUCB and its peer take turns, repeat by repeat, so that a slow minute slows both
    ours, peers = [], []
    for rep in range(repeats):
        ours.append(timed("LinUCB", rep))
        peer = mabwiser_linucb_us(d=d, arms=env.n_shown, steps=max(200, steps // 10), seed=rep)
        if peer is not None:  # the `bench` extra installs it
            peers.append(peer)
    out["linucb_us"] = float(np.median(ours))
    for name, key in (("CoLin", "colin_us"), ("GOBLin", "goblin_us"),
                      ("DP-LinUCB", "dp_linucb_us"), ("DP-CoLin", "dp_colin_us"), ("LDP-CoLin", "ldp_colin_us")):
        out[key] = float(np.median([timed(name, rep) for rep in range(repeats)]))
    out["reference_us"] = REFERENCE_US
    out["speedup_vs_reference"] = {k: REFERENCE_US[k] / out[k] for k in REFERENCE_US}
    if peers:
        out["mabwiser_linucb_us"] = float(np.median(peers))
        out["speedup_vs_mabwiser_linucb"] = out["mabwiser_linucb_us"] / out["linucb_us"]
        out["speedup_vs_mabwiser_linucb_by_repeat"] = [p / o for o, p in zip(ours, peers)]
    out["settings"] = {"d": d, "n_users": n_users, "steps": steps, "repeats": repeats, "n_shown": env.n_shown,
                       "what": "mean wall time of select() + update() in-process, median over repeats (LinUCB and "
                               "MABWiser interleaved); "
                               "each step's user, candidates and rewards made before the clock starts"}
    out["machine"] = machine_info()
    return out
