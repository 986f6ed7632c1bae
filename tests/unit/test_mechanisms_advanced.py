"""Honaker, smooth binary, BLT factorization and user-space noise: exactness, noise law, privacy, restore.

Variance checks use many i.i.d. coordinates of one stream: the sample
variance of ``n`` Gaussian values has relative standard error ``sqrt(2/n)``
(``sqrt((2 + kappa)/n)`` with excess kurtosis ``kappa <= 3`` for linear
combinations of Laplace values), and every check allows 5 of them.
Privacy checks recompute the guarantee independently: ``delta(epsilon)`` by
numerical integration of the Gaussian privacy-loss distribution, the
factorization's column norms from the dense matrices, and the nodes covering
each increment by recording every keyed draw.
"""

from __future__ import annotations

import math
import numpy as np
import pytest

from models.accounting import (
    FactorizationEvent,
    GaussianTreeEvent,
    GDPAccountant,
    ZCDPAccountant,
    describe,
    event_from_dict,
    event_to_dict,
    gdp_mu,
    group_guarantee,
)
from models.mechanisms.factorization import (
    BLT_TABLE,
    BLTMechanism,
    blt_coefficients,
    blt_column_norm,
    blt_error_coefficient,
    blt_loss,
    blt_parameters,
    blt_strategy_coefficients,
    fit_blt,
    sqrt_coefficients,
    toeplitz_lower,
)
from models.mechanisms.honaker import HonakerTreeMechanism, honaker_node_variance, honaker_prefix_variance
from models.mechanisms import MECHANISMS, BinaryTreeMechanism, TreeState, make_mechanism
from models.ground.noise import KeyedNoise
from models.mechanisms.smooth import SmoothBinaryMechanism, smooth_shape, weight_k_unrank
from models.mechanisms.userspace import UserSpaceMechanism

NEW = sorted(n for n in MECHANISMS if n.startswith(("honaker", "smooth", "blt", "user-")))
EPS = (0.5, 1.0, 2.0, 5.0, 10.0)
N_COORD = 20_000


def _delta_by_integration(mu: float, epsilon: float) -> float:
    """delta(eps) = E[(1 - e^(eps - L))_+], privacy loss L ~ N(mu^2/2, mu^2), by quadrature."""
    m, s = mu * mu / 2, mu
    x = np.linspace(m - 40 * s, m + 40 * s, 2_000_001)
    pdf = np.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    f = np.where(x > epsilon, (1 - np.exp(np.minimum(epsilon - x, 0))) * pdf, 0.0)
    return float(np.trapezoid(f, x))


def _run_zero(mech: object, steps: int) -> list[np.ndarray]:
    state = mech.init_state()  # type: ignore[attr-defined]
    out = []
    for _ in range(steps):
        release, state, _ = mech.step(state, np.zeros(mech.dim))  # type: ignore[attr-defined]
        out.append(release)
    return out


def _close_var(sample: np.ndarray, expected: float, kurtosis: float = 0.0) -> None:
    rel = math.sqrt((2 + kurtosis) / sample.size)
    assert abs(sample.var() / expected - 1) < 5 * rel, (sample.var(), expected)
    assert abs(sample.mean()) < 5 * math.sqrt(expected / sample.size)


# --------------------------------------------------------------------------- all new names


@pytest.mark.parametrize("name", NEW)
def test_noise_off_is_exact_across_epochs(name: str) -> None:
    rng = np.random.default_rng(0)
    mech = make_mechanism(name, dim=6, sensitivity=1.0, epsilon=math.inf, delta=1e-5, horizon=5, seed=2)
    state, exact = mech.init_state(), np.zeros(6)
    for _ in range(23):
        inc = rng.standard_normal(6)
        exact = exact + inc
        release, state, event = mech.step(state, inc)
        assert release.tobytes() == exact.tobytes()
    assert state.epoch >= 2
    assert describe(event, 1e-5).note == "no noise"


@pytest.mark.parametrize("name", NEW)
def test_state_round_trip_through_the_mechanism_and_a_fresh_object(name: str) -> None:
    """Mid-stream (and across an epoch) the state decodes bit-exactly; a new object with the key continues."""
    rng = np.random.default_rng(3)
    incs = rng.standard_normal((40, 4))
    kw = {"dim": 4, "sensitivity": 1.0, "epsilon": 2.0, "delta": 1e-5, "horizon": 9, "seed": 77, "stream": 5}
    a = make_mechanism(name, **kw)  # type: ignore[arg-type]
    s = a.init_state()
    for x in incs[:13]:
        _, s, _ = a.step(s, x)
    mapping = s.to_mapping()
    b = make_mechanism(name, **kw)  # type: ignore[arg-type]  # as after a restart
    s2 = b.state_from_mapping({k.encode(): v for k, v in mapping.items()})
    assert s2.to_mapping() == mapping
    for x in incs[13:]:
        ra, s, _ = a.step(s, x)
        rb, s2, _ = b.step(s2, x)
        assert ra.tobytes() == rb.tobytes()
    other = make_mechanism(name, **{**kw, "seed": 78})  # type: ignore[arg-type]
    assert not np.array_equal(other.step(other.init_state(), incs[0])[0], a.step(a.init_state(), incs[0])[0])


@pytest.mark.parametrize("name", NEW)
def test_step_to_equals_step(name: str) -> None:
    mech = make_mechanism(name, dim=3, sensitivity=1.0, epsilon=1.0, delta=1e-5, horizon=6, seed=1)
    s1 = s2 = mech.init_state()
    prefix = np.zeros(3)
    for t in range(15):
        inc = np.full(3, float(t))
        prefix = prefix + inc
        r1, s1, _ = mech.step(s1, inc)
        r2, s2, _ = mech.step_to(s2, prefix)
        assert r1.tobytes() == r2.tobytes()


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("epsilon", [2.0, 10.0])
def test_guarantee_is_valid_by_numerical_integration(name: str, epsilon: float) -> None:
    mech = make_mechanism(name, dim=2, sensitivity=1.0, epsilon=epsilon, delta=1e-5, horizon=1000, seed=0)
    ev = mech.event
    g = describe(ev, 1e-5)
    if name == "honaker-paper":  # the papers' calibration stays labelled invalid
        assert not g.valid and g.epsilon == pytest.approx(epsilon)
        return
    assert g.valid
    if isinstance(ev, FactorizationEvent):
        mu = ev.column_norm / ev.noise_multiplier
    else:
        assert isinstance(ev, GaussianTreeEvent)
        mu = math.sqrt(ev.max_nodes_per_leaf) / ev.noise_multiplier
    delta = _delta_by_integration(mu, epsilon)
    assert delta <= 1e-5 * 1.001
    if name.endswith("exact"):
        assert delta > 0.99e-5  # tight: the whole delta is spent
        assert g.epsilon == pytest.approx(epsilon, rel=1e-6)
    else:  # zCDP conversion is loose
        assert ZCDPAccountant().compose(ev).epsilon(1e-5) == pytest.approx(epsilon, rel=1e-6)


# --------------------------------------------------------------------------- Honaker


def test_honaker_variances_match_errata() -> None:
    assert [honaker_node_variance(i) for i in range(3)] == pytest.approx([1.0, 2 / 3, 4 / 7])
    binary = np.mean([bin(t).count("1") for t in range(1, 1024)])
    honaker = np.mean([honaker_prefix_variance(t) for t in range(1, 1024)])
    assert binary == pytest.approx(5.005, abs=1e-3) and honaker == pytest.approx(2.904, abs=1e-3)


@pytest.mark.parametrize(("noise", "kurtosis"), [("gaussian", 0.0), ("laplace", 3.0)])
def test_honaker_release_variance_matches_formula_at_every_step(noise: str, kurtosis: float) -> None:
    mech = HonakerTreeMechanism(dim=N_COORD, levels=4, noise=noise, scale=1.0, seed=11)  # type: ignore[arg-type]
    for t, release in enumerate(_run_zero(mech, mech.capacity), start=1):
        _close_var(release, mech.prefix_variance(t), kurtosis)


def test_honaker_uses_the_binary_trees_draws_and_is_unbiased() -> None:
    kw = {"dim": 3, "levels": 4, "noise": "gaussian", "scale": 1.0, "seed": 9}
    h, b = HonakerTreeMechanism(**kw), BinaryTreeMechanism(**kw)  # type: ignore[arg-type]
    drawn: dict[str, set[tuple[int, int, int]]] = {"h": set(), "b": set()}
    for key, mech in (("h", h), ("b", b)):
        original = mech._draw

        def spy(epoch: int, level: int, index: int, _k: str = key, _o: object = original) -> np.ndarray:
            drawn[_k].add((epoch, level, index))
            return _o(epoch, level, index)  # type: ignore[operator]

        mech._draw = spy  # type: ignore[method-assign]
        _run_zero(mech, 20)  # crosses an epoch (capacity 15)
    assert drawn["b"] <= drawn["h"]  # every node the binary tree uses, Honaker uses too
    for epoch in (0, 1):  # ...and Honaker's nodes still put each leaf in at most `levels` of them
        for leaf in range(1, 16):
            covering = [(lv, k) for e, lv, k in drawn["h"] if e == epoch and (k - 1) << lv < leaf <= k << lv]
            assert len(covering) <= 4
    # noise-free linear structure: identical increments give the identical released prefix
    s = h.init_state()
    for _ in range(7):
        r, s, _ = h.step(s, np.ones(3))
    np.testing.assert_allclose(r - h.noise(s), 7.0)


# --------------------------------------------------------------------------- smooth binary


def test_weight_k_unrank_enumerates_in_order() -> None:
    for depth, k in [(4, 2), (6, 3), (7, 2)]:
        brute = [x for x in range(1 << depth) if bin(x).count("1") == k]
        assert [weight_k_unrank(r, depth, k) for r in range(len(brute))] == brute


def test_smooth_shape() -> None:
    assert smooth_shape(5) == (4, 2) and smooth_shape(1000) == (14, 7) and smooth_shape(100_000) == (20, 10)
    for n in (10, 1000, 100_000):
        depth, k = smooth_shape(n, "optimal")
        assert math.comb(depth, k) - 1 >= n
        # no (h, j) with enough leaves does better
        assert all(j * (h - j) >= k * (depth - k) for h in range(2, 40) for j in range(1, h)
                   if math.comb(h, j) - 1 >= n)


@pytest.mark.parametrize(("depth", "weight"), [(6, 3), (8, 3), (8, 5)])
def test_smooth_each_increment_lies_in_at_most_depth_minus_k_nodes(depth: int, weight: int) -> None:
    mech = SmoothBinaryMechanism(dim=1, depth=depth, weight=weight, noise="gaussian", scale=1.0, seed=0)
    drawn: list[tuple[int, int, int]] = []
    original = mech._draw

    def spy(epoch: int, level: int, index: int) -> np.ndarray:
        drawn.append((epoch, level, index))
        return original(epoch, level, index)

    mech._draw = spy  # type: ignore[method-assign]
    steps = mech.capacity + 3
    _run_zero(mech, steps)
    assert len(drawn) == len(set(drawn))  # every node drawn once: never redrawn
    leaves = [weight_k_unrank(r, depth, weight) for r in range(mech.capacity + 1)]
    worst = 0
    for t in range(1, mech.capacity + 1):  # increment t sits at leaf position L[t-1]
        q = leaves[t - 1]
        covering = [(b, i) for e, b, i in drawn if e == 0 and ((i << b) - (1 << b)) <= q < (i << b)]
        worst = max(worst, len(covering))
    assert worst == depth - weight == mech.event.max_nodes_per_leaf  # type: ignore[attr-defined]
    assert {e for e, _, _ in drawn} == {0, 1}


def test_smooth_variance_is_constant_and_matches_formula() -> None:
    mech = SmoothBinaryMechanism(dim=N_COORD, depth=6, weight=3, noise="gaussian", scale=1.0, seed=4)
    for release in _run_zero(mech, mech.capacity):
        _close_var(release, 3.0)


def test_smooth_epochs_are_closed_eagerly_and_frozen() -> None:
    mech = SmoothBinaryMechanism(dim=2, depth=4, weight=2, noise="gaussian", scale=1.0, seed=1)
    state = mech.init_state()
    for _ in range(mech.capacity):
        last, state, _ = mech.step(state, np.zeros(2))
    assert (state.epoch, state.step) == (1, 0)
    np.testing.assert_array_equal(state.carry, last)
    release, state, _ = mech.step(state, np.zeros(2))
    leaf = mech.leaf(1)
    expected = last + sum(mech._draw(1, b, leaf >> b) for b in range(4) if (leaf >> b) & 1)
    np.testing.assert_array_equal(release, expected)


# --------------------------------------------------------------------------- BLT factorization


def test_blt_coefficients_and_column_norm_match_dense_matrices() -> None:
    for n in (1, 2, 7, 64, 300):
        theta, w = blt_parameters(n)
        b = blt_coefficients(theta, w, n)
        B = toeplitz_lower(b)
        A = np.tril(np.ones((n, n)))
        C = np.linalg.solve(B, A)
        np.testing.assert_allclose(B @ C, A, atol=1e-12)
        np.testing.assert_allclose(C[:, 0], blt_strategy_coefficients(theta, w, n), atol=1e-12)
        assert blt_column_norm(theta, w, n) == pytest.approx(np.linalg.norm(C, axis=0).max(), rel=1e-12)
        np.testing.assert_allclose([blt_error_coefficient(theta, w, t) for t in range(1, n + 1)],
                                   (B * B).sum(axis=1), rtol=1e-12)


def test_blt_strategy_recursion_blocks_agree_with_plain_recursion() -> None:
    theta, w = blt_parameters(5000)
    c = blt_strategy_coefficients(theta, w, 5000, block=97)
    U, plain = np.zeros(theta.size), np.empty(5000)
    for t in range(5000):
        plain[t] = 1.0 - float(w @ U)
        U = theta * U + plain[t]
    np.testing.assert_allclose(c, plain, rtol=1e-10, atol=1e-12)


def test_blt_table_is_near_the_square_root_factorization() -> None:
    for p, (th, ww) in BLT_TABLE.items():
        n = (1 << p) - 1
        r = sqrt_coefficients(n)
        sqrt_loss = float(r @ r) ** 2
        ratio = blt_loss(np.array(th), np.array(ww), n) / sqrt_loss
        assert 1.0 - 1e-9 < ratio < (1.001 if p <= 10 else 1.035), (p, ratio)
    # and far below the binary tree's worst variance h * h at the same sensitivity
    th, ww = blt_parameters(100_000)
    assert blt_loss(th, ww, 100_000) < 25 < 17 * 17 / 10


def test_fit_blt_reproduces_a_table_entry() -> None:
    n = 15
    th, ww = fit_blt(n, 4, max_evaluations=2000)
    assert blt_loss(th, ww, n) == pytest.approx(blt_loss(*blt_parameters(n), n), rel=1e-4)


def test_blt_release_is_b_times_keyed_z_and_variance_matches() -> None:
    mech = BLTMechanism.gaussian(dim=N_COORD, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=40, seed=8, stream=3)
    releases = _run_zero(mech, 40)
    b = blt_coefficients(mech.theta, mech.w, 40)
    src = KeyedNoise(8, 3)
    z = [src.normal(mech.scale, (N_COORD,), epoch=0, level=0, index=t) for t in range(1, 41)]
    for t in (1, 2, 3, 17, 40):  # eta_t = sum_k b_k z_{t-k}: the noise really is B z with keyed z
        expected = sum(b[k] * z[t - 1 - k] for k in range(t))
        np.testing.assert_allclose(releases[t - 1], expected, rtol=1e-9, atol=1e-9)
    for t, release in enumerate(releases, start=1):
        _close_var(release, mech.prefix_variance(t))
    assert mech.noise_multiplier == pytest.approx(blt_column_norm(mech.theta, mech.w, 40) / gdp_mu(2.0, 1e-5))


def test_blt_epoch_rollover_freezes_noise_and_restarts_buffers() -> None:
    mech = BLTMechanism.gaussian(dim=3, sensitivity=1.0, epsilon=1.0, delta=1e-5, horizon=4, seed=2)
    state = mech.init_state()
    for _ in range(4):
        last, state, _ = mech.step(state, np.zeros(3))
    assert (state.epoch, state.step) == (1, 0) and not state.nodes.any()
    np.testing.assert_array_equal(state.carry, last)
    release, state, _ = mech.step(state, np.zeros(3))
    np.testing.assert_array_equal(release, last + KeyedNoise(2).normal(mech.scale, (3,), epoch=1, level=0, index=1))


def test_factorization_event_in_both_accountants_and_group_privacy() -> None:
    ev = FactorizationEvent(noise_multiplier=5.0, column_norm=2.0)
    assert GDPAccountant().compose(ev, count=3).mu == pytest.approx(math.sqrt(3) * 0.4)
    assert ZCDPAccountant().compose(ev).rho == pytest.approx(0.4**2 / 2)
    g1, g3 = group_guarantee(ev, 1, 1e-5), group_guarantee(ev, 3, 1e-5)
    assert g1.epsilon == pytest.approx(describe(ev, 1e-5).epsilon) and g3.epsilon > 2.9 * g1.epsilon
    assert event_from_dict(event_to_dict(ev)) == ev


# --------------------------------------------------------------------------- user-space noise


def test_user_space_noise_is_v_times_the_inner_noise() -> None:
    rng = np.random.default_rng(5)
    N, d = 3, 4
    W = rng.random((N, N))
    W /= W.sum(axis=0)
    sens = float(np.linalg.norm(W, axis=0).max())  # what the policies pass: Lx max_u ||W[:,u]||, Lx = 1
    mech = make_mechanism("user-blt-exact", dim=N * d, sensitivity=sens, epsilon=2.0, delta=1e-5, horizon=10,
                          seed=4, mixing=W, block_dim=d)
    assert isinstance(mech, UserSpaceMechanism)
    inner = make_mechanism("blt-exact", dim=N * d, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=10, seed=4)
    assert inner.event == mech.event  # calibrated to Lx = 1 on the stacked user statistics
    state, inner_state = mech.init_state(), inner.init_state()
    prefix = np.zeros(N * d)
    for _ in range(12):
        inc = rng.standard_normal(N * d)
        prefix = prefix + inc
        release, state, _ = mech.step(state, inc)
        _, inner_state, _ = inner.step(inner_state, inc)
        xi = inner.noise(inner_state).reshape(N, d)
        np.testing.assert_allclose(release, prefix + (W @ xi).reshape(-1), rtol=1e-12, atol=1e-12)
    identity = make_mechanism("user-blt-exact", dim=N * d, sensitivity=1.0, epsilon=2.0, delta=1e-5, horizon=10,
                              seed=4)
    a, b = identity.init_state(), inner.init_state()
    for _ in range(5):
        ra, a, _ = identity.step(a, np.ones(N * d))
        rb, b, _ = inner.step(b, np.ones(N * d))
        assert ra.tobytes() == rb.tobytes()


def test_user_space_sensitivity_covers_every_users_interaction() -> None:
    """One interaction of user u moves the stacked b by x (r - r') in block u only: L2 <= Lx for every u."""
    rng = np.random.default_rng(0)
    N, d = 4, 3
    for _ in range(100):
        u, x = int(rng.integers(N)), rng.standard_normal(d)
        x /= max(1.0, np.linalg.norm(x))
        diff = np.zeros((N, d))
        diff[u] = x * (1.0 - 0.0)
        assert np.linalg.norm(diff) <= 1.0 + 1e-12


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mixing": np.ones((2, 3))}, "`mixing` must be a square"),
    ({"mixing": np.eye(2), "block_dim": 5}, "`block_dim` times N must equal"),
])
def test_user_space_bad_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_mechanism("user-gaussian-exact", dim=4, sensitivity=1.0, epsilon=1.0, delta=1e-5, horizon=4, seed=0,
                       **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"theta": np.array([1.0]), "w": np.array([0.1])}, r"`theta` must be in \(0, 1\)"),
    ({"theta": np.array([0.5, 0.4]), "w": np.array([0.1])}, "must be 1-d of equal positive length"),
    ({"capacity": 0}, "`capacity` must be a positive"),
    ({"scale": -1.0}, "`scale` must be finite and non-negative"),
])
def test_blt_bad_parameters_name_the_parameter(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"dim": 2, "capacity": 4, "theta": np.array([0.5]), "w": np.array([0.2]),
                               "scale": 1.0, "seed": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BLTMechanism(**args)  # type: ignore[arg-type]


def test_smooth_bad_parameters_name_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"`weight` must be in \[1, depth\)"):
        SmoothBinaryMechanism(dim=1, depth=4, weight=4, noise="gaussian", scale=1.0, seed=0)
    with pytest.raises(ValueError, match="`weight` must be 'balanced' or 'optimal'"):
        smooth_shape(10, "odd")  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        SmoothBinaryMechanism.paper(dim=1)


def test_mean_prefix_variance_ranking_at_equal_privacy() -> None:
    """Per unit (Delta / mu)**2 over one epoch of 1023 ticks: tree > Honaker ≈ smooth > BLT."""
    n, h = 1023, 10
    tree = h * np.mean([bin(t).count("1") for t in range(1, n + 1)])
    honaker = h * np.mean([honaker_prefix_variance(t) for t in range(1, n + 1)])
    depth, k = smooth_shape(n)
    smooth = (depth - k) * k
    th, ww = blt_parameters(n)
    blt = blt_column_norm(th, ww, n) ** 2 * np.mean([blt_error_coefficient(th, ww, t) for t in range(1, n + 1)])
    assert tree > honaker and tree > smooth and min(honaker, smooth) > 2.5 * blt


def test_experiment_mechanisms_writes_every_output(tmp_path: Path) -> None:
    import json

    from privrec.cli import main

    out = tmp_path / "mech"
    rc = main(["experiment", "mechanisms", "--out", str(out), "--runs", "1", "--horizon", "200", "--jobs", "1",
               "--tune-runs", "1", "--rows", "paper,user-blt-exact+tick,user-blt-exact+tick+ridge,SS-Gaussian,DGS-Laplace",
               "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "mechanisms.json").read_text())
    assert doc["epsilons"] == [0.5, 1.0, 2.0, 5.0, 10.0] and doc["default"] == "user-blt-exact+tick+ridge"
    assert set(doc["rows"]["paper"]) == {"DP-LinUCB", "DP-CoLin"} and set(doc["rows"]["SS-Gaussian"]) == {"DP-LinUCB"}
    for cell in doc["rows"]["user-blt-exact+tick"].values():
        assert {"regret", "added_regret", "ratio_to_paper", "share_of_gain"} <= set(cell) and len(cell["regret"]) == 5
    assert all(r in (1.0, None) for r in doc["rows"]["paper"]["DP-LinUCB"]["ratio_to_paper"])  # None: paper added <= 0
    assert doc["tuning"]["seeds"] == [1000] and doc["tuning"]["chosen"]["user-blt-exact+tick"]["DP-CoLin"] in (2, 4, 10, 20)
    assert all(c["valid"] for c in doc["guarantees"]["user-blt-exact+tick"]["DP-CoLin"])
    ridge = doc["rows"]["user-blt-exact+tick+ridge"]
    for alg, cell in ridge.items():  # the ridge row reuses the tuned tick and tunes kappa on the same seeds
        assert cell["tick"] == doc["rows"]["user-blt-exact+tick"][alg]["tick"]
        assert cell["noise_ridge"] in doc["tuning"]["ridge"]["candidates"]
    assert doc["default_mechanism"]["noise_ridge"] == {a: c["noise_ridge"] for a, c in ridge.items()}
    assert not any(c["valid"] for c in doc["guarantees"]["DGS-Laplace"]["DP-LinUCB"])
    for f in ("mechanisms.md", "mechanisms.png"):
        assert (out / f).stat().st_size > 0


def test_experiment_mechanisms_refuses_overlapping_tuning_seeds(tmp_path: Path) -> None:
    from privrec.cli import main

    assert main(["experiment", "mechanisms", "--out", str(tmp_path), "--runs", "3", "--tune-seed", "2",
                 "--no-progress"]) == 2


def test_experiment_mechanisms_runs_the_ridge_row_without_its_tick_row(tmp_path: Path) -> None:
    """The `+ridge` row takes its tick from `+tick`; selecting it alone used to raise KeyError: 'DP-LinUCB'."""
    import json

    from privrec.cli import main

    out = tmp_path / "mech"
    rc = main(["experiment", "mechanisms", "--out", str(out), "--runs", "1", "--horizon", "200", "--jobs", "1",
               "--tune-runs", "1", "--rows", "paper,user-blt-exact+tick+ridge", "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "mechanisms.json").read_text())
    assert set(doc["rows"]) == {"paper", "user-blt-exact+tick+ridge"}
    for alg, cell in doc["rows"]["user-blt-exact+tick+ridge"].items():
        # the tick was tuned for the unselected `+tick` row and reused
        assert cell["tick"] == doc["tuning"]["chosen"]["user-blt-exact+tick"][alg]
