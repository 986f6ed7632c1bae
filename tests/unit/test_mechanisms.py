"""Continual-release mechanisms: exactness, noise law, keyed reuse, epochs, state round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.mechanisms import MECHANISMS, BinaryTreeMechanism, TreeState, levels_for_horizon, make_mechanism
from models.ground.noise import KeyedNoise


def _mech(name: str, *, dim: int, epsilon: float, horizon: int, seed: int = 1) -> BinaryTreeMechanism:
    return make_mechanism(name, dim=dim, sensitivity=1.0, sensitivity_l1=2.0, epsilon=epsilon, delta=1e-5,
                          horizon=horizon, seed=seed)  # type: ignore[return-value]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_noise_off_releases_exact_prefix_sums(name: str) -> None:
    rng = np.random.default_rng(0)
    mech = _mech(name, dim=7, epsilon=math.inf, horizon=5)  # capacity 7: crosses epochs
    state = mech.init_state()
    exact = np.zeros(7)
    for _ in range(40):
        inc = rng.standard_normal(7)
        exact = exact + inc
        release, state, _ = mech.step(state, inc)
        assert release.tobytes() == exact.tobytes()
    assert state.epoch == 40 // mech.capacity  # type: ignore[attr-defined]


def test_levels_for_horizon_matches_errata() -> None:
    assert [levels_for_horizon(T) for T in (10_000, 100_000, 1000, 1024, 16384)] == [14, 17, 10, 11, 15]


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_release_noise_variance_is_popcount_times_node_variance(noise: str) -> None:
    n = 20_000  # coordinates: iid samples of eta_t
    mech = BinaryTreeMechanism(dim=n, levels=5, noise=noise, scale=1.0, seed=11)  # type: ignore[arg-type]
    state = mech.init_state()
    for t in range(1, mech.capacity + 1):
        release, state, _ = mech.step(state, np.zeros(n))
        k = bin(t).count("1")
        expected = k * mech.node_variance()
        # relative std of a sample variance: sqrt((2 + excess kurtosis)/n); Laplace sum of k: excess 3/k
        rel = math.sqrt((2 + (3 / k if noise == "laplace" else 0)) / n)
        assert abs(release.var() / expected - 1) < 5 * rel, (t, release.var(), expected)
        assert abs(release.mean()) < 5 * math.sqrt(expected / n)


def test_nodes_are_reused_between_releases() -> None:
    n = 20_000
    mech = BinaryTreeMechanism(dim=n, levels=4, noise="gaussian", scale=1.0, seed=5)
    state = mech.init_state()
    eta = {}
    for t in range(1, 9):
        eta[t], state, _ = mech.step(state, np.zeros(n))
    # 6 = 110b and 7 = 111b share the level-1 and level-2 nodes; 7 and 8 = 1000b share none.
    cov67, cov78 = float(np.mean(eta[6] * eta[7])), float(np.mean(eta[7] * eta[8]))
    assert abs(cov67 - 2.0) < 5 * math.sqrt(10 / n)  # Var(XY) = 2*3 + 2^2
    assert abs(cov78) < 5 * math.sqrt(3 / n)


def test_node_noise_is_keyed_and_recomputable() -> None:
    mech = BinaryTreeMechanism(dim=3, levels=4, noise="gaussian", scale=2.0, seed=99, stream=4)
    state = mech.init_state()
    for _ in range(6):  # t = 6 = 110b: live nodes at level 1 (index 3) and level 2 (index 1)
        release, state, _ = mech.step(state, np.zeros(3))
    src = KeyedNoise(99, 4)
    expected = src.normal(2.0, (3,), epoch=0, level=1, index=3) + src.normal(2.0, (3,), epoch=0, level=2, index=1)
    np.testing.assert_array_equal(release, 0.0 + expected)


def test_every_leaf_lies_in_at_most_levels_nodes_across_epochs() -> None:
    mech = BinaryTreeMechanism(dim=1, levels=3, noise="gaussian", scale=1.0, seed=0)
    drawn: list[tuple[int, int, int]] = []
    original = mech._draw

    def spy(epoch: int, level: int, index: int) -> np.ndarray:
        drawn.append((epoch, level, index))
        return original(epoch, level, index)

    mech._draw = spy  # type: ignore[method-assign]
    state = mech.init_state()
    leaves = []
    for _ in range(30):
        _, state, _ = mech.step(state, np.zeros(1))
        leaves.append((state.epoch, state.step))
    for epoch, s in leaves:
        covering = [(lv, k) for e, lv, k in drawn if e == epoch and (k - 1) << lv < s <= k << lv]
        assert 1 <= len(covering) <= mech.levels
    assert max(e for e, _ in leaves) == 30 // mech.capacity


def test_epoch_rollover_freezes_released_noise() -> None:
    mech = BinaryTreeMechanism(dim=4, levels=2, noise="laplace", scale=1.0, seed=3)  # capacity 3
    state = mech.init_state()
    for _ in range(3):
        last, state, _ = mech.step(state, np.zeros(4))
    eta_epoch0 = mech.noise(state)
    np.testing.assert_array_equal(last, eta_epoch0)
    release, state, _ = mech.step(state, np.zeros(4))
    assert state.epoch == 1 and state.step == 1
    np.testing.assert_array_equal(state.carry, eta_epoch0)
    np.testing.assert_array_equal(release, eta_epoch0 + KeyedNoise(3).laplace(1.0, (4,), epoch=1, level=0, index=1))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_state_round_trips_bit_exactly_mid_stream(name: str) -> None:
    rng = np.random.default_rng(1)
    incs = rng.standard_normal((25, 5))
    mech = _mech(name, dim=5, epsilon=2.0, horizon=6)
    a = mech.init_state()
    for x in incs[:11]:
        _, a, _ = mech.step(a, x)
    mapping = a.to_mapping()
    b = TreeState.from_mapping({k.encode(): v for k, v in mapping.items()})  # as redis-py returns it
    assert b.to_mapping() == mapping
    for x in incs[11:]:
        ra, a, _ = mech.step(a, x)
        rb, b, _ = mech.step(b, x)
        assert ra.tobytes() == rb.tobytes()


def test_step_to_equals_step_with_the_same_prefix() -> None:
    mech = _mech("gaussian-zcdp", dim=3, epsilon=1.0, horizon=8)
    s1 = s2 = mech.init_state()
    prefix = np.zeros(3)
    for t in range(9):
        inc = np.full(3, float(t))
        prefix = prefix + inc
        r1, s1, _ = mech.step(s1, inc)
        r2, s2, _ = mech.step_to(s2, prefix)
        assert r1.tobytes() == r2.tobytes()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": -1.0}, "`epsilon` must be positive"),
        ({"epsilon": 0.0}, "`epsilon` must be positive"),
        ({"delta": 0.0}, r"`delta` must be in \(0, 1\)"),
        ({"delta": 1.5}, r"`delta` must be in \(0, 1\)"),
        ({"sensitivity": -1.0}, "`sensitivity` must be finite and non-negative"),
        ({"horizon": 0}, "`horizon` must be a positive"),
        ({"dim": 0}, "`dim` must be a positive integer"),
    ],
)
def test_bad_parameters_name_the_parameter(kwargs: dict[str, float], match: str) -> None:
    args = {"dim": 3, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5, "horizon": 10, "seed": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_mechanism("gaussian-zcdp", **args)  # type: ignore[arg-type]


def test_unknown_mechanism_and_missing_seed_are_refused() -> None:
    with pytest.raises(ValueError, match="`mechanism` must be one of"):
        make_mechanism("nope", dim=1, sensitivity=1, epsilon=1, delta=1e-5, horizon=4, seed=0)
    with pytest.raises(ValueError, match="`seed` must be an integer"):
        BinaryTreeMechanism(dim=1, levels=2, noise="gaussian", scale=1.0, seed=None)
    mech = _mech("paper", dim=3, epsilon=1.0, horizon=4)
    with pytest.raises(ValueError, match=r"`increment` must have shape \(3,\)"):
        mech.step(mech.init_state(), np.zeros(4))
