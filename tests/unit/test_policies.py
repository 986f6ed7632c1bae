"""The Kronecker UCB family: identities, brute-force equality, noise-off twins, state round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.ground.environment import SyntheticEnvironment
from models.ground.graphs import (
    adjacency_from_w,
    column_normalize,
    complete_adjacency,
    goblin_projection,
    sensitivities,
    similarity_w,
    uniform_w,
)
from models.mechanisms import MECHANISMS
from models.policies import ALGORITHMS, KroneckerUCB, PrivacyConfig, make_policy

PRIVATE_TWINS = {"DP-LinUCB": "LinUCB", "DP-CoLin": "CoLin", "DP-GOBLin": "GOBLin",
                 "LDP-CoLin": "CoLin", "LDP-GOBLin": "GOBLin"}


@pytest.fixture(scope="module")
def env() -> SyntheticEnvironment:
    return SyntheticEnvironment(n_users=5, d=4, n_arms=60, n_shown=6, horizon=600, seed=3)


def _play(pol: KroneckerUCB, env: SyntheticEnvironment, steps: int, start: int = 0) -> list[int]:
    out = []
    for t in range(start, start + steps):
        r = env.round(t)
        k = pol.select(r.user, r.contexts)
        pol.update(r.user, r.contexts[k], float(r.rewards[k]))
        out.append(k)
    return out


def test_kron_is_column_major_vec_and_norm_factorises() -> None:
    rng = np.random.default_rng(0)
    W = column_normalize(rng.random((6, 6)))
    x = rng.random(4)
    for u in range(6):
        X_dot = np.zeros((4, 6))
        X_dot[:, u] = x
        vec = (X_dot @ W.T).reshape(-1, order="F")  # Vec(X_dot W^T), column-major
        np.testing.assert_allclose(np.kron(W[:, u], x), vec, atol=1e-15)
        assert np.linalg.norm(vec) == pytest.approx(np.linalg.norm(x) * np.linalg.norm(W[:, u]))


def test_sensitivity_worked_cases() -> None:
    assert sensitivities(np.eye(5)).max() == 1.0
    assert sensitivities(uniform_w(10)).max() == pytest.approx(0.3162, abs=1e-4)
    assert sensitivities(goblin_projection(complete_adjacency(10))).max() == pytest.approx(0.4264, abs=1e-4)
    assert sensitivities(goblin_projection(complete_adjacency(6))).max() == pytest.approx(0.5345, abs=1e-4)
    assert sensitivities(goblin_projection(np.zeros((4, 4)))).max() == pytest.approx(1.0)


def test_similarity_w_is_column_stochastic_with_self_weight() -> None:
    theta = np.random.default_rng(1).random((8, 3))
    W = similarity_w(theta, 0.5)
    np.testing.assert_allclose(W.sum(axis=0), 1.0)
    assert (np.diag(W) > 0).all() and (W == 0).any()
    assert (similarity_w(theta, 0.0) > 0).all()


@pytest.mark.parametrize("name", ["LinUCB", "CoLin", "GOBLin"])
def test_scores_equal_brute_force_ridge_on_kron_features(name: str, env: SyntheticEnvironment) -> None:
    pol = make_policy(name, d=env.d, W=env.W, lambda_=0.5, alpha=0.7)
    V = pol.V
    A = 0.5 * np.eye(env.d * env.n_users)
    b = np.zeros(env.d * env.n_users)
    for t in range(150):
        r = env.round(t)
        Xt = np.array([np.kron(V[:, r.user], x) for x in r.contexts])
        Ainv = np.linalg.inv(A)
        expected = Xt @ (Ainv @ b) + 0.7 * np.sqrt(np.einsum("ij,jk,ik->i", Xt, Ainv, Xt))
        mean, bonus = pol.scores(r.user, r.contexts)
        np.testing.assert_allclose(mean + bonus, expected, rtol=1e-9, atol=1e-10)
        k = int(np.argmax(expected))
        A += np.outer(Xt[k], Xt[k])
        b += Xt[k] * r.rewards[k]
        pol.update(r.user, r.contexts[k], float(r.rewards[k]))


def test_colin_with_identity_w_is_independent_linucb(env: SyntheticEnvironment) -> None:
    eye = np.eye(env.n_users)
    a = KroneckerUCB(d=env.d, V=eye)  # block-diagonal storage
    assert a.block
    dense = KroneckerUCB(d=env.d, V=eye + 0.0)
    dense.block = False  # force the dense dN x dN path on the same V
    dense.reset()
    assert _play(a, env, 300) == _play(dense, env, 300)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("tick", [1, 7])
@pytest.mark.parametrize("name", sorted(PRIVATE_TWINS))
def test_noise_off_private_decisions_equal_the_nonprivate_twin(
    name: str, tick: int, mechanism: str, env: SyntheticEnvironment
) -> None:
    kw = {"d": env.d, "W": env.W, "tick": tick, "horizon": env.horizon, "seed": 1}
    private = make_policy(name, epsilon=math.inf, mechanism=mechanism, **kw)
    twin = make_policy(PRIVATE_TWINS[name], **kw)
    assert _play(private, env, env.horizon) == _play(twin, env, env.horizon)
    assert private.b_released.tobytes() == twin.b_released.tobytes()


def test_noise_on_changes_decisions_and_ldp_noise_exceeds_dp(env: SyntheticEnvironment) -> None:
    kw = {"d": env.d, "W": env.W, "horizon": env.horizon, "seed": 1, "epsilon": 1.0}
    dp, ldp, clean = make_policy("DP-CoLin", **kw), make_policy("LDP-CoLin", **kw), make_policy("CoLin", **kw)
    _play(dp, env, 300), _play(ldp, env, 300), _play(clean, env, 300)
    err_dp = np.linalg.norm(dp.b_released - dp.b_exact)
    err_ldp = np.linalg.norm(ldp.b_released - ldp.b_exact)
    assert err_dp > 0 and err_ldp > err_dp


def test_ldp_aggregate_is_sum_of_user_releases(env: SyntheticEnvironment) -> None:
    pol = make_policy("LDP-GOBLin", d=env.d, W=env.W, epsilon=2.0, horizon=env.horizon, seed=4)
    _play(pol, env, 200)
    user_releases = [m.noise(s) + s.prefix for m, s in zip(pol.user_mechanisms, pol.user_states)]
    np.testing.assert_allclose(np.sum(user_releases, axis=0), pol.b_released, atol=1e-9)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("tick", [1, 4])
def test_state_round_trips_bit_exactly_and_continues_identically(
    name: str, tick: int, env: SyntheticEnvironment
) -> None:
    kw = {"d": env.d, "W": env.W, "epsilon": 2.0, "mechanism": "gaussian-zcdp", "horizon": env.horizon,
          "seed": 9, "tick": tick}
    a = make_policy(name, **kw)
    _play(a, env, 203)
    mapping = a.to_mapping()
    b = make_policy(name, **kw)
    b.load_mapping(mapping)
    assert b.to_mapping() == mapping
    assert _play(a, env, 250, start=203) == _play(b, env, 250, start=203)
    assert a.b_released.tobytes() == b.b_released.tobytes()
    assert a.ainv.tobytes() == b.ainv.tobytes()


def test_ticks_hold_the_serving_model_between_releases(env: SyntheticEnvironment) -> None:
    pol = make_policy("CoLin", d=env.d, W=env.W, tick=5)
    r = env.round(0)
    before = pol.scores(r.user, r.contexts)
    for t in range(4):
        rr = env.round(t)
        pol.update(rr.user, rr.contexts[0], 1.0)
    np.testing.assert_array_equal(pol.scores(r.user, r.contexts)[0], before[0])  # nothing released yet
    rr = env.round(4)
    pol.update(rr.user, rr.contexts[0], 1.0)  # 5th interaction: tick
    assert not np.array_equal(pol.scores(r.user, r.contexts)[0], before[0])


def test_theory_width_is_finite_and_grows_with_noise(env: SyntheticEnvironment) -> None:
    kw = {"d": env.d, "W": env.W, "alpha": "theory", "horizon": env.horizon, "seed": 0}
    clean = make_policy("CoLin", **kw)
    noisy = make_policy("DP-CoLin", epsilon=1.0, **kw)
    _play(clean, env, 50), _play(noisy, env, 50)
    assert math.isfinite(clean.current_alpha()) and noisy.current_alpha() > clean.current_alpha() > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": -1.0}, "`epsilon` must be positive"),
        ({"delta": 1.0}, r"`delta` must be in \(0, 1\)"),
        ({"W": np.array([[1.0, 0.0], [0.0, 0.0]])}, r"`W` has zero column\(s\) \[1\]"),
        ({"W": np.ones((2, 3))}, "`W` must be a square"),
        ({"tick": 0}, "`tick` must be a positive"),
        ({"lambda_": 0.0}, "`lambda_` must be positive"),
        ({"alpha": -0.1}, "`alpha` must be a non-negative number"),
        ({"mechanism": "nope"}, "`mechanism` must be one of"),
        ({"V": np.eye(3)}, r"`V` must have the shape of `W`"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"d": 3, "W": uniform_w(2), "epsilon": 1.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_policy("DP-CoLin", **args)  # type: ignore[arg-type]


def test_bad_inputs_to_select_and_update(env: SyntheticEnvironment) -> None:
    pol = make_policy("CoLin", d=env.d, W=env.W)
    with pytest.raises(ValueError, match=r"`contexts` must have shape \(K, 4\)"):
        pol.select(0, np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"`user` must be an integer in \[0, 5\)"):
        pol.select(5, np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"`context` must have shape \(4,\)"):
        pol.update(0, np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="`reward` must be finite"):
        pol.update(0, np.zeros(4), float("nan"))
    with pytest.raises(ValueError, match="`mode` must be"):
        PrivacyConfig(mode="central")  # type: ignore[arg-type]


def test_goblin_adjacency_comes_from_the_support_of_w() -> None:
    W = column_normalize(np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    np.testing.assert_array_equal(adjacency_from_w(W), [[0, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_ldp_tree_advances_on_every_interaction_even_with_zero_reward(env: SyntheticEnvironment) -> None:
    """Whether a user's release changes must not reveal its reward (a 0 makes a zero increment)."""
    pol = make_policy("LDP-CoLin", d=env.d, W=env.W, epsilon=2.0, horizon=env.horizon, seed=4)
    r = env.round(0)
    before = pol.user_states[r.user].step
    pol.update(r.user, r.contexts[0], 0.0)
    assert pol.user_states[r.user].step == before + 1
    eta_after_zero = pol.b_released.copy()
    assert not np.array_equal(eta_after_zero, pol.b_exact)  # fresh noise was released for the zero reward


@pytest.mark.parametrize("name", ["DP-LinUCB", "DP-CoLin"])
def test_noise_scaled_ridge(name: str, env: SyntheticEnvironment) -> None:
    from models.mechanisms import noise_std

    kw = {"d": env.d, "W": env.W, "horizon": env.horizon, "seed": 2, "mechanism": "user-blt-exact", "tick": 3}
    # noise off: the ridge is inactive and the policy is its non-private twin
    off = make_policy(name, epsilon=math.inf, noise_ridge=30.0, **kw)
    twin = make_policy(PRIVATE_TWINS[name], **kw)
    assert _play(off, env, 200) == _play(twin, env, 200)
    # noise on: the served inverse is (G + (lambda + kappa s_t) I)^{-1} with s_t the release's noise std
    on = make_policy(name, epsilon=2.0, noise_ridge=30.0, **kw)
    _play(on, env, 201)
    assert on.mechanism is not None and on.mech_state is not None and on.gram is not None
    lam = on.lambda_ + 30.0 * noise_std(on.mechanism, on.mech_state)
    assert on.lambda_released == pytest.approx(lam) and lam > on.lambda_ + 1
    G = on.gram
    expected = np.linalg.inv(G + lam * np.eye(G.shape[-1]))
    np.testing.assert_allclose(on.ainv_released, expected, rtol=1e-10, atol=1e-12)
    # and it round-trips with the rest of the state
    again = make_policy(name, epsilon=2.0, noise_ridge=30.0, **kw)
    again.load_mapping(on.to_mapping())
    assert again.to_mapping() == on.to_mapping()
    assert _play(on, env, 100, start=201) == _play(again, env, 100, start=201)
