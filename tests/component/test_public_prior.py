"""The public prior mean of theta (models.streaming.solve.public_prior, ``--prior-strength``): its math, its settings,
the solve stage that serves it, and the offline twin that uses the same solve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.local import LocalConfig, LocalUCB
from models.local.policy import LocalItemUCB
from models.streaming import ReleasedStats
from models.streaming.release import NoNoiseEvent
from models.streaming.solve import public_prior, solve
from pipeline.config.settings import Settings, SettingsError
from pipeline.data.catalog import load_catalog
from pipeline.release.stages import SolveStage


def _released(rng: np.random.Generator, n: int = 3, d: int = 4) -> ReleasedStats:
    X = rng.normal(size=(n, 30, d))
    gram = np.einsum("uki,ukj->uij", X, X)
    b = rng.normal(size=(n, d)) * 3
    return ReleasedStats("linucb", np.eye(n), gram, b.reshape(-1), np.full(n, 30), 1, NoNoiseEvent(), 0.0)


def test_the_prior_scores_the_mean_context_at_the_stated_reward() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6))
    theta0 = public_prior(X, 0.04)
    clipped = X / np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    assert clipped.mean(axis=0) @ theta0 == pytest.approx(0.04, rel=1e-12)
    # the least-norm such theta: parallel to the mean context
    assert abs(np.dot(theta0, clipped.mean(axis=0))) == pytest.approx(
        np.linalg.norm(theta0) * np.linalg.norm(clipped.mean(axis=0)), rel=1e-12)


@pytest.mark.parametrize("bad", [np.zeros((0, 3)), np.array([[1.0, -1.0], [-1.0, 1.0]]), np.array([[np.nan, 1.0]])])
def test_a_catalog_without_a_mean_direction_is_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="features"):
        public_prior(bad, 0.04)


def test_solve_with_a_prior_is_the_ridge_centred_on_it() -> None:
    rng = np.random.default_rng(1)
    rel = _released(rng)
    prior = rng.normal(size=4)
    lam, s = 1.5, 40.0
    theta, M = solve(rel, lambda_=lam, prior=prior, prior_strength=s)
    for u in range(3):
        G, b = rel.gram[u], rel.b_tilde.reshape(3, 4)[u]
        want_M = np.linalg.inv(G + (lam + s) * np.eye(4))
        np.testing.assert_allclose(M[u], want_M, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(theta[u], want_M @ (b + s * prior), rtol=1e-10)
    # strength 0 is the ordinary ridge; a very strong prior is the prior
    t0, _ = solve(rel, lambda_=lam)
    np.testing.assert_array_equal(solve(rel, lambda_=lam, prior=prior, prior_strength=0.0)[0], t0)
    far, _ = solve(rel, lambda_=lam, prior=prior, prior_strength=1e12)
    np.testing.assert_allclose(far, np.broadcast_to(prior, far.shape), rtol=1e-6)


def test_solve_refuses_a_prior_it_cannot_apply() -> None:
    rel = _released(np.random.default_rng(2))
    with pytest.raises(ValueError, match="prior"):
        solve(rel, lambda_=1.0, prior=None, prior_strength=5.0)
    with pytest.raises(ValueError, match="prior"):
        solve(rel, lambda_=1.0, prior=np.ones(3), prior_strength=5.0)
    with pytest.raises(ValueError, match="prior_strength"):
        solve(rel, lambda_=1.0, prior=np.ones(4), prior_strength=math.nan)
    colin = ReleasedStats("colin", np.eye(3), rel.gram, rel.b_tilde, rel.count, 1, NoNoiseEvent(), 0.0)
    with pytest.raises(ValueError, match="linucb"):
        solve(colin, lambda_=1.0, prior=np.ones(4), prior_strength=5.0)


@pytest.mark.parametrize("changes, field", [
    ({"prior_strength": -1.0}, "prior_strength"),
    ({"prior_strength": math.inf}, "prior_strength"),
    ({"prior_reward": 0.0}, "prior_reward"),
    ({"prior_reward": math.nan}, "prior_reward"),
    ({"prior_strength": 10.0, "algorithm": "colin"}, "prior_strength"),
])
def test_bad_prior_settings_name_their_field(changes: dict[str, float], field: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings(**changes)  # type: ignore[arg-type]
    assert err.value.setting == field


def test_the_prior_is_a_model_setting_that_old_namespaces_do_not_record() -> None:
    assert "prior_strength" not in Settings().model_config()
    assert "prior_reward" not in Settings(prior_reward=0.5).model_config()  # no prior: its reward does not matter
    cfg = Settings(prior_strength=100.0, prior_reward=0.1).model_config()
    assert (cfg["prior_strength"], cfg["prior_reward"]) == (100.0, 0.1)


def test_the_solve_stage_serves_the_catalogs_prior_and_says_so() -> None:
    settings = Settings(catalog="synthetic", d=4, n_users=3, n_arms=50, prior_strength=25.0, prior_reward=0.2)
    rel = _released(np.random.default_rng(3))
    theta, M, extra = SolveStage(settings, None, {})._solve(rel)  # type: ignore[arg-type]
    prior = public_prior(np.asarray(load_catalog(settings).feature_matrix), 0.2)
    want_theta, want_M = solve(rel, lambda_=settings.lambda_, prior=prior, prior_strength=25.0)
    np.testing.assert_array_equal(theta, want_theta)
    np.testing.assert_array_equal(M, want_M)
    assert (extra["prior_strength"], extra["prior_reward"]) == ("25.0", "0.2")
    plain = SolveStage(settings.replace(prior_strength=0.0), None, {})._solve(rel)  # type: ignore[arg-type]
    assert "prior_strength" not in plain[2] and not np.allclose(plain[0], theta)


def test_the_offline_twins_use_the_same_solve() -> None:
    d = 3
    prior = np.array([0.2, -0.1, 0.3])
    config = LocalConfig(algorithm="round", d=d, epsilon=1.0, delta=1e-5)
    tree = LocalUCB(d=d, n_units=2, config=config, tick=1, seed=0, prior=prior, prior_strength=1e9)
    tree.update(0, np.array([0.5, 0.5, 0.0]), 1.0, user="u")
    np.testing.assert_allclose(tree.theta, np.broadcast_to(prior, (2, d)), atol=1e-6)
    pop = LocalItemUCB(d=d, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, share=0.0, prior=prior,
                       prior_strength=50.0, codewords=np.eye(d))
    # before any data the twin serves the prior's solve, as the pipeline's solve stage would
    np.testing.assert_allclose(pop.theta[0], 50.0 * prior / (1.0 + 50.0), rtol=1e-12)
    with pytest.raises(ValueError, match="prior"):
        LocalItemUCB(d=d, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, share=0.0, prior=np.ones(2),
                     prior_strength=1.0)
