"""The pipeline's pure math: batched exact statistics, release, solve, serve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.ground.environment import SyntheticEnvironment
from models.mechanisms import make_mechanism
from models.policies import make_policy
from models.ground.linalg import ucb_scores
from models.streaming import ReleasedStats, Releaser, UnitStats, solve


def _events(n: int, n_units: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_units, n), rng.random((n, d)), rng.random(n)


def test_batched_add_is_bit_identical_to_one_at_a_time() -> None:
    units, X, r = _events(500, 4, 6)
    seq = UnitStats.zeros(n_units=4, d=6)
    for i in range(500):
        seq.gram[units[i]] += np.outer(X[i], X[i])
        seq.b[units[i]] += r[i] * X[i]
        seq.count[units[i]] += 1
    batched = UnitStats.zeros(n_units=4, d=6)
    for lo, hi in [(0, 1), (1, 77), (77, 300), (300, 500)]:
        batched.add(units[lo:hi], X[lo:hi], r[lo:hi])
    assert batched.to_mapping() == seq.to_mapping()


@pytest.mark.parametrize("name", ["LinUCB", "CoLin", "GOBLin"])
def test_solve_matches_the_online_policy(name: str) -> None:
    env = SyntheticEnvironment(n_users=4, d=3, n_arms=40, n_shown=5, horizon=300, seed=2)
    pol = make_policy(name, d=3, W=env.W, lambda_=0.5)
    stats = UnitStats.zeros(n_units=4, d=3)
    for t in range(300):
        r = env.round(t)
        k = pol.select(r.user, r.contexts)
        pol.update(r.user, r.contexts[k], float(r.rewards[k]))
        stats.add(np.array([r.user]), r.contexts[k][None], np.array([r.rewards[k]]))
    structure = "linucb" if name == "LinUCB" else "kron"
    released, _ = Releaser(structure=structure, V=pol.V, d=3, mechanism=None).release(stats, None)
    theta, M = solve(released, lambda_=0.5)
    for u in range(4):
        th, C = pol.serving_model(u)
        np.testing.assert_allclose(theta[u], th, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(M[u], C, rtol=1e-8, atol=1e-10)
    X = env.round(0).contexts
    m1, b1 = ucb_scores(theta[1], M[1], X, 0.3)
    m2, b2 = pol.scores(1, X)
    np.testing.assert_allclose(m1 + b1, m2 + b2, rtol=1e-8)


def test_release_adds_only_mechanism_noise_and_round_trips() -> None:
    units, X, r = _events(50, 3, 2)
    stats = UnitStats.zeros(n_units=3, d=2)
    stats.add(units, X, r)
    V = np.full((3, 3), 1 / 3)
    mech = make_mechanism("gaussian-zcdp", dim=6, sensitivity=float(np.linalg.norm(V[:, 0])), epsilon=1.0,
                          delta=1e-5, horizon=16, seed=3)
    rel = Releaser(structure="kron", V=V, d=2, mechanism=mech)
    released, state = rel.release(stats, rel.init_state(), version=1)
    assert state is not None
    np.testing.assert_allclose(released.b_tilde - rel.exact_b_tilde(stats), mech.noise(state), atol=1e-12)
    np.testing.assert_array_equal(released.gram, stats.gram)  # public: released as is
    again = ReleasedStats.from_mapping(released.to_mapping())
    assert again.to_mapping() == released.to_mapping() and again.version == 1
    assert UnitStats.from_mapping(stats.to_mapping()).to_mapping() == stats.to_mapping()


def test_noise_off_release_equals_exact() -> None:
    units, X, r = _events(40, 3, 2)
    stats = UnitStats.zeros(n_units=3, d=2)
    stats.add(units, X, r)
    mech = make_mechanism("paper", dim=6, sensitivity=1.0, epsilon=math.inf, delta=1e-5, horizon=8, seed=0)
    rel = Releaser(structure="linucb", V=np.eye(3), d=2, mechanism=mech)
    released, _ = rel.release(stats, rel.init_state())
    assert released.b_tilde.tobytes() == stats.b.reshape(-1).tobytes()


def test_bad_inputs() -> None:
    stats = UnitStats.zeros(n_units=2, d=2)
    with pytest.raises(ValueError, match=r"`units` must lie in \[0, 2\)"):
        stats.add(np.array([2]), np.zeros((1, 2)), np.zeros(1))
    with pytest.raises(ValueError, match=r"`contexts` must have shape \(1, 2\)"):
        stats.add(np.array([0]), np.zeros((1, 3)), np.zeros(1))
    with pytest.raises(ValueError, match="`V` must be the identity"):
        Releaser(structure="linucb", V=np.ones((2, 2)), d=2, mechanism=None)
    with pytest.raises(ValueError, match="`lambda_` must be positive"):
        solve(Releaser(structure="linucb", V=np.eye(2), d=2, mechanism=None).release(stats, None)[0], lambda_=0)
