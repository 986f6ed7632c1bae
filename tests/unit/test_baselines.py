"""Shariff & Sheffet and DGS LinUCB: noise-off twins, PD shift, Wishart padding, constants, restore."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.accounting import GaussianTreeEvent, WishartTreeEvent, describe, gdp_epsilon
from models.policies.baselines import BASELINES, make_baseline
from models.policies.dgs import DGSLinUCB, DGSTreeMechanism, dgs_lambda_prime
from models.ground.environment import SyntheticEnvironment
from models.policies.jdp_linucb import SSLinUCB, ss_gaussian_constants, ss_wishart_constants, wishart_bartlett
from models.ground.noise import KeyedNoise
from models.policies import make_policy


@pytest.fixture(scope="module")
def env() -> SyntheticEnvironment:
    return SyntheticEnvironment(n_users=4, d=4, n_arms=60, n_shown=6, horizon=500, seed=3)


def _play(pol: object, env: SyntheticEnvironment, steps: int, start: int = 0) -> list[int]:
    out = []
    for t in range(start, start + steps):
        r = env.round(t)
        k = pol.select(r.user, r.contexts)  # type: ignore[attr-defined]
        pol.update(r.user, r.contexts[k], float(r.rewards[k]))  # type: ignore[attr-defined]
        out.append(k)
    return out


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("tick", [1, 7])
def test_noise_off_decisions_equal_nonprivate_linucb(name: str, tick: int, env: SyntheticEnvironment) -> None:
    kw = {"d": env.d, "W": env.W, "tick": tick, "horizon": env.horizon, "seed": 1, "alpha": 0.3}
    private = make_policy(name, epsilon=math.inf, **kw)  # type: ignore[arg-type]
    twin = make_policy("LinUCB", **kw)  # type: ignore[arg-type]
    assert _play(private, env, env.horizon) == _play(twin, env, env.horizon)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_noise_on_changes_decisions_and_state_round_trips(name: str, env: SyntheticEnvironment) -> None:
    kw = {"d": env.d, "W": env.W, "tick": 3, "horizon": env.horizon, "seed": 5, "epsilon": 1.0, "alpha": 0.3}
    a = make_policy(name, **kw)  # type: ignore[arg-type]
    clean = make_policy("LinUCB", **{k: v for k, v in kw.items() if k != "epsilon"})  # type: ignore[arg-type]
    first = _play(a, env, 200)
    assert first != _play(clean, env, 200)
    mapping = a.to_mapping()
    b = make_policy(name, **kw)  # type: ignore[arg-type]
    b.load_mapping(mapping)  # type: ignore[attr-defined]
    assert b.to_mapping() == mapping  # type: ignore[attr-defined]
    assert _play(a, env, 150, start=200) == _play(b, env, 150, start=200)


# --------------------------------------------------------------------------- Shariff & Sheffet


def test_ss_constants_reproduce_spec_d12() -> None:
    g = ss_gaussian_constants(d=10, n=2**20, epsilon=1.0, delta=0.01, fail_prob=0.05, lt2=2.0, calibration="paper")
    assert g["m"] == 21 and g["sigma"] == pytest.approx(220, rel=0.01)
    assert g["upsilon"] == pytest.approx(6.8e4, rel=0.01) and g["rho_max"] == pytest.approx(2.0e5, rel=0.02)
    assert g["gamma"] == pytest.approx(35, rel=0.02)
    # D.12 row 1 is per node (epsilon = 1 there); our epsilon is the replace-one target, run at epsilon / 2
    w = ss_wishart_constants(d=10, n=2**20, epsilon=2.0, delta=0.01, fail_prob=0.05, lt2=2.0)
    assert w["k"] == pytest.approx(2.42e5, rel=0.01) and w["rho_min_unshifted"] == pytest.approx(1.01e7, rel=0.01)
    assert -w["shift"] == pytest.approx(9.93e6, rel=0.01) and w["rho_min"] == pytest.approx(1.68e5, rel=0.01)
    assert w["gamma"] == pytest.approx(99.6, rel=0.01)
    assert w["rho_max"] == pytest.approx(w["rho_min_unshifted"] + 4 * 2.0 * math.sqrt(w["m"] * w["k"]) * (
        math.sqrt(10) + math.sqrt(2 * math.log(8 * 2**20 / 0.05))) + w["shift"], rel=1e-9)  # rho'_max = rho_max - c


def test_ss_tight_calibration_is_exact_and_paper_is_conservative() -> None:
    lt2 = 2.0
    for eps in (1.0, 2.0, 10.0):
        tight = ss_gaussian_constants(d=5, n=1000, epsilon=eps, delta=1e-5, fail_prob=0.05, lt2=lt2,
                                      calibration="tight")
        paper = ss_gaussian_constants(d=5, n=1000, epsilon=eps, delta=1e-5, fail_prob=0.05, lt2=lt2,
                                      calibration="paper")
        # replace-one: per node ||v v^T - w w^T||_F / (sqrt 2 sigma) <= L~^2 / sigma, m nodes -> mu = sqrt(m) L~^2 / sigma
        mu_tight = math.sqrt(tight["m"]) * lt2 / tight["sigma"]
        mu_paper = math.sqrt(paper["m"]) * lt2 / paper["sigma"]
        assert gdp_epsilon(mu_tight, 1e-5) == pytest.approx(eps, rel=1e-6)
        assert gdp_epsilon(mu_paper, 1e-5) < eps / 3  # ERRATA §6: the paper's sigma is very conservative


def test_ss_mahalanobis_sensitivity_of_symmetrised_noise() -> None:
    """||D||_F^2 / 2 <= L~^4 for D = v v^T - w w^T (ERRATA §6); max at orthogonal pairs."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(5000):
        v, w = rng.standard_normal(6), rng.standard_normal(6)
        v, w = v / np.linalg.norm(v), w / np.linalg.norm(w)
        D = np.outer(v, v) - np.outer(w, w)
        worst = max(worst, float((D * D).sum()) / 2)
    assert worst <= 1.0 + 1e-12
    v, w = np.eye(6)[0], np.eye(6)[1]
    D = np.outer(v, v) - np.outer(w, w)
    assert float((D * D).sum()) / 2 == pytest.approx(1.0)


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_ss_gaussian_shift_keeps_h_positive_definite(calibration: str) -> None:
    """lambda(H_t) within [rho_min, rho_max] = [Upsilon, 3 Upsilon] at every release (ERRATA §6: [1.82, 2.18])."""
    pol = SSLinUCB(d=5, n_users=1, noise="gaussian", calibration=calibration, epsilon=1.0, delta=0.1, horizon=64,
                   seed=7, alpha=0.3)  # type: ignore[arg-type]
    c, mech = pol.constants, pol.mechanisms[0]
    state = mech.init_state()
    ratios = []
    for _ in range(mech.capacity):
        _, state, _ = mech.step(state, np.zeros(mech.dim))
        H = mech.noise(state).reshape(6, 6)[:5, :5] + c["shift"] * np.eye(5)
        np.testing.assert_array_equal(H, H.T)  # symmetrised node noise
        ev = np.linalg.eigvalsh(H)
        ratios += [ev[0] / c["upsilon"], ev[-1] / c["upsilon"]]
    assert min(ratios) >= 1.0 and max(ratios) <= 3.0
    rng = np.random.default_rng(0)
    x = rng.random(5)
    x /= np.linalg.norm(x)
    for _ in range(40):
        pol.update(0, x, 1.0)
    V = np.linalg.inv(pol.conf_released[0])
    assert np.linalg.eigvalsh(V)[0] >= c["rho_min"] + pol.lambda_ - 1e-6 and pol.psd_fixes == 0


@pytest.mark.parametrize("noise", ["gaussian", "wishart"])
def test_ss_constants_follow_the_epochs_the_released_noise_sums(noise: str) -> None:
    """After a rollover the released noise is carry + the new tree: shift, floor and width use the
    constants of ``epoch + 1`` epochs, and the shifted noise stays inside their [rho_min, rho_max]."""
    calibration = "tight" if noise == "gaussian" else "paper"
    pol = SSLinUCB(d=4, n_users=1, noise=noise, calibration=calibration, epsilon=4.0, delta=0.1, horizon=12, seed=5,
                   user_horizon=3, alpha="theory")  # type: ignore[arg-type]
    mech = pol.mechanisms[0]
    common = dict(d=4, n=3, epsilon=4.0, delta=0.1, fail_prob=pol.fail_prob, lt2=pol.lt2)
    state = mech.init_state()
    seen = set()
    for _ in range(6 * mech.capacity):
        _, state, _ = mech.step(state, np.zeros(mech.dim))
        pol.states[0] = state
        c = pol.constants_for(0)
        epochs = state.epoch + 1
        seen.add(epochs)
        expected = (ss_gaussian_constants(calibration="tight", epochs=epochs, **common) if noise == "gaussian"
                    else ss_wishart_constants(epochs=epochs, **common))
        assert c == expected and (epochs > 1 or c == pol.constants)
        H = mech.noise(state).reshape(5, 5)[:4, :4] + c["shift"] * np.eye(4)
        ev = np.linalg.eigvalsh(0.5 * (H + H.T))
        assert c["rho_min"] <= ev[0] and ev[-1] <= c["rho_max"], (epochs, ev, c)
    assert seen == set(range(1, 7))
    ups = [pol._epoch_constants[e]["rho_max"] for e in range(1, 7)]
    assert ups == sorted(ups) and ups[-1] > ups[0]
    if noise == "gaussian":  # the noise of e epochs is one tree's with variance x e: Upsilon grows ~ sqrt(e)
        assert 6**0.5 <= ups[-1] / ups[0] <= 6**0.5 * 1.5


def test_ss_symmetrised_node_variances() -> None:
    """Off-diagonal entries have variance sigma^2, diagonal ones 2 sigma^2 (spec A.3.2)."""
    pol = SSLinUCB(d=9, n_users=1, noise="gaussian", calibration="tight", epsilon=1.0, horizon=4, seed=3)
    mech = pol.mechanisms[0]
    draws = np.array([mech._node(0, 0, i).reshape(10, 10) for i in range(1, 401)])
    s2 = mech.sigma**2
    off = draws[:, ~np.eye(10, dtype=bool)].ravel()
    diag = draws[:, np.eye(10, dtype=bool)].ravel()
    # off-diagonal pairs are duplicates (symmetry): 400 * 45 independent values
    assert abs(np.triu(draws, 1).sum(axis=(1, 2)).var() / (45 * s2) - 1) < 5 * math.sqrt(2 / 400)
    assert abs(off.var() / s2 - 1) < 5 * math.sqrt(2 / (400 * 45))
    assert abs(diag.var() / (2 * s2) - 1) < 5 * math.sqrt(2 / (400 * 10))


def test_wishart_padding_gives_exactly_mk_degrees_of_freedom_and_keeps_the_shift_pd() -> None:
    pol = SSLinUCB(d=4, n_users=1, noise="wishart", epsilon=4.0, delta=0.1, horizon=60, seed=2, alpha=0.3)
    c, mech = pol.constants, pol.mechanisms[0]
    m, k = int(c["m"]), int(c["k"])
    assert isinstance(mech.event, WishartTreeEvent) and describe(mech.event, 0.1).valid
    state = mech.init_state()
    pads, unpadded_min, padded_min = [], [], []
    for t in range(mech.capacity + 1):
        if t:
            _, state, _ = mech.step(state, np.zeros(mech.dim))
        noise = mech.noise(state).reshape(5, 5)
        pad = state.nodes[m].reshape(5, 5)
        pads.append((m - bin(state.step).count("1")) * k)
        # trace(W_p(s I, df)) has mean p * df * s: the padded total is always W(L~^2 I, m k)
        assert np.trace(noise) == pytest.approx(5 * m * k * pol.lt2, rel=0.02)
        H = noise[:4, :4] + c["shift"] * np.eye(4)
        padded_min.append(np.linalg.eigvalsh(H)[0] / c["rho_min"])
        unpadded_min.append(np.linalg.eigvalsh((noise - pad)[:4, :4] + c["shift"] * np.eye(4))[0] / c["rho_min"])
    assert pads[0] == m * k and min(pads) >= 0
    assert min(padded_min) >= 1.0  # H - cI >= rho'_min: PD with the D.3 padding...
    assert min(unpadded_min) < 0  # ...and indefinite without it (ERRATA §6: mandatory)


def test_wishart_bartlett_moments() -> None:
    g = np.random.default_rng(1)
    draws = np.array([wishart_bartlett(g, 3, 12, 2.0) for _ in range(4000)])
    np.testing.assert_allclose(draws.mean(axis=0), 2.0 * 12 * np.eye(3), atol=5 * 2.0 * math.sqrt(2 * 12 / 4000))
    # Var(W_ii) = 2 df s^2, Var(W_ij) = df s^2
    assert draws[:, 0, 0].var() == pytest.approx(2 * 12 * 4.0, rel=5 * math.sqrt(2 / 4000) * 1.5)
    assert draws[:, 0, 1].var() == pytest.approx(12 * 4.0, rel=5 * math.sqrt(2 / 4000) * 1.5)


def test_ss_protects_contexts_its_event_is_a_gaussian_tree() -> None:
    pol = make_baseline("SS-LinUCB-Gaussian-tight", d=3, n_users=2, epsilon=2.0, delta=1e-5, horizon=100, seed=0)
    assert isinstance(pol.event, GaussianTreeEvent)  # type: ignore[attr-defined]
    assert describe(pol.event, 1e-5).epsilon == pytest.approx(2.0, rel=1e-6)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- DGS


def test_dgs_lambda_prime_crossings_reproduce_spec_d8() -> None:
    def first(pred: object) -> int:
        lo, hi = 1, 10**9
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if pred(mid) else (mid, hi)  # type: ignore[operator]
        return hi

    for lam0, delta, positive, sixteenth in [(1.0, 0.1, 1.1e3, 1.9e3), (0.1, 0.1, 9.7e4, 1.8e5),
                                             (0.1, 1e-6, 1.8e5, 3.2e5), (0.025, 0.01, 2.0e6, 3.7e6)]:
        assert first(lambda t: dgs_lambda_prime(t, lam0, delta) > 0) == pytest.approx(positive, rel=0.05)
        assert first(lambda t: dgs_lambda_prime(t, lam0, delta) >= lam0 * t / 16) == pytest.approx(sixteenth, rel=0.05)


def test_dgs_node_scale_uses_the_block_start_and_noise_is_keyed() -> None:
    mech = DGSTreeMechanism(d=2, levels=5, noise="laplace", multiplier=3.0, lambda_=0.1, lambda_0=1.0,
                            delta_node=0.01, bound=1.0, seed=4, stream=2)
    # node at level 2 completing at leaf 8 covers [5, 8]: sensitivity after 4 leaves
    assert mech.node_scale(0, 2, 8) == pytest.approx(3.0 * 1.0 / (0.1 + max(0.0, dgs_lambda_prime(4, 1.0, 0.01))))
    const = DGSTreeMechanism(d=2, levels=5, noise="gaussian", multiplier=1.0, lambda_=0.1, lambda_0=None,
                             delta_node=0.01, bound=1.0, seed=4)
    assert {const.node_scale(0, i, 1 << i) for i in range(5)} == {10.0}
    state = mech.init_state()
    for _ in range(6):  # t = 6 = 110b: live nodes at level 1 (index 3) and level 2 (index 1)
        release, state, _ = mech.step_to(state, np.zeros(2))
    g1 = KeyedNoise(4, 2).generator(epoch=0, level=1, index=3).laplace(0.0, 1.0, 2) * mech.node_scale(0, 1, 6)
    g2 = KeyedNoise(4, 2).generator(epoch=0, level=2, index=1).laplace(0.0, 1.0, 2) * mech.node_scale(0, 2, 4)
    np.testing.assert_array_equal(release, 0.0 + (g1 + g2))


def test_dgs_guarantee_is_labelled_invalid_and_theory_width_is_finite(env: SyntheticEnvironment) -> None:
    pol = DGSLinUCB(d=env.d, n_users=env.n_users, noise="gaussian", epsilon=2.0, horizon=env.horizon, seed=1,
                    alpha="theory", lambda_0=0.01)
    g = describe(pol.event, 1e-5)
    assert not g.valid and "not a valid DP proof" in g.note
    _play(pol, env, 50)
    assert all(math.isfinite(w) and w > 0 for w in pol.width_released)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"noise": "cauchy"}, "`noise` must be 'gaussian' or 'wishart'"),
    ({"calibration": "loose"}, "`calibration` must be 'paper' or 'tight'"),
    ({"noise": "wishart", "calibration": "tight"}, "`calibration` must be 'paper' for Wishart"),
    ({"fail_prob": 0.0}, r"`fail_prob` must be in \(0, 1\)"),
    ({"tick": 0}, "`tick` must be a positive"),
    ({"epsilon": -1.0}, "`epsilon` must be positive"),
])
def test_ss_bad_parameters_name_the_parameter(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"d": 3, "n_users": 2, "epsilon": 1.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SSLinUCB(**args)  # type: ignore[arg-type]


def test_unknown_baseline_and_bad_dgs_parameters() -> None:
    with pytest.raises(ValueError, match="`name` must be one of"):
        make_baseline("SS-CoLin", d=2, n_users=2)
    with pytest.raises(ValueError, match="`lambda_0` must be positive or None"):
        DGSLinUCB(d=2, n_users=1, lambda_0=-1.0)
    with pytest.raises(ValueError, match="`calibration` must be 'paper' or 'l1'"):
        DGSLinUCB(d=2, n_users=1, calibration="l2")  # type: ignore[arg-type]
