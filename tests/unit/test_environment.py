"""The synthetic environment: the paper's construction, common random numbers, the regret oracle."""

from __future__ import annotations

import numpy as np
import pytest

from models.ground.environment import SyntheticEnvironment


def test_construction_matches_the_paper() -> None:
    env = SyntheticEnvironment(n_users=6, d=5, n_arms=50, n_shown=7, horizon=100, seed=2)
    np.testing.assert_allclose(np.linalg.norm(env.theta, axis=1), 1.0)
    np.testing.assert_allclose(np.linalg.norm(env.arms, axis=1), 1.0)
    np.testing.assert_allclose(env.W.sum(axis=0), 1.0)
    assert (env.theta >= 0).all() and (env.arms >= 0).all()
    for t in range(100):
        assert len(set(env.shown[t].tolist())) == 7
    assert env.users.tolist()[:8] == [0, 1, 2, 3, 4, 5, 0, 1]
    r = env.round(9)
    u = r.user
    expected = r.contexts @ sum(env.W[j, u] * env.theta[j] for j in range(6))
    np.testing.assert_allclose(r.means, expected)
    assert ((r.rewards >= 0) & (r.rewards <= 1)).all()


def test_same_seed_same_world_and_horizon_does_not_change_it() -> None:
    a = SyntheticEnvironment(horizon=50, seed=7, d=3, n_arms=30)
    b = SyntheticEnvironment(horizon=80, seed=7, d=3, n_arms=30)
    np.testing.assert_array_equal(a.theta, b.theta)
    np.testing.assert_array_equal(a.arms, b.arms)
    assert not np.array_equal(a.theta, SyntheticEnvironment(horizon=50, seed=8, d=3, n_arms=30).theta)


def test_regret_oracle_and_random_regret() -> None:
    env = SyntheticEnvironment(horizon=20, seed=1, d=3, n_arms=30, n_shown=4)
    for t in range(20):
        best = int(np.argmax(env.means[t]))
        assert env.regret(t, best) == 0.0
        assert all(env.regret(t, k) >= 0 for k in range(4))
        assert env.random_regret()[t] == pytest.approx(np.mean([env.regret(t, k) for k in range(4)]))


@pytest.mark.parametrize(("kwargs", "match"), [({"n_shown": 0}, "`n_shown`"), ({"n_arms": 3, "n_shown": 5}, "`n_shown`"),
                                                ({"reward_std": -1.0}, "`reward_std`"), ({"horizon": 0}, "`horizon`")])
def test_bad_parameters(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyntheticEnvironment(**kwargs)  # type: ignore[arg-type]
