"""The per-user tree probe (privrec.experiments.local_tree_probe) on small made-up replays."""

from __future__ import annotations

import math

import numpy as np

from models.local import LocalConfig
from privrec.experiments.local_tree_probe import ProbeUCB, ldp_floor, public_prior


def _replay(n: int = 400, users: int = 40, items: int = 60, pool: int = 5, d: int = 4) -> dict[str, object]:
    rng = np.random.default_rng(0)
    F = rng.normal(size=(items, d))
    F /= np.linalg.norm(F, axis=1)[:, None]
    pools = np.stack([rng.choice(items, size=pool, replace=False) for _ in range(n)])
    return {"users": np.array([str(u % users) for u in range(n)]), "pools": pools,
            "correct": rng.integers(0, pool, size=n), "features": F, "pool_size": pool, "d": d, "n_units": 2,
            "units": np.array([u % 2 for u in range(n)])}


def test_the_floor_counts_the_data_and_the_one_bit_bound() -> None:
    lf = _replay()
    out = ldp_floor(lf, epsilon=2.0, seeds=3)
    assert out["users"] == 40 and out["events"] == 400 and out["listens_per_user_max"] == 10
    assert math.isclose(out["one_bit_count_std"], math.sqrt(40 * math.e ** 2 / (math.e ** 2 - 1) ** 2))
    logged = lf["pools"][np.arange(400), lf["correct"]]  # type: ignore[index]
    assert out["top_item_listens"][0] == np.bincount(logged).max()
    assert out["distinct_items"] == len(np.unique(logged))


def test_with_the_prior_and_only_noise_the_model_follows_the_prior() -> None:
    d, K = 3, 4
    F = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.6, 0.8, 0.0]])
    prior = public_prior(F, K)
    np.testing.assert_allclose(F.mean(0) @ prior, 1.0 / K)
    cfg = LocalConfig(algorithm="tree", d=d, epsilon=2.0, unit="user", cap=8, user_budget=10.0)
    pol = ProbeUCB(d=d, n_units=1, config=cfg, tick=10, seed=1, alpha=0.0, noise_ridge=1e6, prior=prior)
    for u in range(30):  # rewards of noise-drowned devices: the ridge (1e6 noise stds) leaves the prior
        pol.update(0, F[u % K], 1.0, user=str(u))
    assert pol.solves == 3
    assert pol.select(0, F) == int(np.argmax(F @ prior))
    np.testing.assert_allclose(pol.theta[0], prior, rtol=1e-3)
